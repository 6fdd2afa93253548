/**
 * The payment-timeout sweeper (docs/sources seeds 003 and 004): closes UNPAID orders past expires_at in batches
 * and returns their stock through the idempotent settlement path (core/order-lifecycle.ts).
 *
 * Each batch is one statement `... FOR UPDATE SKIP LOCKED` + conditional UPDATE, committed with
 * its journal rows; several replicas sweeping at once take disjoint rows, and a payment holding an
 * order's lock makes the sweeper skip that order (the payment wins; the next sweep sees PAID).
 * After the batches, closed orders whose settlement was interrupted (crash, Redis outage,
 * write-back in progress) and older than the grace period are settled again.
 */
import { appendJournal } from '../../core/db/journal-store.js';
import { closeExpiredOrders, findUnsettledClosedOrders } from '../../core/db/orders-store.js';
import { inTransaction } from '../../core/db/pool.js';
import { settleStock } from '../../core/order-lifecycle.js';
import type { LifecycleDeps, SettleSummary } from '../../core/order-lifecycle.js';

export interface SweepDeps extends LifecycleDeps {
  activityId: string;
  batchSize: number;
  maxBatches: number;
  settleGraceSeconds: number;
}

export interface SweepReport {
  closed: number;
  settled: SettleSummary;
  /** Orders closed earlier whose settlement this run re-drove. */
  resettled: number;
}

function add(a: SettleSummary, b: SettleSummary): void {
  a.redis += b.redis;
  a.postgres += b.postgres;
  a.unresolved += b.unresolved;
  a.withheld += b.withheld;
  a.deferred += b.deferred;
}

export async function sweepExpiredOrders(d: SweepDeps): Promise<SweepReport> {
  const settled: SettleSummary = { redis: 0, postgres: 0, unresolved: 0, withheld: 0, deferred: 0 };
  let closed = 0;
  for (let b = 0; b < d.maxBatches; b += 1) {
    const rows = await inTransaction(d.pool, async (c) => {
      const batch = await closeExpiredOrders(c, d.activityId, d.batchSize, 'PAYMENT_TIMEOUT');
      await appendJournal(
        c,
        batch.map((o) => ({
          activityId: o.activityId,
          reservationId: o.reservationId,
          orderId: o.id,
          event: 'ORDER_CLOSED',
          fromStatus: 'UNPAID',
          toStatus: 'CLOSED',
          traceId: o.traceId,
          detail: { reason: 'PAYMENT_TIMEOUT', expiresAt: o.expiresAt },
        })),
      );
      return batch;
    });
    if (rows.length === 0) break;
    closed += rows.length;
    d.metrics?.orders.inc({ activity: d.activityId, status: 'CLOSED' }, rows.length);
    d.metrics?.ordersClosed.inc({ activity: d.activityId, reason: 'PAYMENT_TIMEOUT' }, rows.length);
    add(settled, await settleStock(d, rows));
    if (rows.length < d.batchSize) break;
  }
  const unsettled = await findUnsettledClosedOrders(d.pool, d.activityId, d.settleGraceSeconds, d.batchSize);
  if (unsettled.length > 0) add(settled, await settleStock(d, unsettled));
  if (closed > 0 || unsettled.length > 0) {
    d.logger.info(
      { activity: d.activityId, closed, resettled: unsettled.length, ...settled },
      'payment-timeout sweep',
    );
  }
  return { closed, settled, resettled: unsettled.length };
}
