/**
 * Every query on `refunds` (migration 4), and the payment-state moves a refund makes on
 * `payments` rows it owns. One row per refunded payment (provider, trade_no); `refund_id` is the
 * refund request id the provider deduplicates by, committed before the provider is ever called.
 * Callers lock the order row first (orders-store `lockOrder`), then payment and refund rows.
 */
import { randomBytes } from 'node:crypto';
import type { Queryable } from './pool.js';

export type RefundState = 'PENDING' | 'SUCCEEDED' | 'FAILED';
/** ORDER: refund of a paid order; PAYMENT: refund of a surplus (REFUND_PENDING) payment. */
export type RefundKind = 'ORDER' | 'PAYMENT';

export interface RefundRow {
  refundId: string;
  provider: string;
  tradeNo: string;
  orderId: string;
  activityId: string;
  /** Decimal string with two decimals. */
  amount: string;
  kind: RefundKind;
  reason: string;
  requestedBy: string;
  state: RefundState;
  attempts: number;
  nextAttemptAt: Date;
  providerStatus: string | null;
  providerRefundNo: string | null;
  lastError: string | null;
  traceId: string;
  createdAt: Date;
  completedAt: Date | null;
}

const COLUMNS = `refund_id AS "refundId", provider, trade_no AS "tradeNo", order_id AS "orderId",
  activity_id AS "activityId", amount::text AS amount, kind, reason, requested_by AS "requestedBy", state,
  attempts, next_attempt_at AS "nextAttemptAt", provider_status AS "providerStatus",
  provider_refund_no AS "providerRefundNo", last_error AS "lastError", trace_id AS "traceId",
  created_at AS "createdAt", completed_at AS "completedAt"`;

/** A new refund request id: `rf-` + 128 random bits (hex). */
export function newRefundId(): string {
  return `rf-${randomBytes(16).toString('hex')}`;
}

export interface NewRefund {
  provider: string;
  tradeNo: string;
  orderId: string;
  activityId: string;
  amount: string;
  kind: RefundKind;
  reason: string;
  requestedBy: string;
  traceId: string;
}

/**
 * Inserts a PENDING refund with a fresh refund id; returns the row, or undefined when the payment
 * has a refund already (the unique (provider, trade_no) key decides).
 */
export async function insertRefund(db: Queryable, r: NewRefund): Promise<RefundRow | undefined> {
  const res = await db.query<RefundRow>(
    `INSERT INTO refunds (refund_id, provider, trade_no, order_id, activity_id, amount, kind, reason,
                          requested_by, state, trace_id)
     VALUES ($1, $2, $3, $4, $5, $6::numeric, $7, $8, $9, 'PENDING', $10)
     ON CONFLICT (provider, trade_no) DO NOTHING
     RETURNING ${COLUMNS}`,
    [
      newRefundId(),
      r.provider,
      r.tradeNo,
      r.orderId,
      r.activityId,
      r.amount,
      r.kind,
      r.reason,
      r.requestedBy,
      r.traceId,
    ],
  );
  return res.rows[0];
}

export async function findRefund(db: Queryable, refundId: string): Promise<RefundRow | undefined> {
  const res = await db.query<RefundRow>(`SELECT ${COLUMNS} FROM refunds WHERE refund_id = $1`, [refundId]);
  return res.rows[0];
}

export async function lockRefund(db: Queryable, refundId: string): Promise<RefundRow | undefined> {
  const res = await db.query<RefundRow>(`SELECT ${COLUMNS} FROM refunds WHERE refund_id = $1 FOR UPDATE`, [
    refundId,
  ]);
  return res.rows[0];
}

export async function refundsForOrder(db: Queryable, orderId: string): Promise<RefundRow[]> {
  const res = await db.query<RefundRow>(
    `SELECT ${COLUMNS} FROM refunds WHERE order_id = $1 ORDER BY created_at, refund_id`,
    [orderId],
  );
  return res.rows;
}

export async function listRefunds(
  db: Queryable,
  filter: { activityId?: string | undefined; state?: RefundState | undefined; limit: number },
): Promise<RefundRow[]> {
  const res = await db.query<RefundRow>(
    `SELECT ${COLUMNS} FROM refunds
      WHERE ($1::text IS NULL OR activity_id = $1) AND ($2::text IS NULL OR state = $2)
      ORDER BY created_at, refund_id LIMIT $3`,
    [filter.activityId ?? null, filter.state ?? null, filter.limit],
  );
  return res.rows;
}

