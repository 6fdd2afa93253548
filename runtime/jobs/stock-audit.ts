/**
 * The stock audit (docs/sources seed 003's reconciliation; not the operator's reconcile loop in
 * operator/reconcile/): compares the Redis counters, the reservation ledger and PostgreSQL
 * for one activity, writes a report row, sets flashsale_reconciliation_mismatch{activity} (failed
 * checks) and flashsale_reconciliation_stock_delta{activity}, and logs one clear error line per
 * mismatching run.
 *
 * Stock held = initial - remaining, from Redis while the cache is live, from activity_stock after
 * write-back (PostgreSQL is the source of truth then; once cleanup has begun Redis is not read at
 * all, its keys being partial). It must equal the stock accounted for:
 *   live orders (UNPAID, PAID, REFUNDING, REFUNDED)
 *   + closed orders whose stock is not settled yet
 *   + in-flight reservations (in the ledger, RESERVED, no order yet)
 * Further checks: Redis counters agree with Redis stock (initial - remaining = reserved -
 * released), no negative stock, no unresolved stock return, every paid order has exactly one
 * applied payment and every applied payment a paid order.
 *
 * After a cache restore (core/cache-restore.ts) the figures name the last one: what it found and
 * what it reloaded; while one is in progress the run is skipped.
 *
 * Redis and PostgreSQL cannot be read atomically together; a run that finds a mismatch measures
 * once more after a short pause and reports the second measurement, so orders moving between the
 * two reads during a live sale do not raise false alarms.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { countUnconfirmed, readMeta, readStock, unconfirmedReservations } from '../../core/activity-cache.js';
import { findByReservationIds, orderQuantities } from '../../core/db/orders-store.js';
import { paymentFigures } from '../../core/db/payments-store.js';
import { refundConsistency, refundCounts } from '../../core/db/refunds-store.js';
import { inReadSnapshot } from '../../core/db/pool.js';
import type { Pool } from '../../core/db/pool.js';
import { restoresOf } from '../../core/db/cache-restores-store.js';
import { insertReport, purgeOldReports } from '../../core/db/reconciliation-store.js';
import type { Mismatch, ReconciliationBasis } from '../../core/db/reconciliation-store.js';
import { readStockRows, readWriteBack } from '../../core/db/stock-store.js';
import type { Logger } from '../../core/logger.js';
import type { Metrics } from '../../core/metrics.js';
import { readReservation } from '../../core/reservations.js';
import type { RedisClient } from '../../core/scripts.js';

export interface StockAuditDeps {
  activityId: string;
  redis: RedisClient;
  pool: Pool;
  logger: Logger;
  metrics?: Metrics | undefined;
  /** Ledger entries examined at most (the stock check is skipped above it). */
  maxLedger?: number;
  /** Pause before re-measuring a mismatch. */
  remeasureDelayMs?: number;
  /**
   * The activity's reports older than this many days are deleted after each run (its newest is
   * always kept); 0 or undefined keeps every report (RECONCILIATION_REPORT_RETENTION_DAYS).
   */
  reportRetentionDays?: number | undefined;
}

export interface StockAuditResult {
  reportId: string;
  basis: ReconciliationBasis;
  ok: boolean;
  mismatches: Mismatch[];
  figures: Record<string, number | string | boolean>;
}

interface Measurement {
  basis: ReconciliationBasis;
  mismatches: Mismatch[];
  figures: Record<string, number | string | boolean>;
  stockDelta: number;
}

