/**
 * What a buyer is told about a submission, for the whole life of an order (docs/after-sale.md
 * "Buyer answers"): the decision logic behind `GET …/orders/{reservationId}`, `GET …/orders?requestId=`
 * and a submission that reaches an activity whose cache is gone. HTTP handlers parse, call one of
 * these functions and answer; the rules live here.
 *
 * Source of truth: PostgreSQL once an order exists (every state change is a conditional UPDATE
 * there, so it cannot be stale); the Redis ledger and results only for what has no order yet
 * (QUEUED, or FAILED before an order could exist).
 */
import { Decimal } from 'decimal.js';
import { readResult } from './activity-cache.js';
import { restoredAt } from './cache-restore.js';
import { saleWindowPosition } from './db/activity-registry-store.js';
import { findLifecycleByReservationId } from './db/orders-store.js';
import type { LifecycleOrderRow } from './db/orders-store.js';
import { paymentsForOrder } from './db/payments-store.js';
import type { Pool } from './db/pool.js';
import { readWriteBack } from './db/stock-store.js';
import { FlashSaleError } from './errors.js';
import { readReservation, reservationIdFor } from './reservations.js';
import type { RedisClient } from './scripts.js';

export type BuyerOrderStatus = 'QUEUED' | 'UNPAID' | 'PAID' | 'CLOSED' | 'REFUNDING' | 'REFUNDED' | 'FAILED';

export interface BuyerOrderView {
  status: BuyerOrderStatus;
  orderId?: string;
  skuId?: string;
  quantity?: number;
  /** Decimal string, two decimals. */
  amount?: string;
  /** ISO 8601: until when an UNPAID order can be paid. */
  paymentDeadline?: string;
  paidAt?: string;
  closedAt?: string;
  /** CLOSED: why (PAYMENT_TIMEOUT, CANCELLED, ...); FAILED: why no order exists. */
  reason?: string;
  /**
   * Money received for this order that will be returned (a payment after the close, a second
   * trade, a wrong amount): surplus payments not refunded yet (REFUND_PENDING or REFUNDING).
   */
  refundPending?: { amount: string; count: number };
}

export interface ViewDeps {
  redis: RedisClient;
  pool: Pool;
}

export interface LookupInput {
  activityId: string;
  userId: string;
  reservationId: string;
}

async function viewOfOrder(pool: Pool, o: LifecycleOrderRow): Promise<BuyerOrderView> {
  const view: BuyerOrderView = {
    status: o.status,
    orderId: o.id,
    skuId: o.skuId,
    quantity: o.quantity,
    amount: o.amount,
    paymentDeadline: o.expiresAt.toISOString(),
  };
  if (o.paidAt) view.paidAt = o.paidAt.toISOString();
  if (o.status === 'CLOSED') {
    view.reason = o.closeReason ?? 'CLOSED';
    if (o.closedAt) view.closedAt = o.closedAt.toISOString();
  }
  // Any order can have received money that goes back, UNPAID included (a payment of the wrong
  // amount leaves its order UNPAID). It is owed until refunded: REFUND_PENDING, and REFUNDING
  // once the refund worker has taken it (within seconds).
  const pending = (await paymentsForOrder(pool, o.id)).filter(
    (p) => p.state === 'REFUND_PENDING' || p.state === 'REFUNDING',
  );
  if (pending.length > 0) {
    const total = pending.reduce((n, p) => n.plus(p.amount), new Decimal(0));
    view.refundPending = { amount: total.toFixed(2), count: pending.length };
  }
  return view;
}

/**
 * The current state of one of the buyer's submissions. Somebody else's reservation or order
 * answers UNKNOWN_RESERVATION, exactly like one that does not exist.
 */
