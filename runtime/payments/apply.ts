/**
 * Applying a verified payment notification (docs/sources seed 004 "acceptAlipay"), in one transaction:
 *
 *   1. lock the order row (SELECT ... FOR UPDATE): notifications for one order, the timeout
 *      sweeper and cancellations queue here; always the order first, then the payment
 *   2. insert the payment as RECEIVED, keyed by (provider, trade_no); on conflict lock the existing
 *      row and check it is the same order and amount (else TRADE_CONFLICT, nothing written)
 *   3. an existing APPLIED / REFUND_PENDING row answers a redelivery with the same outcome
 *   4. a wrong amount -> REFUND_PENDING (the order is untouched)
 *   5. conditional UNPAID -> PAID; success -> APPLIED, otherwise (closed, or paid by another
 *      trade) -> REFUND_PENDING and the order keeps its state, with one exception decided by
 *      payment time (docs/sources seed 004): an order the timeout closed, paid within its window (plus the
 *      signature tolerance), is paid after all when its unit can be taken back atomically
 *      (core/order-lifecycle.ts reclaimClosedOrder); otherwise REFUND_PENDING
 *
 * After the commit a paid order's reservation is marked PAID in Redis (confirmPaid) while the
 * cache is live, so no release can ever return its stock; a transient failure there makes the
 * notification fail (5xx) and the provider's retry re-confirms (ALREADY_PAID path).
 */
import { Decimal } from 'decimal.js';
import { appendJournal } from '../../core/db/journal-store.js';
import { lockOrder, PAID_STATUSES, transitionOrder } from '../../core/db/orders-store.js';
import type { LifecycleOrderRow } from '../../core/db/orders-store.js';
import { finishPayment, insertPayment, lockPayment } from '../../core/db/payments-store.js';
import { isStorableText } from '../../core/db/storable-text.js';
import { readWriteBack } from '../../core/db/stock-store.js';
import type { RefundReason } from '../../core/db/payments-store.js';
import { inTransaction } from '../../core/db/pool.js';
import type { Pool } from '../../core/db/pool.js';
import { FlashSaleError } from '../../core/errors.js';
import type { Logger } from '../../core/logger.js';
import type { Metrics } from '../../core/metrics.js';
import { reclaimClosedOrder } from '../../core/order-lifecycle.js';
import { confirmPaid } from '../../core/reservations.js';
import type { RedisClient } from '../../core/scripts.js';
import type { PaymentNotice } from '../../core/payment-provider.js';

export type PaymentOutcome = 'PAID' | 'ALREADY_PAID' | 'REFUND_PENDING';

export interface ApplyResult {
  outcome: PaymentOutcome;
  refundReason: RefundReason | null;
  order: LifecycleOrderRow;
  /** Paid in time for an order the timeout had closed: its unit was taken back. */
  late?: boolean;
}

export interface PaymentDeps {
  pool: Pool;
  redis: RedisClient;
  logger: Logger;
  metrics?: Metrics | undefined;
  /** Seconds a payment time may pass an order's deadline and still count as in time (clock skew). */
  paidTimeToleranceSeconds?: number | undefined;
}

/** Whether the notice says the buyer paid within the order's payment window (plus the tolerance). */
export function paidInTime(
  order: LifecycleOrderRow,
  notice: PaymentNotice,
  toleranceSeconds: number,
): boolean {
  if (!notice.paidAt) return false;
  return notice.paidAt.getTime() <= order.expiresAt.getTime() + toleranceSeconds * 1000;
}

/** How deep a notification's fields may nest: storing them (JSON.stringify) recurses. */
export const NOTIFICATION_MAX_DEPTH = 64;

/**
 * Where in `value` (strings, object keys, nested objects and arrays) there is text PostgreSQL
 * cannot store, or nesting deeper than NOTIFICATION_MAX_DEPTH, as a dotted path (`` for `value`
 * itself) and why, or undefined. Iterative: a signed body may nest deeply, and storing one nested
 * too deep would overflow the stack (a 500 the provider retries for ever).
 */