async function measure(d: StockAuditDeps): Promise<Measurement> {
  const a = d.activityId;
  const [meta, wb] = await Promise.all([readMeta(d.redis, a), readWriteBack(d.pool, a)]);
  if (!meta && !wb)
    return { basis: 'skipped', mismatches: [], figures: { why: 'not loaded' }, stockDelta: 0 };
  if (meta?.gate === 'frozen' && !wb) {
    return { basis: 'skipped', mismatches: [], figures: { why: 'write-back in progress' }, stockDelta: 0 };
  }
  // A cache restore (core/cache-restore.ts) rebuilds Redis from PostgreSQL: the two disagree by
  // design until it is done, and its own report row says what it found and did.
  const [restore] = await restoresOf(d.pool, a, 1);
  if (restore && restore.step !== 'resumed') {
    return {
      basis: 'skipped',
      mismatches: [],
      figures: { why: 'cache restore in progress', restoreEpoch: restore.epoch, restoreStep: restore.step },
      stockDelta: 0,
    };
  }
  // Once cleanup has begun its keys are partial (core/activity-cache.ts cleanupActivity): Redis is
  // not read. Cleanup begins only after the write-back, with the gate frozen and the ledger and
  // outbox empty, so PostgreSQL holds every figure and nothing is in flight.
  const cleaning = meta?.cleanupBeganMs !== undefined;
  if (cleaning && !wb) {
    return { basis: 'skipped', mismatches: [], figures: { why: 'cleanup in progress' }, stockDelta: 0 };
  }
  const redisLive = meta !== undefined && !cleaning;
  const maxLedger = d.maxLedger ?? 100_000;
  // Redis first, PostgreSQL second: an order written in between is found by its reservation id.
  // Every ledger: the activity's and each stock bucket's (readStock sums the buckets too).
  const [stock, ledgerSize, entries] = redisLive
    ? await Promise.all([
        readStock(d.redis, a),
        countUnconfirmed(d.redis, a, Number.MAX_SAFE_INTEGER),
        unconfirmedReservations(d.redis, a, Number.MAX_SAFE_INTEGER, maxLedger),
      ])
    : [undefined, 0, [] as Awaited<ReturnType<typeof unconfirmedReservations>>];
  const ledger = entries.map((e) => e.reservationId);
  const scopeOf = new Map(entries.map((e) => [e.reservationId, e.scope]));
  // Every PostgreSQL figure from one snapshot: read by separate statements, an order the consumer
  // commits in between is in neither the live quantity (read before it) nor in flight (its order
  // found after it), and the stock-held check fails falsely whenever orders flow.
  const [q, pay, pgStock, refunds, refundStates, orderedRows] = await inReadSnapshot(
    d.pool,
    async (c) =>
      [
        await orderQuantities(c, a),
        await paymentFigures(c, a),
        wb ? await readStockRows(c, a) : undefined,
        await refundConsistency(c, a),
        await refundCounts(c, a),
        await findByReservationIds(c, ledger),
      ] as const,
  );
  const ordered = new Set(orderedRows.map((o) => o.reservationId));
  let inFlight = 0;
  let inFlightReservations = 0;
  for (const rid of ledger.filter((r) => !ordered.has(r))) {
    const rsv = await readReservation(d.redis, a, rid, scopeOf.get(rid));
    if (rsv?.state === 'RESERVED') {
      inFlight += rsv.quantity;
      inFlightReservations += 1;
    }
  }

  const mismatches: Mismatch[] = [];
  const check = (name: string, expected: number, actual: number, detail?: string) => {
    if (expected !== actual)
      mismatches.push({ check: name, expected, actual, ...(detail ? { detail } : {}) });
  };
  const figures: Record<string, number | string | boolean> = {
    gate: meta?.gate ?? 'absent',
    ...(cleaning ? { cleanupBegan: new Date(meta.cleanupBeganMs!).toISOString() } : {}),
    writtenBack: Boolean(wb),
    liveOrderQuantity: q.live,
    unpaid: q.byStatus.UNPAID,
    paid: q.byStatus.PAID,
    refunding: q.byStatus.REFUNDING,
    refunded: q.byStatus.REFUNDED,
    closed: q.byStatus.CLOSED,
    closedUnsettled: q.closedUnsettled,
    closedViaRedis: q.closedViaRedis,
    closedViaPostgres: q.closedViaPostgres,
    closedUnresolved: q.closedUnresolved,
    closedWithheld: q.closedWithheld,
    ledgerSize,
    inFlightReservations,
    inFlightQuantity: inFlight,
    appliedPayments: pay.appliedOrders,
    refundPendingPayments: pay.refundPending,
    refundsPending: refundStates.PENDING,
    refundsSucceeded: refundStates.SUCCEEDED,
    refundsFailed: refundStates.FAILED,
  };
  if (restore) {
    // The last restore of the cache: what it found (Redis vs PostgreSQL) and what it reloaded.
    Object.assign(figures, {
      restoreEpoch: restore.epoch,
      restoreReason: restore.reason,
      restoredAt: restore.resumedAt?.toISOString() ?? '',
      restoreDivergence: JSON.stringify(restore.divergence.skus),
      restoreReloaded: JSON.stringify('skus' in restore.reloaded ? restore.reloaded.skus : []),
    });
  }
  if (stock) {
    Object.assign(figures, {
      redisInitial: stock.initial,
      redisRemaining: stock.remaining,
      redisReserved: stock.reserved,
      redisReleased: stock.released,
    });
    check(
      'redis-counters',
      stock.initial - stock.remaining,
      stock.reserved - stock.released,
      'initial - remaining vs reserved - released',
    );
    for (const s of stock.skus) if (s.remaining < 0) check(`negative-stock:${s.skuId}`, 0, s.remaining);
  }
  const basis: ReconciliationBasis = wb ? 'postgres' : 'redis';
  let held: number;
  if (pgStock) {
    const initial = pgStock.reduce((n, s) => n + s.initial, 0);
    const remaining = pgStock.reduce((n, s) => n + s.remaining, 0);
    Object.assign(figures, { pgInitial: initial, pgRemaining: remaining });
    held = initial - remaining;
  } else held = stock!.initial - stock!.remaining;
  const accounted = q.live + q.closedUnsettled + inFlight;
  Object.assign(figures, { held, accounted });
  if (ledgerSize > maxLedger) figures.ledgerTruncated = true;
  else
    check(
      'stock-held',
      held,
      accounted,
      `${basis}: initial - remaining vs live orders + unsettled closed + in-flight`,
    );
  check('unresolved-returns', 0, q.closedUnresolved);
  check('paid-without-payment', 0, pay.paidWithoutPayment);
  check('payment-without-paid-order', 0, pay.paymentWithoutPaid);
  // Money going back: every refund state of an order or payment has its refund row, and every
  // succeeded refund its REFUNDED order or payment (docs/after-sale.md "Refunds").
  check('order-refund-state-without-refund', 0, refunds.orderStateWithoutRefund);
  check('payment-refund-state-without-refund', 0, refunds.paymentStateWithoutRefund);
  check('succeeded-refund-not-applied', 0, refunds.refundWithoutState);
  return { basis, mismatches, figures, stockDelta: held - accounted };
}