/**
 * Claims up to `limit` due PENDING refunds and, in the same statement, schedules their next
 * attempt (`retryAfterSeconds` per claimed row, computed by the caller from the attempt count).
 * The claim is the lease: another worker sees the row only once that instant has passed, so a
 * call in flight is never doubled, and a worker killed mid-call is retried, with the same id,
 * at the scheduled instant. SKIP LOCKED keeps concurrent claimers apart.
 */
export async function claimDueRefunds(
  db: Queryable,
  activityId: string | undefined,
  limit: number,
  backoff: { baseSeconds: number; maxSeconds: number; minSeconds: number },
): Promise<RefundRow[]> {
  const res = await db.query<RefundRow>(
    `WITH due AS (
       SELECT refund_id AS due_id FROM refunds
        WHERE state = 'PENDING' AND next_attempt_at <= now() AND ($1::text IS NULL OR activity_id = $1)
        ORDER BY next_attempt_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED)
     UPDATE refunds SET attempts = attempts + 1, updated_at = now(),
            next_attempt_at = now() + make_interval(secs => greatest($5::float8,
              least($4::float8, $3::float8 * power(2, least(attempts, 30)))))
       FROM due WHERE refund_id = due.due_id AND state = 'PENDING'
       RETURNING ${COLUMNS}`,
    [activityId ?? null, limit, backoff.baseSeconds, backoff.maxSeconds, backoff.minSeconds],
  );
  return res.rows;
}

/** Records a provider answer that is not final (processing, transient error); the row stays PENDING. */
export async function noteRefundAttempt(
  db: Queryable,
  refundId: string,
  providerStatus: string | null,
  error: string | null,
): Promise<void> {
  await db.query(
    `UPDATE refunds SET provider_status = coalesce($2, provider_status), last_error = $3, updated_at = now()
      WHERE refund_id = $1 AND state = 'PENDING'`,
    [refundId, providerStatus, error],
  );
}

/**
 * PENDING -> SUCCEEDED or FAILED, conditional on PENDING; FAILED -> SUCCEEDED too (the provider
 * reported the money returned after refusing first). Returns whether it changed.
 */
export async function finishRefund(
  db: Queryable,
  refundId: string,
  outcome:
    | { state: 'SUCCEEDED'; providerStatus: string; providerRefundNo: string | null }
    | { state: 'FAILED'; providerStatus: string | null; error: string },
): Promise<boolean> {
  const res = await db.query(
    `UPDATE refunds SET state = $2, provider_status = coalesce($3, provider_status),
            provider_refund_no = coalesce($4, provider_refund_no), last_error = $5,
            completed_at = CASE WHEN $2 = 'SUCCEEDED' THEN now() ELSE completed_at END, updated_at = now()
      WHERE refund_id = $1 AND (state = 'PENDING' OR ($2 = 'SUCCEEDED' AND state = 'FAILED'))`,
    [
      refundId,
      outcome.state,
      outcome.providerStatus,
      outcome.state === 'SUCCEEDED' ? outcome.providerRefundNo : null,
      outcome.state === 'FAILED' ? outcome.error : null,
    ],
  );
  return res.rowCount === 1;
}

/** FAILED -> PENDING (an operator retries after fixing the cause); the refund id stays the same. */
export async function reopenRefund(db: Queryable, refundId: string): Promise<boolean> {
  const res = await db.query(
    `UPDATE refunds SET state = 'PENDING', next_attempt_at = now(), last_error = NULL, updated_at = now()
      WHERE refund_id = $1 AND state = 'FAILED'`,
    [refundId],
  );
  return res.rowCount === 1;
}

export interface RefundAgeRow {
  activityId: string;
  /** Seconds since the oldest money still owed back was recorded (0 when none). */
  oldestAgeSeconds: number;
  pending: number;
}

/**
 * Per activity: the age of the oldest refund not yet completed (PENDING refunds, and surplus
 * payments still waiting for their refund row). FAILED refunds are counted by failedRefunds.
 */
