/**
 * Every query on `payments` (docs/sources seed 004): one row per real payment, keyed by (provider, trade_no),
 * so a payment is applied to an order at most once however often its notification arrives.
 * Callers lock the order row first (orders-store `lockOrder`), then the payment row.
 */
import type { Queryable } from './pool.js';

/** REFUNDING / REFUNDED: a surplus payment's refund (migration 4, core/refunds.ts). */
export type PaymentState = 'RECEIVED' | 'APPLIED' | 'REFUND_PENDING' | 'REFUNDING' | 'REFUNDED';

/** Why a received payment cannot be kept and must be refunded. */
export type RefundReason = 'AMOUNT_MISMATCH' | 'ORDER_CLOSED' | 'PAID_BY_OTHER_TRADE' | 'ORDER_NOT_PAYABLE';

export interface PaymentRow {
  provider: string;
  tradeNo: string;
  orderId: string;
  activityId: string;
  reservationId: string;
  /** Decimal string (numeric(16,2)); compare with decimal.js, never as a float. */
  amount: string;
  state: PaymentState;
  refundReason: RefundReason | null;
  traceId: string;
  receivedAt: Date;
}

const COLUMNS = `provider, trade_no AS "tradeNo", order_id AS "orderId", activity_id AS "activityId",
  reservation_id AS "reservationId", amount::text AS amount, state, refund_reason AS "refundReason",
  trace_id AS "traceId", received_at AS "receivedAt"`;

export interface NewPayment {
  provider: string;
  tradeNo: string;
  orderId: string;
  activityId: string;
  reservationId: string;
  amount: string;
  traceId: string;
  notification: Record<string, unknown>;
}

/**
 * Inserts the payment as RECEIVED; returns false when (provider, trade_no) exists already. A
 * concurrent insert of the same trade number waits here for the other transaction's outcome.
 */
export async function insertPayment(db: Queryable, p: NewPayment): Promise<boolean> {
  const res = await db.query(
    `INSERT INTO payments (provider, trade_no, order_id, activity_id, reservation_id, amount, state, trace_id,
                           notification)
     VALUES ($1, $2, $3, $4, $5, $6::numeric, 'RECEIVED', $7, $8::jsonb)
     ON CONFLICT (provider, trade_no) DO NOTHING`,
    [
      p.provider,
      p.tradeNo,
      p.orderId,
      p.activityId,
      p.reservationId,
      p.amount,
      p.traceId,
      JSON.stringify(p.notification),
    ],
  );
  return res.rowCount === 1;
}

export async function lockPayment(
  db: Queryable,
  provider: string,
  tradeNo: string,
): Promise<PaymentRow | undefined> {
  const res = await db.query<PaymentRow>(
    `SELECT ${COLUMNS} FROM payments WHERE provider = $1 AND trade_no = $2 FOR UPDATE`,
    [provider, tradeNo],
  );
  return res.rows[0];
}

/** RECEIVED -> APPLIED or REFUND_PENDING, conditional on RECEIVED. Returns whether it changed. */
export async function finishPayment(
  db: Queryable,
  provider: string,
  tradeNo: string,
  outcome: { state: 'APPLIED' } | { state: 'REFUND_PENDING'; reason: RefundReason },
): Promise<boolean> {
  const res = await db.query(
    `UPDATE payments SET state = $3, refund_reason = $4, updated_at = now()
      WHERE provider = $1 AND trade_no = $2 AND state = 'RECEIVED'`,
    [provider, tradeNo, outcome.state, outcome.state === 'REFUND_PENDING' ? outcome.reason : null],
  );
  return res.rowCount === 1;
}

export async function findPayment(
  db: Queryable,
  provider: string,
  tradeNo: string,
): Promise<PaymentRow | undefined> {
  const res = await db.query<PaymentRow>(
    `SELECT ${COLUMNS} FROM payments WHERE provider = $1 AND trade_no = $2`,
    [provider, tradeNo],
  );
  return res.rows[0];
}

