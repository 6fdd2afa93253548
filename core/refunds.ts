/**
 * Refunds (docs/after-sale.md "Refunds"), shared by the api (buyer request, refund
 * notifications), the refund worker (jobs) and the operator's `refund` command, which may not
 * import each other.
 *
 * Two kinds, one mechanism:
 * - ORDER: a buyer or an operator asks for the refund of a PAID order. One transaction locks the
 *   order, moves it PAID -> REFUNDING and inserts the refund row with its refund request id.
 * - PAYMENT: a surplus payment (REFUND_PENDING: duplicate trade, wrong amount, paid after close)
 *   is taken by the worker: REFUND_PENDING -> REFUNDING and the refund row, in one transaction.
 * Then the worker calls the provider with the committed refund id (retried with the same id until
 * the provider gives a final answer), and `completeRefund` moves order (REFUNDING -> REFUNDED) or
 * payment (REFUNDING -> REFUNDED) and the refund row (SUCCEEDED) in one transaction. A signed
 * refund notification from the provider completes it the same way; whichever comes second is a
 * no-op. A refund returns money, never stock: the units stay sold (PAID_STATUSES).
 *
 * Lock order everywhere: the order row, then payment and refund rows (as payments do).
 */
import { Decimal } from 'decimal.js';
import { appendJournal } from './db/journal-store.js';
import { findByReservationId, findOrderById, lockOrder, transitionOrder } from './db/orders-store.js';
import type { LifecycleOrderRow } from './db/orders-store.js';
import { lockPayment, movePaymentRefund, paymentsForOrder } from './db/payments-store.js';
import { inTransaction } from './db/pool.js';
import type { Pool, PoolClient } from './db/pool.js';
import { findRefund, finishRefund, insertRefund, lockRefund, refundsForOrder } from './db/refunds-store.js';
import type { RefundRow } from './db/refunds-store.js';
import { FlashSaleError } from './errors.js';
import type { Logger } from './logger.js';
import type { Metrics } from './metrics.js';
import type { RefundNotice } from './payment-provider.js';

export interface RefundDeps {
  pool: Pool;
  logger: Logger;
  metrics?: Metrics | undefined;
}

export interface OrderRefundInput {
  /** Exactly one of orderId / reservationId. */
  orderId?: string;
  reservationId?: string;
  /** The buyer asking (their JWT subject): someone else's order is UNKNOWN_RESERVATION. */
  buyerId?: string;
  /** Limits the request to one activity (the api's activity in the path). */
  activityId?: string;
  reason: string;
  /** `buyer:<id>` or `operator:<name>`. */
  requestedBy: string;
  traceId: string;
}

export interface OrderRefundResult {
  outcome: 'requested' | 'already-requested';
  order: LifecycleOrderRow;
  refund: RefundRow;
}

async function findOrderForRequest(c: PoolClient, input: OrderRefundInput): Promise<LifecycleOrderRow> {
  const unknown = (): FlashSaleError =>
    input.buyerId
      ? new FlashSaleError('UNKNOWN_RESERVATION', 'no such order of yours')
      : new FlashSaleError('UNKNOWN_ORDER', 'no such order');
  let orderId = input.orderId;
  if (!orderId && input.reservationId) {
    orderId = (await findByReservationId(c, input.reservationId))?.id;
  }
  if (!orderId || !/^[1-9]\d{0,18}$/.test(orderId)) throw unknown();
  const order = await lockOrder(c, orderId);
  if (!order) throw unknown();
  if (input.buyerId !== undefined && order.userId !== input.buyerId) throw unknown();
  if (input.activityId !== undefined && order.activityId !== input.activityId) throw unknown();
  return order;
}

/**
 * Requests the refund of a PAID order: PAID -> REFUNDING and a PENDING refund of its applied
 * payment, in one transaction. A repeated request while REFUNDING answers the same refund.
 * Errors: NOT_PAID (UNPAID or CLOSED), ALREADY_REFUNDED, UNKNOWN_RESERVATION / UNKNOWN_ORDER.
 */