export async function refundBacklog(db: Queryable, activityId: string | undefined): Promise<RefundAgeRow[]> {
  const res = await db.query<{ activityId: string; age: string; n: string }>(
    `SELECT activity_id AS "activityId", extract(epoch FROM now() - min(since))::text AS age, count(*)::text AS n
       FROM (SELECT activity_id, created_at AS since FROM refunds WHERE state = 'PENDING'
             UNION ALL
             SELECT activity_id, received_at FROM payments WHERE state = 'REFUND_PENDING') x
      WHERE ($1::text IS NULL OR activity_id = $1)
      GROUP BY activity_id`,
    [activityId ?? null],
  );
  return res.rows.map((r) => ({
    activityId: r.activityId,
    oldestAgeSeconds: Math.max(0, Number(r.age)),
    pending: Number(r.n),
  }));
}

/**
 * Per activity: refunds the provider refused for good (FAILED) and nobody has sent again (`refund
 * retry` makes them PENDING): money still owed back until a human resolves each. Activities with
 * none are absent.
 */
export async function failedRefunds(
  db: Queryable,
  activityId: string | undefined,
): Promise<{ activityId: string; failed: number }[]> {
  const res = await db.query<{ activityId: string; n: string }>(
    `SELECT activity_id AS "activityId", count(*)::text AS n
       FROM refunds
      WHERE state = 'FAILED' AND ($1::text IS NULL OR activity_id = $1)
      GROUP BY activity_id`,
    [activityId ?? null],
  );
  return res.rows.map((r) => ({ activityId: r.activityId, failed: Number(r.n) }));
}

/** Refunds of an activity by state (status figures, reconciliation). */
export async function refundCounts(db: Queryable, activityId: string): Promise<Record<RefundState, number>> {
  const res = await db.query<{ state: RefundState; n: string }>(
    `SELECT state, count(*)::text AS n FROM refunds WHERE activity_id = $1 GROUP BY state`,
    [activityId],
  );
  const out: Record<RefundState, number> = { PENDING: 0, SUCCEEDED: 0, FAILED: 0 };
  for (const r of res.rows) out[r.state] = Number(r.n);
  return out;
}

export interface RefundConsistency {
  /** Orders REFUNDED without a SUCCEEDED order refund, or REFUNDING without any order refund. */
  orderStateWithoutRefund: number;
  /** Payments REFUNDED without a SUCCEEDED refund, or REFUNDING without any refund. */
  paymentStateWithoutRefund: number;
  /** SUCCEEDED refunds whose order or payment is not REFUNDED (a completion half-written). */
  refundWithoutState: number;
}

/** Cross-checks refunds against order and payment states (reconciliation). */
export async function refundConsistency(db: Queryable, activityId: string): Promise<RefundConsistency> {
  const res = await db.query<{ o: string; p: string; r: string }>(
    `SELECT
       (SELECT count(*) FROM orders o WHERE o.activity_id = $1 AND (
           (o.status = 'REFUNDED' AND NOT EXISTS (SELECT 1 FROM refunds f
              WHERE f.order_id = o.id AND f.kind = 'ORDER' AND f.state = 'SUCCEEDED'))
        OR (o.status = 'REFUNDING' AND NOT EXISTS (SELECT 1 FROM refunds f
              WHERE f.order_id = o.id AND f.kind = 'ORDER'))))::text AS o,
       (SELECT count(*) FROM payments p WHERE p.activity_id = $1 AND (
           (p.state = 'REFUNDED' AND NOT EXISTS (SELECT 1 FROM refunds f
              WHERE f.provider = p.provider AND f.trade_no = p.trade_no AND f.state = 'SUCCEEDED'))
        OR (p.state = 'REFUNDING' AND NOT EXISTS (SELECT 1 FROM refunds f
              WHERE f.provider = p.provider AND f.trade_no = p.trade_no))))::text AS p,
       (SELECT count(*) FROM refunds f
          LEFT JOIN orders o ON o.id = f.order_id
          LEFT JOIN payments p ON p.provider = f.provider AND p.trade_no = f.trade_no
         WHERE f.activity_id = $1 AND f.state = 'SUCCEEDED'
           AND ((f.kind = 'ORDER' AND o.status IS DISTINCT FROM 'REFUNDED')
             OR (f.kind = 'PAYMENT' AND p.state IS DISTINCT FROM 'REFUNDED')))::text AS r`,
    [activityId],
  );
  const r = res.rows[0]!;
  return {
    orderStateWithoutRefund: Number(r.o),
    paymentStateWithoutRefund: Number(r.p),
    refundWithoutState: Number(r.r),
  };
}