export async function lookupOrder(deps: ViewDeps, input: LookupInput): Promise<BuyerOrderView> {
  const { activityId, userId, reservationId } = input;
  // PostgreSQL first: once the order exists (most polls), the Redis copies are not read at all.
  const order = await findLifecycleByReservationId(deps.pool, reservationId);
  if (order) {
    if (order.userId !== userId || order.activityId !== activityId)
      throw new FlashSaleError('UNKNOWN_RESERVATION');
    return viewOfOrder(deps.pool, order);
  }
  const [stored, rsv] = await Promise.all([
    readResult(deps.redis, activityId, reservationId),
    readReservation(deps.redis, activityId, reservationId, { userId }),
  ]);
  if (rsv && rsv.userId !== userId) throw new FlashSaleError('UNKNOWN_RESERVATION');
  if (stored && stored.userId === userId && stored.result.status === 'FAILED') {
    return { status: 'FAILED', reason: stored.result.reason };
  }
  if (rsv?.state === 'RELEASED' || rsv?.state === 'CANCELLED') return { status: 'FAILED', reason: rsv.state };
  if (rsv) return { status: 'QUEUED' };
  // The cache was restored from PostgreSQL (core/cache-restore.ts) after Redis lost its data: a
  // submission neither PostgreSQL nor the restored cache knows was acknowledged before the loss
  // and never reached Kafka. The restore waited for every message already in Kafka, so no order
  // can appear for it any more: the buyer reads FAILED instead of an unknown reservation.
  if (await restoredAt(deps.redis, activityId)) return { status: 'FAILED', reason: 'RESERVATION_LOST' };
  throw new FlashSaleError('UNKNOWN_RESERVATION');
}

export interface LateSubmission {
  activityId: string;
  userId: string;
  requestId: string;
  skuId: string;
  quantity: number;
}

export interface ReplayAnswer {
  reservationId: string;
  view: BuyerOrderView;
}

/**
 * A submission that reached an activity with no cache (not loaded yet, or cleaned up after the
 * sale): a replay of a submission that became an order gets that order back (the same contract as
 * the script's replay during the sale); anything else is refused by the registered sale window,
 * judged by the database clock: ENDED after endAt (or once written back), NOT_STARTED before
 * startAt, UNAVAILABLE (503, retry) inside the window, NOT_FOUND for an activity nobody registered.
 */
export async function answerUnloadedSubmission(deps: ViewDeps, s: LateSubmission): Promise<ReplayAnswer> {
  const reservationId = reservationIdFor(s.activityId, s.userId, s.requestId);
  const order = await findLifecycleByReservationId(deps.pool, reservationId);
  if (order && order.userId === s.userId && order.activityId === s.activityId) {
    if (order.skuId !== s.skuId || order.quantity !== s.quantity) {
      throw new FlashSaleError(
        'IDEMPOTENCY_CONFLICT',
        'the requestId was used for a different sku or quantity',
      );
    }
    return { reservationId, view: await viewOfOrder(deps.pool, order) };
  }
  const stored = await readResult(deps.redis, s.activityId, reservationId);
  if (stored && stored.userId === s.userId && stored.result.status === 'FAILED') {
    return { reservationId, view: { status: 'FAILED', reason: stored.result.reason } };
  }
  const [position, writtenBack] = await Promise.all([
    saleWindowPosition(deps.pool, s.activityId),
    readWriteBack(deps.pool, s.activityId),
  ]);
  if (writtenBack || position === 'ended') throw new FlashSaleError('ENDED', 'the sale has ended');
  if (position === 'unknown') throw new FlashSaleError('NOT_FOUND', `unknown activity ${s.activityId}`);
  // Inside its window a registered sale has, or is about to have, a cache: Redis lost it and the
  // restore has not put its hold in place yet, or the warm-up runs late. A final-looking
  // "not open yet" would turn buyers away from a sale that is open: retry.
  if (position === 'open')
    throw new FlashSaleError('UNAVAILABLE', 'the sale is open but its cache is not loaded yet; retry');
  throw new FlashSaleError('NOT_STARTED', 'the sale is not open yet');
}