function unstorablePath(value: unknown): { path: string; message: string } | undefined {
  const stack: [unknown, string, number][] = [[value, '', 0]];
  for (let item = stack.pop(); item !== undefined; item = stack.pop()) {
    const [v, path, depth] = item;
    if (typeof v === 'string') {
      if (!isStorableText(v)) return { path, message: UNSTORABLE_TEXT };
    } else if (v !== null && typeof v === 'object') {
      if (depth >= NOTIFICATION_MAX_DEPTH)
        return { path, message: `nested deeper than ${NOTIFICATION_MAX_DEPTH} levels` };
      for (const [k, child] of Object.entries(v)) {
        if (!isStorableText(k))
          return { path: path === '' ? '(a key)' : `${path}.(a key)`, message: UNSTORABLE_TEXT };
        stack.push([child, path === '' ? k : `${path}.${k}`, depth + 1]);
      }
    }
  }
  return undefined;
}

const UNSTORABLE_TEXT = 'no U+0000 and no unpaired surrogate (text the database can store)';

/**
 * Steps 1-5 above, in one transaction; throws (and writes nothing) for unknown orders and trade
 * conflicts, and VALIDATION_ERROR (400, signed but malformed) before it when the notification
 * holds text PostgreSQL cannot store (its fields go to payments.notification, a jsonb): the
 * provider is told so instead of retrying a 500 forever.
 */
export async function applyPayment(
  pool: Pool,
  provider: string,
  notice: PaymentNotice,
  traceId: string,
  paidTimeToleranceSeconds = 0,
  /** To take a late in-time payment's unit back from Redis while the sale cache is live. */
  live?: { redis: RedisClient; logger: Logger },
): Promise<ApplyResult> {
  const unstorable =
    unstorablePath(notice.fields) ??
    unstorablePath({ tradeNo: notice.tradeNo, providerStatus: notice.providerStatus });
  if (unstorable !== undefined) {
    throw new FlashSaleError('VALIDATION_ERROR', 'the notification is not valid', { errors: [unstorable] });
  }
  return inTransaction(pool, async (c) => {
    const order = await lockOrder(c, notice.orderId);
    if (!order) throw new FlashSaleError('UNKNOWN_ORDER', `no order ${notice.orderId}`);
    const journal = (event: string, to: string | null, detail: Record<string, unknown>) =>
      appendJournal(c, [
        {
          activityId: order.activityId,
          reservationId: order.reservationId,
          orderId: order.id,
          event,
          fromStatus: order.status,
          toStatus: to,
          traceId,
          detail: { provider, tradeNo: notice.tradeNo, amount: notice.amount, ...detail },
        },
      ]);
    const refund = async (reason: RefundReason, why?: string): Promise<ApplyResult> => {
      await finishPayment(c, provider, notice.tradeNo, { state: 'REFUND_PENDING', reason });
      await journal('PAYMENT_REFUND_PENDING', order.status, { reason, ...(why ? { why } : {}) });
      return { outcome: 'REFUND_PENDING', refundReason: reason, order };
    };

    const fresh = await insertPayment(c, {
      provider,
      tradeNo: notice.tradeNo,
      orderId: order.id,
      activityId: order.activityId,
      reservationId: order.reservationId,
      amount: notice.amount,
      traceId,
      notification: notice.fields,
    });
    if (!fresh) {
      const existing = await lockPayment(c, provider, notice.tradeNo);
      if (!existing) throw new Error(`payment ${provider}/${notice.tradeNo} vanished`);
      if (existing.orderId !== order.id || !new Decimal(existing.amount).eq(notice.amount)) {
        throw new FlashSaleError(
          'TRADE_CONFLICT',
          `trade ${notice.tradeNo} is recorded for order ${existing.orderId} with amount ${existing.amount}`,
        );
      }
      if (existing.state === 'APPLIED') return { outcome: 'ALREADY_PAID', refundReason: null, order };
      // A surplus payment being (or already) refunded answers its redelivery the same way.
      if (
        existing.state === 'REFUND_PENDING' ||
        existing.state === 'REFUNDING' ||
        existing.state === 'REFUNDED'
      ) {
        return { outcome: 'REFUND_PENDING', refundReason: existing.refundReason, order };
      }
      // RECEIVED is never committed by this code; should one exist, it is decided now.
    }

    if (!new Decimal(order.amount).eq(notice.amount)) return refund('AMOUNT_MISMATCH');

    const t = await transitionOrder(c, order.id, 'PAY');
    if (t.applied) {
      await finishPayment(c, provider, notice.tradeNo, { state: 'APPLIED' });
      await journal('ORDER_PAID', 'PAID', {});
      return { outcome: 'PAID', refundReason: null, order: t.order };
    }
    // The row is locked, so the status read before is still current.
    if (order.status === 'CLOSED') {
      if (order.closeReason !== 'PAYMENT_TIMEOUT')
        return refund('ORDER_CLOSED', `closed: ${order.closeReason}`);
      if (!paidInTime(order, notice, paidTimeToleranceSeconds)) {
        return refund('ORDER_CLOSED', 'paid after the payment deadline');
      }
      const late = await reclaimClosedOrder(c, order, live?.redis, live?.logger);
      if (!late.reclaimed) return refund('ORDER_CLOSED', `paid in time, but ${late.why}`);
      await finishPayment(c, provider, notice.tradeNo, { state: 'APPLIED' });
      await journal('ORDER_PAID', 'PAID', {
        late: true,
        paidAt: notice.paidAt?.toISOString(),
        stock: late.stock,
        from: late.source,
      });
      return { outcome: 'PAID', refundReason: null, order: late.order, late: true };
    }
    if (PAID_STATUSES.includes(order.status)) return refund('PAID_BY_OTHER_TRADE');
    return refund('ORDER_NOT_PAYABLE');
  });
}