export async function requestOrderRefund(
  deps: RefundDeps,
  input: OrderRefundInput,
): Promise<OrderRefundResult> {
  const result = await inTransaction(deps.pool, async (c): Promise<OrderRefundResult> => {
    const order = await findOrderForRequest(c, input);
    if (order.status === 'REFUNDED') throw new FlashSaleError('ALREADY_REFUNDED');
    if (order.status === 'REFUNDING') {
      const existing = (await refundsForOrder(c, order.id)).find((r) => r.kind === 'ORDER');
      if (!existing) throw new Error(`order ${order.id} is REFUNDING without an order refund`);
      return { outcome: 'already-requested', order, refund: existing };
    }
    if (order.status !== 'PAID') {
      throw new FlashSaleError('NOT_PAID', `the order is ${order.status}; only a PAID order can be refunded`);
    }
    const applied = (await paymentsForOrder(c, order.id)).find((p) => p.state === 'APPLIED');
    // Impossible while payments set PAID (reconciliation's paid-without-payment check says so).
    if (!applied) throw new Error(`order ${order.id} is PAID without an applied payment`);
    const t = await transitionOrder(c, order.id, 'START_REFUND');
    if (!t.applied) throw new Error(`order ${order.id} changed under its lock`);
    const refund = await insertRefund(c, {
      provider: applied.provider,
      tradeNo: applied.tradeNo,
      orderId: order.id,
      activityId: order.activityId,
      amount: applied.amount,
      kind: 'ORDER',
      reason: input.reason,
      requestedBy: input.requestedBy,
      traceId: input.traceId,
    });
    if (!refund) throw new Error(`payment ${applied.provider}/${applied.tradeNo} has a refund already`);
    await appendJournal(c, [
      {
        activityId: order.activityId,
        reservationId: order.reservationId,
        orderId: order.id,
        event: 'ORDER_REFUNDING',
        fromStatus: 'PAID',
        toStatus: 'REFUNDING',
        traceId: input.traceId,
        detail: { refundId: refund.refundId, reason: input.reason, requestedBy: input.requestedBy },
      },
    ]);
    return { outcome: 'requested', order: t.order, refund };
  });
  if (result.outcome === 'requested') {
    deps.metrics?.refunds.inc({ activity: result.order.activityId, outcome: 'requested' });
    deps.metrics?.orders.inc({ activity: result.order.activityId, status: 'REFUNDING' });
    deps.logger.info(
      {
        orderId: result.order.id,
        refundId: result.refund.refundId,
        requestedBy: input.requestedBy,
        traceId: input.traceId,
      },
      'order refund requested',
    );
  }
  return result;
}

/**
 * Takes a surplus payment for refund: REFUND_PENDING -> REFUNDING and its PENDING refund row,
 * in one transaction (order row locked first). Returns undefined when someone else took it.
 */
export async function enqueuePaymentRefund(
  deps: RefundDeps,
  payment: { provider: string; tradeNo: string; orderId: string },
): Promise<RefundRow | undefined> {
  const refund = await inTransaction(deps.pool, async (c) => {
    const order = await lockOrder(c, payment.orderId);
    const p = await lockPayment(c, payment.provider, payment.tradeNo);
    if (!order || !p || p.state !== 'REFUND_PENDING') return undefined;
    await movePaymentRefund(c, p.provider, p.tradeNo, 'REFUND_PENDING', 'REFUNDING');
    const row = await insertRefund(c, {
      provider: p.provider,
      tradeNo: p.tradeNo,
      orderId: p.orderId,
      activityId: p.activityId,
      amount: p.amount,
      kind: 'PAYMENT',
      reason: p.refundReason ?? 'ORDER_NOT_PAYABLE',
      requestedBy: 'system',
      traceId: p.traceId,
    });
    if (!row) throw new Error(`payment ${p.provider}/${p.tradeNo} has a refund already`);
    await appendJournal(c, [
      {
        activityId: p.activityId,
        reservationId: p.reservationId,
        orderId: p.orderId,
        event: 'PAYMENT_REFUNDING',
        fromStatus: order.status,
        toStatus: order.status,
        traceId: p.traceId,
        detail: { refundId: row.refundId, tradeNo: p.tradeNo, reason: row.reason, amount: p.amount },
      },
    ]);
    return row;
  });
  if (refund) {
    deps.metrics?.surplusPayments.inc({ activity: refund.activityId, reason: refund.reason });
    deps.metrics?.refunds.inc({ activity: refund.activityId, outcome: 'requested' });
  }
  return refund;
}

export type CompleteOutcome = 'REFUNDED' | 'ALREADY_REFUNDED';

/**
 * Records that the provider returned the money: refund SUCCEEDED and order (ORDER) or payment
 * (PAYMENT) REFUNDING -> REFUNDED, in one transaction; idempotent. A refund marked FAILED that
 * the provider later reports as done is completed too: the money did move.
 */