export async function paymentsForOrder(db: Queryable, orderId: string): Promise<PaymentRow[]> {
  const res = await db.query<PaymentRow>(
    `SELECT ${COLUMNS} FROM payments WHERE order_id = $1 ORDER BY received_at, trade_no`,
    [orderId],
  );
  return res.rows;
}

export interface PaymentFigures {
  /** Orders with an APPLIED payment. */
  appliedOrders: number;
  refundPending: number;
  /** Orders whose status is PAID/REFUNDING/REFUNDED without an APPLIED payment, or the reverse. */
  paidWithoutPayment: number;
  paymentWithoutPaid: number;
}

/** Cross-checks orders and payments of an activity (reconciliation). */
export async function paymentFigures(db: Queryable, activityId: string): Promise<PaymentFigures> {
  const res = await db.query<{
    applied: string;
    pending: string;
    paidWithout: string;
    paymentWithout: string;
  }>(
    `SELECT
       (SELECT count(*) FROM payments WHERE activity_id = $1 AND state = 'APPLIED')::text AS applied,
       (SELECT count(*) FROM payments WHERE activity_id = $1 AND state = 'REFUND_PENDING')::text AS pending,
       (SELECT count(*) FROM orders o WHERE o.activity_id = $1 AND o.status IN ('PAID', 'REFUNDING', 'REFUNDED')
           AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.order_id = o.id AND p.state = 'APPLIED'))::text
         AS "paidWithout",
       (SELECT count(*) FROM payments p JOIN orders o ON o.id = p.order_id
         WHERE p.activity_id = $1 AND p.state = 'APPLIED'
           AND o.status NOT IN ('PAID', 'REFUNDING', 'REFUNDED'))::text AS "paymentWithout"`,
    [activityId],
  );
  const r = res.rows[0]!;
  return {
    appliedOrders: Number(r.applied),
    refundPending: Number(r.pending),
    paidWithoutPayment: Number(r.paidWithout),
    paymentWithoutPaid: Number(r.paymentWithout),
  };
}

/** Surplus payments waiting for a refund row (oldest first); read without locks. */
export async function findRefundPendingPayments(
  db: Queryable,
  activityId: string | undefined,
  limit: number,
): Promise<{ provider: string; tradeNo: string; orderId: string }[]> {
  const res = await db.query<{ provider: string; tradeNo: string; orderId: string }>(
    `SELECT provider, trade_no AS "tradeNo", order_id AS "orderId" FROM payments
      WHERE state = 'REFUND_PENDING' AND ($1::text IS NULL OR activity_id = $1)
      ORDER BY received_at LIMIT $2`,
    [activityId ?? null, limit],
  );
  return res.rows;
}

/** A surplus payment's refund moves: REFUND_PENDING -> REFUNDING -> REFUNDED (conditional). */
export async function movePaymentRefund(
  db: Queryable,
  provider: string,
  tradeNo: string,
  from: 'REFUND_PENDING' | 'REFUNDING',
  to: 'REFUNDING' | 'REFUNDED',
): Promise<boolean> {
  const res = await db.query(
    `UPDATE payments SET state = $4, updated_at = now() WHERE provider = $1 AND trade_no = $2 AND state = $3`,
    [provider, tradeNo, from, to],
  );
  return res.rowCount === 1;
}

/**
 * Payments of an activity whose money must still go back (the operator's Settling phase): waiting
 * for a refund or with a refund in flight.
 */
export async function countRefundPending(db: Queryable, activityId: string): Promise<number> {
  const res = await db.query<{ n: string }>(
    `SELECT count(*)::text AS n FROM payments WHERE activity_id = $1 AND state IN ('REFUND_PENDING', 'REFUNDING')`,
    [activityId],
  );
  return Number(res.rows[0]!.n);
}