/**
 * Applies the notice, then marks the reservation paid in Redis for paid orders. A FROZEN cache
 * (written back) or a cleaned-up one needs no mark: PostgreSQL holds the state alone then.
 */
export async function acceptPayment(
  deps: PaymentDeps,
  provider: string,
  notice: PaymentNotice,
  traceId: string,
): Promise<ApplyResult> {
  const result = await applyPayment(
    deps.pool,
    provider,
    notice,
    traceId,
    deps.paidTimeToleranceSeconds ?? 0,
    {
      redis: deps.redis,
      logger: deps.logger,
    },
  );
  if (result.late) {
    deps.logger.info(
      { orderId: result.order.id, tradeNo: notice.tradeNo, paidAt: notice.paidAt, traceId },
      'late notification of an in-time payment: closed order paid after all, its unit taken back',
    );
  }
  const { order } = result;
  if (result.outcome === 'PAID') deps.metrics?.orders.inc({ activity: order.activityId, status: 'PAID' });
  if (result.outcome === 'REFUND_PENDING') {
    deps.logger.warn(
      { orderId: order.id, tradeNo: notice.tradeNo, reason: result.refundReason, traceId },
      'payment recorded as REFUND_PENDING',
    );
  }
  if (result.outcome !== 'REFUND_PENDING' && PAID_STATUSES.includes(order.status)) {
    // Once written back PostgreSQL alone holds the sale: Redis' copy is frozen (it would answer
    // FROZEN) or cleaned up, and may be unreachable long after the sale. A payment committed here
    // must not be answered 503, and its every redelivery with it, for a copy nobody reads again.
    if (await readWriteBack(deps.pool, order.activityId)) return result;
    try {
      await confirmPaid(deps.redis, order.activityId, order.reservationId, {
        userId: order.userId,
        skuId: order.skuId,
      });
    } catch (err) {
      if (err instanceof FlashSaleError && (err.code === 'FROZEN' || err.code === 'UNKNOWN_RESERVATION')) {
        return result;
      }
      if (err instanceof FlashSaleError && err.code === 'RELEASED') {
        // Written back since the check above: a late payment takes its unit from activity_stock,
        // and the reservation of an order closed before the freeze stays RELEASED in Redis. The
        // gate that answers FROZEN for it is a stock bucket's meta hash when the SKU is bucketed,
        // and a cleanup may have deleted that before the reservation: expected, not inconsistent.
        if (await readWriteBack(deps.pool, order.activityId)) return result;
        // Cannot happen while releases follow a CLOSED order in PostgreSQL; loud if it ever does.
        deps.logger.error(
          { orderId: order.id, reservationId: order.reservationId, traceId },
          'INCONSISTENT: a paid order whose reservation was released in Redis',
        );
        return result;
      }
      throw err;
    }
  }
  return result;
}

/** A verified notification's outcome: IGNORED when it reports no payment, else acceptPayment's. */
export async function applyPaymentNotification(
  deps: PaymentDeps,
  provider: string,
  notice: PaymentNotice,
  traceId: string,
): Promise<string> {
  if (notice.status !== 'success') return 'IGNORED';
  return (await acceptPayment(deps, provider, notice, traceId)).outcome;
}