export async function completeRefund(
  deps: RefundDeps,
  refundId: string,
  answer: { providerStatus: string; providerRefundNo: string | null },
  traceId: string,
): Promise<{ outcome: CompleteOutcome; refund: RefundRow }> {
  const r = await inTransaction(deps.pool, async (c) => {
    const seen = await findRefund(c, refundId);
    if (!seen) throw new FlashSaleError('UNKNOWN_REFUND');
    const order = await lockOrder(c, seen.orderId);
    const refund = await lockRefund(c, refundId);
    if (!order || !refund) throw new FlashSaleError('UNKNOWN_REFUND');
    if (refund.state === 'SUCCEEDED') return { outcome: 'ALREADY_REFUNDED' as const, refund };
    await finishRefund(c, refundId, { state: 'SUCCEEDED', ...answer });
    let event: string;
    let from: string = order.status;
    let to: string = order.status;
    if (refund.kind === 'ORDER') {
      const t = await transitionOrder(c, order.id, 'FINISH_REFUND');
      if (!t.applied)
        throw new Error(`order ${order.id} is ${order.status}, not REFUNDING, under its refund`);
      event = 'ORDER_REFUNDED';
      from = 'REFUNDING';
      to = 'REFUNDED';
    } else {
      await movePaymentRefund(c, refund.provider, refund.tradeNo, 'REFUNDING', 'REFUNDED');
      event = 'PAYMENT_REFUNDED';
    }
    await appendJournal(c, [
      {
        activityId: refund.activityId,
        reservationId: order.reservationId,
        orderId: order.id,
        event,
        fromStatus: from,
        toStatus: to,
        traceId,
        detail: { refundId, tradeNo: refund.tradeNo, amount: refund.amount, ...answer },
      },
    ]);
    return { outcome: 'REFUNDED' as const, refund: { ...refund, state: 'SUCCEEDED' as const } };
  });
  if (r.outcome === 'REFUNDED') {
    deps.metrics?.refunds.inc({ activity: r.refund.activityId, outcome: 'succeeded' });
    if (r.refund.kind === 'ORDER')
      deps.metrics?.orders.inc({ activity: r.refund.activityId, status: 'REFUNDED' });
    deps.logger.info(
      { refundId, orderId: r.refund.orderId, kind: r.refund.kind, traceId },
      'refund completed',
    );
  }
  return r;
}

/**
 * The provider refused the refund for good: the refund is FAILED (alerted; `refund retry` after a
 * human fixed the cause sends the same id again). The order stays REFUNDING, the payment
 * REFUNDING: money is still owed. Returns false when the refund was not PENDING.
 */
export async function failRefund(
  deps: RefundDeps,
  refundId: string,
  answer: { providerStatus: string | null; error: string },
  traceId: string,
): Promise<boolean> {
  const r = await inTransaction(deps.pool, async (c) => {
    const refund = await findRefund(c, refundId);
    if (!refund) throw new FlashSaleError('UNKNOWN_REFUND');
    const order = await lockOrder(c, refund.orderId);
    const locked = await lockRefund(c, refundId);
    if (!order || !locked || locked.state !== 'PENDING') return undefined;
    await finishRefund(c, refundId, { state: 'FAILED', ...answer });
    await appendJournal(c, [
      {
        activityId: refund.activityId,
        reservationId: order.reservationId,
        orderId: order.id,
        event: 'REFUND_FAILED',
        fromStatus: order.status,
        toStatus: order.status,
        traceId,
        detail: { refundId, tradeNo: refund.tradeNo, ...answer },
      },
    ]);
    return refund;
  });
  if (!r) return false;
  deps.metrics?.refunds.inc({ activity: r.activityId, outcome: 'failed' });
  deps.logger.error(
    { refundId, orderId: r.orderId, tradeNo: r.tradeNo, error: answer.error, traceId },
    'REFUND FAILED: the provider refused the refund; money is still owed (see docs/runbooks/FlashSaleRefundFailed.md)',
  );
  return true;
}

/**
 * Applies a verified refund notification: it must match the refund recorded under its id
 * (provider, trade, order, amount; else REFUND_CONFLICT, nothing written); success completes the
 * refund, failure fails it (unless it already succeeded), anything else is IGNORED.
 */
export async function applyRefundNotification(
  deps: RefundDeps,
  provider: string,
  notice: RefundNotice,
  traceId: string,
): Promise<string> {
  const refund = await findRefund(deps.pool, notice.refundId);
  if (!refund) throw new FlashSaleError('UNKNOWN_REFUND', `no refund ${notice.refundId}`);
  if (
    refund.provider !== provider ||
    refund.tradeNo !== notice.tradeNo ||
    refund.orderId !== notice.orderId ||
    !new Decimal(refund.amount).eq(notice.amount)
  ) {
    throw new FlashSaleError(
      'REFUND_CONFLICT',
      `refund ${notice.refundId} is recorded for another trade or amount`,
    );
  }
  if (notice.status === 'other') return 'IGNORED';
  if (notice.status === 'success') {
    const r = await completeRefund(deps, notice.refundId, notice, traceId);
    return r.outcome;
  }
  if (refund.state === 'SUCCEEDED') {
    throw new FlashSaleError('REFUND_CONFLICT', `refund ${notice.refundId} is recorded as succeeded`);
  }
  await failRefund(
    deps,
    notice.refundId,
    { providerStatus: notice.providerStatus, error: 'refund notification: failed' },
    traceId,
  );
  return 'REFUND_FAILED';
}

/** The order as a buyer or the CLI shows it after a refund request. */
export async function orderWithRefunds(
  pool: Pool,
  orderId: string,
): Promise<{ order: LifecycleOrderRow | undefined; refunds: RefundRow[] }> {
  return { order: await findOrderById(pool, orderId), refunds: await refundsForOrder(pool, orderId) };
}