export async function auditStock(d: StockAuditDeps): Promise<StockAuditResult> {
  const a = d.activityId;
  let m = await measure(d);
  if (m.mismatches.length > 0) {
    await sleep(d.remeasureDelayMs ?? 1000);
    m = await measure(d);
  }
  const ok = m.mismatches.length === 0;
  const reportId = await insertReport(d.pool, {
    activityId: a,
    basis: m.basis,
    ok,
    mismatches: m.mismatches,
    figures: m.figures,
  });
  if (d.reportRetentionDays) {
    // A run every RECONCILIATION_CRON tick for as long as the jobs run: without this the table
    // grows by one row per activity every 5 minutes, for ever. A failed purge is retried next run.
    await purgeOldReports(d.pool, a, d.reportRetentionDays * 86_400).catch((err: Error) =>
      d.logger.warn(
        { activity: a, err: err.message },
        'reconciliation report purge failed; retried next run',
      ),
    );
  }
  d.metrics?.reconciliationRuns.inc({
    activity: a,
    result: m.basis === 'skipped' ? 'skipped' : ok ? 'ok' : 'mismatch',
  });
  if (m.basis !== 'skipped') {
    d.metrics?.reconciliationMismatch.set({ activity: a }, m.mismatches.length);
    d.metrics?.reconciliationStockDelta.set({ activity: a }, m.stockDelta);
  }
  if (!ok) {
    const summary = m.mismatches
      .map((x) => `${x.check}: expected ${x.expected}, found ${x.actual}`)
      .join('; ');
    d.logger.error(
      { activity: a, reportId, basis: m.basis, mismatches: m.mismatches, figures: m.figures },
      `RECONCILIATION MISMATCH activity=${a} report=${reportId}: ${summary}`,
    );
  } else if (m.basis !== 'skipped') {
    d.logger.info({ activity: a, reportId, basis: m.basis, held: m.figures.held }, 'reconciliation ok');
  }
  return { reportId, basis: m.basis, ok, mismatches: m.mismatches, figures: m.figures };
}
