/**
 * After-sale order lifecycle shared by the api (cancellation, payments) and the scheduled jobs
 * (payment-timeout sweeper, order-gap compensation): closing an order and returning its stock
 * exactly once.
 *
 * Rules (see docs/after-sale.md):
 * - PostgreSQL decides first. An order is closed by a conditional UPDATE (UNPAID -> CLOSED); stock
 *   is returned only for an order that is CLOSED in PostgreSQL (or inserted CLOSED from the
 *   reservation ledger while in flight), never the other way round. A payment locks the same row,
 *   so close and pay can never both win.
 * - The stock of a closed order is "settled" once: `orders.stock_return_via` records where it went.
 *   While the cache is live it goes back to Redis through release-6.lua (idempotent by reservation
 *   id). Once the gate is frozen (write-back), Redis refuses every release, so whatever was not
 *   released before the freeze is in the write-back snapshot as held, and is returned to
 *   `activity_stock` in the same transaction that marks the order settled.
 * - When neither can be proven (the cache was cleaned up after a release may have been attempted)
 *   the order is marked 'unresolved' and reported: stock is returned at most once, never twice.
 * - An order the PostgreSQL stock guard closed (`OVERSELL_PREVENTED`, `BUYER_LIMIT_EXCEEDED`)
 *   is settled 'withheld': its unit is not returned anywhere (see `guardRelease`).
 */
import { readMeta, readStock, scopeLoaded, unconfirmedReservations } from './activity-cache.js';
import { bucketLayout } from './buckets.js';
import type { BucketLayout } from './buckets.js';
import { holdOffRestores, restoresOf } from './db/cache-restores-store.js';
import { appendJournal } from './db/journal-store.js';
import type { JournalEntry } from './db/journal-store.js';
import { lockActivitySkus } from './db/activity-skus-store.js';
import {
  buyerSkuKey,
  clearReleaseAttempted,
  closedByPaymentTimeout,
  findLifecycleByReservationId,
  closedUnsettledQuantity,
  findUnsettledClosedOfSku,
  reservationsHoldingStock,
  findWithheldForBuyer,
  findWithheldOfSku,
  lockUnsettledClosed,
  insertClosedOrder,
  liveQuantityOfBuyers,
  markReleaseAttempted,
  markStockReturned,
  markWithheldReturned,
  PAID_STATUSES,
  reopenClosedAsPaid,
  transitionOrder,
} from './db/orders-store.js';
import type {
  ClosedReservation,
  LifecycleOrderRow,
  StockReturnVia,
  TransitionResult,
} from './db/orders-store.js';
import { inSavepoint, inTransaction, isUniqueViolation } from './db/pool.js';
import type { Pool, PoolClient, Queryable } from './db/pool.js';
import { readWriteBack, returnStock, takeBackStock } from './db/stock-store.js';
import { localAck } from './durable-ack.js';
import type { AnsweredOn, ReservationAck } from './durable-ack.js';
import { FlashSaleError } from './errors.js';
import type { Logger } from './logger.js';
import type { Metrics } from './metrics.js';
import {
  cancelBeforeReserve,
  orderMessageOf,
  paidReservationsAmong,
  readReservation,
  reclaimPaid,
  release,
  reservationIdFor,
  returnWithheld,
  unitBackInRedis,
  withheldReturnedFor,
} from './reservations.js';
import type {
  CancelMarkerOutcome,
  CancelMarkerPolicy,
  ReclaimOutcome,
  ReservationRecord,
} from './reservations.js';
import { groupByScope } from './keys.js';
import type { ScopeKeys } from './keys.js';
import { CANCEL_MARKER_STATE } from './order-message.js';
import type { RedisClient } from './scripts.js';

export interface LifecycleDeps {
  pool: Pool;
  redis: RedisClient;
  logger: Logger;
  metrics?: Metrics | undefined;
  /** Used for the expiry of orders inserted CLOSED from the ledger (kept consistent with the consumer). */
  paymentTimeoutSeconds: number;
  /**
   * Makes a stock return to Redis as durable as a reservation (`RESERVE_ACK`, core/durable-ack.ts)
   * before PostgreSQL records it settled. A release a failover loses would otherwise be recorded
   * `redis` while the promoted replica still holds the reservation: its unit stranded for good, and
   * the buyer's slot with it. Unconfirmed, the order stays unsettled and the sweeper settles it
   * again (release-6.lua is idempotent). Absent: the primary's answer is enough.
   */
  stockAck?: ReservationAck | undefined;
}

/** The fields of a closed order that settling its stock needs. */
export type SettleableOrder = Pick<
  LifecycleOrderRow,
  'id' | 'reservationId' | 'activityId' | 'userId' | 'skuId' | 'quantity' | 'traceId' | 'closeReason'
>;

export interface SettleSummary {
  redis: number;
  postgres: number;
  unresolved: number;
  withheld: number;
  /** Left for a later attempt (dependency unavailable, write-back not finished). */
  deferred: number;
}

/** Redis calls in flight at once while settling a batch (ioredis sends them without waiting for replies). */
const RELEASE_CONCURRENCY = 64;

async function mapLimit<T, R>(items: T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array<R>(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next;
      next += 1;
      out[i] = await fn(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

function journalSettled(orders: SettleableOrder[], via: StockReturnVia, detail = {}): JournalEntry[] {
  return orders.map((o) => ({
    activityId: o.activityId,
    reservationId: o.reservationId,
    orderId: o.id,
    event:
      via === 'unresolved'
        ? 'STOCK_RETURN_UNRESOLVED'
        : via === 'withheld'
          ? 'STOCK_WITHHELD'
          : 'STOCK_RETURNED',
    fromStatus: 'CLOSED',
    toStatus: 'CLOSED',
    traceId: o.traceId,
    detail: { via, quantity: o.quantity, sku: o.skuId, reason: o.closeReason, ...detail },
  }));
}

/**
 * How the release of an order closed because Redis had forgotten reservations differs from any
 * other. The PostgreSQL stock guard (core/stock-guard.ts) closes an order only when Redis accepted
 * a unit PostgreSQL does not have (its live quantity is at the SKU's stock) or a buyer's unit
 * beyond the limit (including a buyer slot another live order holds, which order-gap repair closes
 * `GAP_COMPENSATED`). Both happen only when Redis forgot reservations it had acknowledged (a
 * failover to a replica that had not received them, a restart that lost them; Redis loses a suffix
 * of its writes, replication and the AOF being ordered, never one key alone): it forgot their
 * stock decrements with them, so the unit this reservation took was one of those, already sold in
 * PostgreSQL. Returning it would only sell it again, to be closed again, until the sale ends;
 * withheld, Redis' stock comes back to PostgreSQL's by one unit per closed order (docs/after-sale.md,
 * "Orders the guard closed"). An order closed for the buyer's limit also keeps its slot: the
 * buyer's forgotten reservation holds it in PostgreSQL. `undefined` for every other order: a
 * normal release.
 */
export function guardRelease(
  closeReason: string | null,
): { returnStock: false; freeSlot: boolean } | undefined {
  if (closeReason === 'OVERSELL_PREVENTED') return { returnStock: false, freeSlot: true };
  if (closeReason === 'BUYER_LIMIT_EXCEEDED' || closeReason === 'GAP_COMPENSATED')
    return { returnStock: false, freeSlot: false };
  return undefined;
}

async function settle(
  deps: LifecycleDeps,
  orders: SettleableOrder[],
  via: 'redis' | 'unresolved' | 'withheld',
  why?: string,
): Promise<number> {
  if (orders.length === 0) return 0;
  const settled = await inTransaction(deps.pool, async (c) => {
    const ids = new Set(
      await markStockReturned(
        c,
        orders.map((o) => o.id),
        via,
      ),
    );
    const done = orders.filter((o) => ids.has(o.id));
    await appendJournal(c, journalSettled(done, via, why ? { why } : {}));
    return done;
  });
  if (settled.length > 0) {
    const activity = settled[0]!.activityId;
    deps.metrics?.stockReturns.inc({ activity, via }, settled.length);
    if (via === 'unresolved') {
      deps.logger.error(
        { activity, orders: settled.map((o) => o.id), why },
        'STOCK RETURN UNRESOLVED: cannot prove whether Redis returned this stock before the cache was cleaned up; not returning it twice, check the write-back figures',
      );
    }
  }
  return settled.length;
}

/** At most this many ledger entries are read to measure a SKU's reservations in flight. */
const SURPLUS_LEDGER_LIMIT = 10_000;
/** Stand-ins of a SKU examined at once by one settlement. */
const SURPLUS_CANDIDATES = 1_000;

type ForgottenOutcome = 'redis' | 'unresolved' | 'deferred' | 'settled-elsewhere';

/**
 * A closed order whose reservation Redis does not have while the cache is live: Redis forgot it
 * (a failover to a replica that missed it, a restart without data), and its stock decrement with
 * it, while its order stayed live in PostgreSQL. Its unit is then either still free in Redis, or
 * an order the guard closed holds it withheld (docs/after-sale.md, "A forgotten order closed
 * after its stand-in"):
 *
 * - the buyer's own stand-in: Redis gave the buyer a new reservation, which the guard closed for
 *   the buyer's limit (this order held the slot). It holds exactly what this order held, unit and
 *   slot, so it is given back whatever else is measured; never more stand-ins than this order's
 *   quantity, the others standing in for the buyer's other forgotten orders (`buyerStandIns`);
 * - otherwise one of the SKU's `OVERSELL_PREVENTED` closures, when measured under the SKU's row
 *   lock: units Redis holds beyond what PostgreSQL holds live or unsettled and what is in flight
 *   (`surplusStandIn`).
 *
 * Given back with returnWithheld-6.lua (at most once, recording this order), and this order is
 * settled 'redis'. With neither, 'unresolved', flagged, as before. Crash-safe in any order: the
 * script remembers for which order it gave a unit back, and PostgreSQL records both sides in one
 * transaction guarded by their conditional updates.
 */
async function settleForgotten(deps: LifecycleDeps, o: SettleableOrder): Promise<ForgottenOutcome> {
  try {
    const own = await buyerStandIns(deps, o);
    if (own !== 'none') return own;
    const surplus = await surplusStandIn(deps, o);
    if (surplus !== 'none') return surplus;
  } catch (err) {
    deps.logger.warn({ err: (err as Error).message, orderId: o.id }, 'stock return deferred');
    return 'deferred';
  }
  return (await settle(deps, [o], 'unresolved', 'redis release: UNKNOWN_RESERVATION')) > 0
    ? 'unresolved'
    : 'settled-elsewhere';
}

/**
 * The buyer's own stand-ins whose units go back for `o`: no more units than `o` holds, since each
 * stand-in took the unit of one forgotten order, and the buyer's other forgotten orders, still
 * live, hold the rest in PostgreSQL (each gets its own when it closes). Under `o`'s row lock, so
 * that a second settler of `o` finds it settled instead of giving back the next stand-in. Units
 * given back for `o` before a crash (returnWithheld-6.lua remembers the order) are counted first,
 * so a repeat records them and gives back none besides.
 */
async function buyerStandIns(
  deps: LifecycleDeps,
  o: SettleableOrder,
): Promise<Exclude<ForgottenOutcome, 'unresolved'> | 'none'> {
  return inTransaction(deps.pool, async (c) => {
    const unsettled = await lockUnsettledClosed(c, o.id);
    if (!unsettled) return 'settled-elsewhere';
    const candidates = await findWithheldForBuyer(c, o);
    const givenFor = await mapLimit(candidates, RELEASE_CONCURRENCY, (w) =>
      withheldReturnedFor(deps.redis, w),
    );
    const standIns = candidates.filter((_, i) => givenFor[i] === o.id);
    let owed = o.quantity - standIns.reduce((n, w) => n + w.quantity, 0);
    for (const [i, w] of candidates.entries()) {
      // Never more than `o` holds: the rest stand in for the buyer's other forgotten orders.
      if (w.quantity > owed) continue;
      // Given back already, for this order (counted above) or another one.
      if (givenFor[i] !== undefined) continue;
      if (w.stockReturnVia === null) {
        // Its own release (unit withheld) has not run yet: settle this order after it.
        deps.logger.warn(
          { orderId: o.id, standIn: w.id },
          'stock return deferred until its stand-in is settled',
        );
        return 'deferred';
      }
      if (await givenBack(deps, o, w)) {
        standIns.push(w);
        owed -= w.quantity;
      }
    }
    return standIns.length > 0 ? recordGivenBack(c, deps, o, standIns) : 'none';
  });
}

/** Gives the stand-in's unit back for `o` (or finds it given back for `o` already). */
async function givenBack(deps: LifecycleDeps, o: SettleableOrder, w: LifecycleOrderRow): Promise<boolean> {
  try {
    const r = await returnWithheld(deps.redis, {
      activityId: o.activityId,
      reservationId: w.reservationId,
      userId: w.userId,
      skuId: w.skuId,
      forOrderId: o.id,
    });
    return r.kind === 'returned' || r.forOrderId === o.id;
  } catch (err) {
    // Withheld by a version that did not record it, or forgotten as well: not this order's.
    if (isCode(err, 'NOT_WITHHELD', 'UNKNOWN_RESERVATION', 'MISMATCH')) return false;
    throw err;
  }
}

/**
 * One of the SKU's `OVERSELL_PREVENTED` closures whose unit goes back for `o`, if Redis holds it
 * beyond everything else. Each such closure took a unit a forgotten reservation had left free in
 * Redis, but none says whose; so it is measured, under the SKU's row lock (no order of the SKU is
 * inserted, closed or reopened meanwhile): units Redis has taken (initial − remaining, buckets
 * included) less what PostgreSQL holds — live orders and closed ones not settled yet (this order
 * excepted: its unit is what is being looked for; a closed one whose release Redis has run already
 * holds nothing there, nor does a guard closure not settled yet) — less the reservations in flight
 * (in a ledger, no order in PostgreSQL yet). Read in that order, so that what changes between
 * the reads errs towards holding more: a release after its order was read is still counted held,
 * a reservation after the stock was read is counted in flight. Whatever is left is held by
 * withheld closures beyond the forgotten orders still live, so one of them is given back.
 */
async function surplusStandIn(
  deps: LifecycleDeps,
  o: SettleableOrder,
): Promise<Exclude<ForgottenOutcome, 'unresolved'> | 'none'> {
  const candidates = await findWithheldOfSku(deps.pool, o.activityId, o.skuId, SURPLUS_CANDIDATES);
  if (candidates.length === 0) return 'none';
  // A unit given back for this order before a crash, not recorded in PostgreSQL yet.
  const givenFor = await mapLimit(candidates, RELEASE_CONCURRENCY, (w) => withheldReturnedFor(deps.redis, w));
  const earlier = candidates.find((_, i) => givenFor[i] === o.id);
  if (earlier) return inTransaction(deps.pool, (c) => recordGivenBack(c, deps, o, [earlier]));
  if (await restoreInProgress(deps.pool, o.activityId)) return 'deferred';
  return inTransaction(deps.pool, async (c) => {
    // Another settler of this order may have given a unit back meanwhile: measured without this
    // order's unit, a second one would be found.
    if (!(await lockUnsettledClosed(c, o.id))) return 'settled-elsewhere';
    const [sku] = await lockActivitySkus(c, o.activityId, [o.skuId]);
    if (!sku) return 'none';
    const unsettled = await closedUnsettledQuantity(c, o.activityId, o.skuId);
    const peers = await findUnsettledClosedOfSku(c, o.activityId, o.skuId, o.id, SURPLUS_CANDIDATES);
    // A guard closure never held a unit in PostgreSQL (its unit in Redis is a withheld one, what is
    // being measured); another closed order holds nothing in Redis once its release has run there.
    const holdsNothing = await mapLimit(
      peers,
      RELEASE_CONCURRENCY,
      async (p) => guardRelease(p.closeReason) !== undefined || (await unitBackInRedis(deps.redis, p)),
    );
    const notHeld = peers.filter((_, i) => holdsNothing[i]).reduce((n, p) => n + p.quantity, 0);
    const held = sku.sold + unsettled - o.quantity - notHeld;
    const stock = (await readStock(deps.redis, o.activityId)).skus.find((x) => x.skuId === o.skuId);
    if (!stock) return 'none';
    const inFlight = await inFlightQuantity(c, deps.redis, o.activityId, o.skuId);
    if (inFlight === undefined) return 'deferred';
    const beyond = stock.initial - stock.remaining - held - inFlight;
    // Read again under the lock: another order's settlement may have taken one meanwhile.
    for (const w of await findWithheldOfSku(c, o.activityId, o.skuId, SURPLUS_CANDIDATES)) {
      if (w.quantity <= beyond && (await givenBack(deps, o, w)))
        return recordGivenBack(c, deps, o, [w], {
          measured: { beyond, held, inFlight, unsettledHoldingNothing: notHeld },
        });
    }
    return 'none';
  });
}

/**
 * Quantity of the SKU's reservations in the ledgers, `RESERVED`, without an order holding stock
 * in PostgreSQL (an order inserted, its ledger entry not removed yet, is counted held already);
 * undefined above the limit. `c` holds the SKU's row lock, so no order of it is inserted meanwhile.
 */
async function inFlightQuantity(
  c: PoolClient,
  redis: RedisClient,
  activityId: string,
  skuId: string,
): Promise<number | undefined> {
  const entries = await unconfirmedReservations(
    redis,
    activityId,
    Number.MAX_SAFE_INTEGER,
    SURPLUS_LEDGER_LIMIT + 1,
  );
  if (entries.length > SURPLUS_LEDGER_LIMIT) return undefined;
  const records = await mapLimit(entries, RELEASE_CONCURRENCY, (e) =>
    readReservation(redis, activityId, e.reservationId, e.scope),
  );
  const reserved = records.filter(
    (r): r is NonNullable<typeof r> => r?.state === 'RESERVED' && r.skuId === skuId,
  );
  const inPostgres = await reservationsHoldingStock(
    c,
    activityId,
    reserved.map((r) => r.reservationId),
  );
  return reserved.filter((r) => !inPostgres.has(r.reservationId)).reduce((n, r) => n + r.quantity, 0);
}

/** Settles `o` 'redis' through the stand-ins whose units went back, and marks them, in `c`. */
async function recordGivenBack(
  c: PoolClient,
  deps: LifecycleDeps,
  o: SettleableOrder,
  standIns: LifecycleOrderRow[],
  detail: Record<string, unknown> = {},
): Promise<'redis' | 'settled-elsewhere'> {
  const [settled] = await markStockReturned(c, [o.id], 'redis');
  const marked = new Set(
    await markWithheldReturned(
      c,
      standIns.map((w) => w.id),
      o.id,
    ),
  );
  const why = 'Redis forgot its reservation; the unit withheld in its place went back to the sale';
  await appendJournal(c, [
    ...(settled ? journalSettled([o], 'redis', { why, standIns: standIns.map((w) => w.id), ...detail }) : []),
    ...standIns
      .filter((w) => marked.has(w.id))
      .map((w) => ({
        activityId: w.activityId,
        reservationId: w.reservationId,
        orderId: w.id,
        event: 'WITHHELD_STOCK_RETURNED',
        fromStatus: 'CLOSED',
        toStatus: 'CLOSED',
        traceId: w.traceId,
        detail: { quantity: w.quantity, sku: w.skuId, for: o.id, reason: w.closeReason },
      })),
  ]);
  if (!settled) return 'settled-elsewhere';
  deps.metrics?.stockReturns.inc({ activity: o.activityId, via: 'redis' });
  deps.logger.warn(
    { activity: o.activityId, orderId: o.id, standIns: standIns.map((w) => w.id) },
    'a closed order whose reservation Redis forgot: the unit withheld in its place went back to the sale',
  );
  return 'redis';
}

/** Returns stock of one closed order to PostgreSQL after write-back, in the settling transaction. */
async function settleInPostgres(deps: LifecycleDeps, o: SettleableOrder): Promise<boolean> {
  return inTransaction(deps.pool, async (c) => {
    const ids = await markStockReturned(c, [o.id], 'postgres');
    if (ids.length === 0) return false; // settled by somebody else meanwhile
    if (!(await readWriteBack(c, o.activityId))) {
      // Frozen but the snapshot is not committed yet: returning now would be overwritten or lost.
      throw new FlashSaleError('NOT_WRITTEN_BACK', `activity ${o.activityId} is frozen but not written back`);
    }
    const r = await returnStock(c, o.activityId, o.skuId, o.quantity);
    if (r.trimmed > 0)
      deps.logger.warn(
        { activity: o.activityId, orderId: o.id, sku: o.skuId, returned: r.returned, trimmed: r.trimmed },
        "stock return held to PostgreSQL's unsold stock: Redis had sold units it forgot",
      );
    await appendJournal(c, journalSettled([o], 'postgres', r.trimmed > 0 ? { trimmed: r.trimmed } : {}));
    return true;
  });
}

/**
 * The released orders whose release the replicas confirmed (LifecycleDeps.stockAck): one probe and
 * one WAIT per scope (a cluster node each; on a single primary the WAITs of one moment are shared).
 */
async function durablyReleased(
  deps: LifecycleDeps,
  activityId: string,
  layout: BucketLayout,
  released: { o: SettleableOrder; on: AnsweredOn }[],
): Promise<SettleableOrder[]> {
  const ack = deps.stockAck;
  if (!ack || ack === localAck || released.length === 0) return released.map((x) => x.o);
  // By scope and by where each release was answered: a release answered by a server the client
  // has left since (a failover between the release and its WAIT) is never confirmed by the WAIT of
  // the server of the moment, which speaks for that server's writes only.
  const groups: { scope: ScopeKeys; on: AnsweredOn; orders: SettleableOrder[] }[] = [];
  for (const { scope, items } of groupByScope(released, (x) => layout.scopeFor(x.o.skuId, x.o.userId))) {
    for (const { o, on } of items) {
      const same = groups.find((g) => g.scope === scope && g.on === on);
      if (same) same.orders.push(o);
      else groups.push({ scope, on, orders: [o] });
    }
  }
  const confirmed = await Promise.all(
    groups.map(async ({ scope, on, orders }) => {
      try {
        // `replayed`: a probe write first, so the WAIT covers the releases however they were sent.
        await ack.confirm(activityId, orders[0]!.reservationId, true, scope, on);
        return orders;
      } catch (err) {
        deps.logger.warn(
          { activity: activityId, orders: orders.map((o) => o.id), err: (err as Error).message },
          'stock return deferred: the replicas did not confirm the release',
        );
        return [];
      }
    }),
  );
  return confirmed.flat();
}

/** A cache restore of the activity has begun and not resumed yet (core/cache-restore.ts). */
async function restoreInProgress(db: Queryable, activityId: string): Promise<boolean> {
  const [restore] = await restoresOf(db, activityId, 1);
  return restore !== undefined && restore.step !== 'resumed';
}

function isCode(err: unknown, ...codes: string[]): boolean {
  return err instanceof FlashSaleError && codes.includes(err.code);
}

/**
 * Returns the stock of closed orders exactly once (see the module comment). Safe to call any
 * number of times, concurrently, for the same orders.
 */
export async function settleStock(deps: LifecycleDeps, orders: SettleableOrder[]): Promise<SettleSummary> {
  const summary: SettleSummary = { redis: 0, postgres: 0, unresolved: 0, withheld: 0, deferred: 0 };
  const byActivity = new Map<string, SettleableOrder[]>();
  for (const o of orders) byActivity.set(o.activityId, [...(byActivity.get(o.activityId) ?? []), o]);
  for (const [activityId, list] of byActivity) {
    if (await restoreInProgress(deps.pool, activityId)) {
      // The cache is being rebuilt from PostgreSQL: a release now would find no reservation (an
      // empty cache) or be overwritten by the reload's absolute stock. The reload reads one
      // snapshot: it counts the unit of an order closed before it as free and rebuilds its
      // reservation RELEASED, that of one closed after it as held, its reservation RESERVED, so
      // once it has resumed the release finds the reservation it needs. Left for the next attempt.
      deps.logger.warn(
        { activity: activityId, orders: list.map((o) => o.id) },
        'stock return deferred until the cache restore has resumed',
      );
      summary.deferred += list.length;
      continue;
    }
    // Read once per activity and sweep, when first needed: a record read as missing only defers a
    // return to the next sweep, and a committed one is never taken back.
    let writeBack: ReturnType<typeof readWriteBack> | undefined;
    const writtenBack = (): ReturnType<typeof readWriteBack> =>
      (writeBack ??= readWriteBack(deps.pool, activityId));
    let meta: Awaited<ReturnType<typeof readMeta>>;
    // Redis away after the write-back committed (after the sale, say): PostgreSQL settles what it
    // can prove alone, below, instead of failing every sweep until Redis is back.
    let redisAway = false;
    try {
      meta = await readMeta(deps.redis, activityId);
    } catch (err) {
      if (!(await writtenBack())) throw err;
      redisAway = true;
    }
    let frozen: SettleableOrder[] = list;
    // Whether the gate of these orders is known frozen: read so, or answered so by release-6.lua.
    let provenFrozen = meta?.gate === 'frozen';
    // Once the write-back is committed PostgreSQL holds the stock, whatever the gate says: a Redis
    // back from a snapshot older than the freeze (a restart, a lagging replica) shows the gate it
    // had before, and a release there would return a unit activity_stock never sees.
    if (meta && meta.gate !== 'frozen' && !(await writtenBack())) {
      await markReleaseAttempted(
        deps.pool,
        list.map((o) => o.id),
      );
      const layout = await bucketLayout(deps.redis, activityId);
      // Decided before the releases: a release answered before the decision is never confirmed
      // (answeredOn), which would defer the first stock returns of every process start.
      await deps.stockAck?.ready?.().catch(() => undefined);
      const results = await mapLimit(list, RELEASE_CONCURRENCY, async (o) => {
        try {
          await release(deps.redis, {
            activityId,
            reservationId: o.reservationId,
            userId: o.userId,
            skuId: o.skuId,
            reason: o.closeReason ?? 'CLOSED',
            ...guardRelease(o.closeReason),
          });
          // As the answer arrives (no I/O in between): the connection or node that gave it.
          const on = deps.stockAck?.answeredOn(activityId, layout.scopeFor(o.skuId, o.userId));
          return { o, r: 'released' as const, on };
        } catch (err) {
          if (isCode(err, 'FROZEN')) return { o, r: 'frozen' as const };
          if (isCode(err, 'UNKNOWN_RESERVATION', 'MISMATCH', 'ALREADY_PAID'))
            return { o, r: 'broken' as const, err: err as FlashSaleError };
          deps.logger.warn({ err: (err as Error).message, orderId: o.id }, 'stock release deferred');
          return { o, r: 'deferred' as const };
        }
      });
      const released = await durablyReleased(
        deps,
        activityId,
        layout,
        results.flatMap((x) => (x.r === 'released' ? [{ o: x.o, on: x.on }] : [])),
      );
      summary.deferred += results.filter((x) => x.r === 'released').length - released.length;
      summary.redis += await settle(
        deps,
        released.filter((o) => !guardRelease(o.closeReason)),
        'redis',
      );
      summary.withheld += await settle(
        deps,
        released.filter((o) => guardRelease(o.closeReason)),
        'withheld',
      );
      for (const x of results.filter((y) => y.r === 'broken')) {
        // Nothing ever returns a guard-closed order's unit, so there is nothing to prove either.
        if (guardRelease(x.o.closeReason))
          summary.withheld += await settle(deps, [x.o], 'withheld', `redis release: ${x.err?.code}`);
        else if (x.err?.code === 'UNKNOWN_RESERVATION') {
          const outcome = await settleForgotten(deps, x.o);
          if (outcome !== 'settled-elsewhere') summary[outcome] += 1;
        } else if (x.err?.code === 'ALREADY_PAID') {
          // A closed order whose reservation Redis holds PAID: a payment in time took the unit back
          // (reclaimPaid-5.lua) and its transaction has not committed, or died before it did. The
          // unit is held for that payment, whose provider retries until it is answered (and then
          // reopens the order); settled 'unresolved' here, the retry would be refunded instead.
          // Left unsettled: the write-back settles it (a reservation still PAID there is flagged).
          deps.logger.warn(
            { orderId: x.o.id, reservationId: x.o.reservationId },
            'stock return deferred: a payment holds the unit in Redis (reservation PAID)',
          );
          summary.deferred += 1;
        } else summary.unresolved += await settle(deps, [x.o], 'unresolved', `redis release: ${x.err?.code}`);
      }
      summary.deferred += results.filter((x) => x.r === 'deferred').length;
      frozen = results.filter((x) => x.r === 'frozen').map((x) => x.o);
      provenFrozen = true;
    }
    let toPostgres = 0;
    // Written back: a withheld unit goes to PostgreSQL no more than to Redis.
    summary.withheld += await settle(
      deps,
      frozen.filter((o) => guardRelease(o.closeReason)),
      'withheld',
    );
    for (const o of frozen.filter((x) => !guardRelease(x.closeReason))) {
      try {
        if (redisAway) {
          // No release was ever attempted: the unit was held when the gate froze, so the write-back
          // counted it held, and it goes back in PostgreSQL. One attempted needs Redis to tell
          // whether it ran before the freeze (then the snapshot counted it free already).
          const row = await findLifecycleByReservationId(deps.pool, o.reservationId);
          // Nor one whose unit the write-back held for a late payment (its reservation PAID in
          // Redis, the payment's transaction not committed): that is Redis's to tell too.
          if (
            row &&
            !row.stockReleaseAttemptedAt &&
            !row.unitHeldForPayment &&
            (await settleInPostgres(deps, o))
          )
            toPostgres += 1;
          else summary.deferred += 1;
          continue;
        }
        const rsv = await readReservation(deps.redis, activityId, o.reservationId, {
          userId: o.userId,
          skuId: o.skuId,
        });
        if (rsv && (rsv.state === 'RELEASED' || rsv.state === 'CANCELLED')) {
          // Released before the freeze: already part of the write-back snapshot's remaining stock.
          summary.redis += await settle(deps, [o], 'redis');
        } else if (rsv && rsv.state === 'PAID') {
          summary.unresolved += await settle(deps, [o], 'unresolved', 'reservation is PAID in Redis');
        } else if (!rsv) {
          const row = await findLifecycleByReservationId(deps.pool, o.reservationId);
          if (row?.stockReleaseAttemptedAt && !meta && !(await writtenBack())) {
            // No cache and no write-back: Redis lost the sale's data mid-sale (cleanup comes only
            // after the write-back), and the cache restore has not opened yet. It rebuilds this
            // closed order's reservation RELEASED with its unit free, and the release finds that.
            deps.logger.warn(
              { activity: activityId, orderId: o.id },
              'stock return deferred: the sale cache is gone before its write-back (a cache restore is due)',
            );
            summary.deferred += 1;
          } else if (row?.stockReleaseAttemptedAt) {
            summary.unresolved += await settle(
              deps,
              [o],
              'unresolved',
              'cache cleaned up after a release attempt',
            );
          } else if (await settleInPostgres(deps, o)) toPostgres += 1;
        } else {
          // RESERVED with the gate frozen: held as the freeze left it, so no release of it ever
          // happened, whatever attempt was recorded (an attempt that met the freeze was answered
          // FROZEN). Said in PostgreSQL before the return, which waits for the write-back to commit:
          // by the next attempt cleanup may have deleted the reservation, and a recorded attempt
          // would then leave the unit unresolved.
          if (provenFrozen) await clearReleaseAttempted(deps.pool, o.id);
          if (await settleInPostgres(deps, o)) toPostgres += 1;
        }
      } catch (err) {
        summary.deferred += 1;
        deps.logger.warn({ err: (err as Error).message, orderId: o.id }, 'stock return deferred');
      }
    }
    summary.postgres += toPostgres;
    if (toPostgres > 0) deps.metrics?.stockReturns.inc({ activity: activityId, via: 'postgres' }, toPostgres);
  }
  return summary;
}

function closedJournal(
  o: LifecycleOrderRow,
  traceId: string,
  fromStatus: string | null,
  detail = {},
): JournalEntry {
  return {
    activityId: o.activityId,
    reservationId: o.reservationId,
    orderId: o.id,
    event: 'ORDER_CLOSED',
    fromStatus,
    toStatus: 'CLOSED',
    traceId,
    detail: { reason: o.closeReason, ...detail },
  };
}

export interface CloseResult {
  transition: TransitionResult;
  settle: SettleSummary | undefined;
}

/**
 * Closes one order (UNPAID -> CLOSED, conditional) and settles its stock. An order that is CLOSED
 * already has its settlement re-driven (idempotent); a paid order is left alone and reported.
 */
export async function closeOrder(
  deps: LifecycleDeps,
  orderId: string,
  reason: string,
  traceId: string,
): Promise<CloseResult> {
  const transition = await inTransaction(deps.pool, async (c) => {
    const t = await transitionOrder(c, orderId, 'CLOSE', reason);
    if (t.applied) await appendJournal(c, [closedJournal(t.order, traceId, 'UNPAID')]);
    return t;
  });
  if (transition.applied) {
    deps.metrics?.orders.inc({ activity: transition.order.activityId, status: 'CLOSED' });
    deps.metrics?.ordersClosed.inc({ activity: transition.order.activityId, reason });
    return { transition, settle: await settleStock(deps, [transition.order]) };
  }
  const o = transition.order;
  if (o && o.status === 'CLOSED' && !o.stockReturned && o.stockReturnVia === null) {
    return { transition, settle: await settleStock(deps, [o]) };
  }
  return { transition, settle: undefined };
}

export type InFlightCloseResult =
  | { kind: 'closed'; order: LifecycleOrderRow; settle: SettleSummary }
  | { kind: 'order-exists'; order: LifecycleOrderRow | undefined };

/**
 * Closes a reservation that is in flight (reserved in Redis, no order in PostgreSQL yet) by
 * inserting its order as CLOSED from the ledger entry: the consumer's later insert conflicts on the
 * reservation id and finds it closed, so no live order can appear afterwards.
 */
export async function closeInFlight(
  deps: LifecycleDeps,
  activityId: string,
  rsv: ReservationRecord,
  reason: string,
  traceId: string,
  detail: Record<string, unknown> = {},
): Promise<InFlightCloseResult> {
  const inserted = await inTransaction(deps.pool, async (c) => {
    const row = await insertClosedOrder(
      c,
      orderMessageOf(activityId, rsv),
      reason,
      deps.paymentTimeoutSeconds,
    );
    if (row) await appendJournal(c, [closedJournal(row, traceId, null, { inFlight: true, ...detail })]);
    return row;
  });
  if (!inserted) {
    return { kind: 'order-exists', order: await findLifecycleByReservationId(deps.pool, rsv.reservationId) };
  }
  deps.metrics?.ordersClosed.inc({ activity: activityId, reason });
  return { kind: 'closed', order: inserted, settle: await settleStock(deps, [inserted]) };
}

export interface CancelInput {
  activityId: string;
  userId: string;
  traceId: string;
  /**
   * Which submission: by the reservation id the 202 carried, or by the submission's own requestId
   * (when the 202 never arrived). Only the requestId form may leave a cancel marker for a
   * reservation that has not arrived: its id is derived from this buyer's requestId, so a made-up
   * or somebody else's id never writes anything.
   */
  target: { reservationId: string } | { requestId: string };
  /** Bounds of cancel markers; defaults to DEFAULT_CANCEL_MARKER_POLICY. */
  markers?: CancelMarkerPolicy | undefined;
}

/** What a cancellation did, and the reservation id it named (derived from a requestId). */
export type CancelOutcome = { reservationId: string } & (
  | { outcome: 'cancelled'; orderId: string | undefined; inFlight: boolean }
  | { outcome: 'already-cancelled'; orderId: string | undefined; state: string }
  | { outcome: 'tombstoned' }
);

/** The reservation id a cancellation names (derived from the buyer's requestId when given). */
function cancelTargetId(input: Pick<CancelInput, 'activityId' | 'userId' | 'target'>): string {
  return 'requestId' in input.target
    ? reservationIdFor(input.activityId, input.userId, input.target.requestId)
    : input.target.reservationId;
}

/**
 * Buyer cancellation of a reservation or its order (docs/sources seed 004): the same close and release path
 * as the payment timeout. A cancellation by requestId that arrives before its reservation leaves a
 * cancel marker (cancelBeforeReserve-3.lua: owned by the buyer, expiring after the sale, a bounded
 * number per buyer) so the late reservation is refused; cancelling twice is idempotent; a paid
 * order is refused with ALREADY_PAID; an id with neither a reservation nor an order of this buyer
 * is UNKNOWN_RESERVATION and writes nothing.
 */
export async function cancelReservation(deps: LifecycleDeps, input: CancelInput): Promise<CancelOutcome> {
  const { activityId, userId, traceId } = input;
  const reservationId = cancelTargetId(input);
  for (let attempt = 0; attempt < 5; attempt += 1) {
    // Both read at once; a paid or closed order is answered from PostgreSQL alone, so a Redis
    // outage (after the sale, say) does not turn those answers into 503s.
    const reading = readReservation(deps.redis, activityId, reservationId, { userId });
    reading.catch(() => undefined);
    const order = await findLifecycleByReservationId(deps.pool, reservationId);
    if (order && (order.userId !== userId || order.activityId !== activityId))
      throw new FlashSaleError('UNKNOWN_RESERVATION');
    if (order) {
      if (PAID_STATUSES.includes(order.status))
        throw new FlashSaleError('ALREADY_PAID', undefined, { orderId: order.id });
      if (order.status === 'CLOSED') {
        // A nudge only: the sweeper settles it too, so an unreachable Redis does not fail the answer.
        if (!order.stockReturned && order.stockReturnVia === null)
          await settleStock(deps, [order]).catch((err: unknown) =>
            deps.logger.warn({ err: (err as Error).message, orderId: order.id }, 'stock return deferred'),
          );
        return {
          reservationId,
          outcome: 'already-cancelled',
          orderId: order.id,
          state: order.closeReason ?? 'CLOSED',
        };
      }
      const r = await closeOrder(deps, order.id, 'CANCELLED', traceId);
      if (r.transition.applied)
        return { reservationId, outcome: 'cancelled', orderId: order.id, inFlight: false };
      continue; // paid or closed meanwhile: the next round reports it
    }
    const rsv = await reading;
    if (rsv && rsv.userId !== userId) throw new FlashSaleError('UNKNOWN_RESERVATION');
    // This buyer's cancel marker, and the cancellation named the requestId: marked again below,
    // since the cancellation that left it may have stopped before the buyer's other scopes.
    const markerToComplete = rsv?.state === CANCEL_MARKER_STATE && 'requestId' in input.target;
    if (rsv && !markerToComplete) {
      if (rsv.state === 'RELEASED' || rsv.state === CANCEL_MARKER_STATE)
        return { reservationId, outcome: 'already-cancelled', orderId: undefined, state: rsv.state };
      if (rsv.state === 'PAID') throw new FlashSaleError('ALREADY_PAID');
      const r = await closeInFlight(deps, activityId, rsv, 'CANCELLED', traceId, { cancelledBy: 'buyer' });
      if (r.kind === 'closed')
        return { reservationId, outcome: 'cancelled', orderId: r.order.id, inFlight: true };
      continue; // the consumer wrote the order meanwhile
    }
    // Neither a reservation nor an order (at most this buyer's marker). Only a submission named by
    // this buyer's own requestId can still arrive and be refused by a marker; any other id is
    // unknown and writes nothing.
    if (!('requestId' in input.target)) throw new FlashSaleError('UNKNOWN_RESERVATION');
    const alreadyCancelled: CancelOutcome = {
      reservationId,
      outcome: 'already-cancelled',
      orderId: undefined,
      state: CANCEL_MARKER_STATE,
    };
    let r: CancelMarkerOutcome;
    try {
      r = await cancelBeforeReserve(
        deps.redis,
        { activityId, userId, requestId: input.target.requestId, reason: 'CANCELLED' },
        input.markers,
      );
    } catch (err) {
      // Written back, or the sale over: nothing can arrive any more, and a marker says so already.
      if (markerToComplete && isCode(err, 'FROZEN')) return alreadyCancelled;
      if (isCode(err, 'FROZEN', 'MISMATCH')) throw new FlashSaleError('UNKNOWN_RESERVATION');
      throw err;
    }
    if (r.kind === 'sale-over') {
      if (markerToComplete) return alreadyCancelled;
      throw new FlashSaleError('UNKNOWN_RESERVATION');
    }
    if (r.kind === 'marked') {
      await appendJournal(deps.pool, [
        {
          activityId,
          reservationId,
          event: 'CANCELLED_BEFORE_RESERVATION',
          toStatus: 'CANCELLED',
          traceId,
          // The buyer, so that a cache restore can put the marker back (core/cache-restore.ts).
          detail: { ttlSeconds: r.ttlSeconds, userId },
        },
      ]);
      return { reservationId, outcome: 'tombstoned' };
    }
    // Every scope holds this buyer's marker already: an earlier cancellation of the submission.
    if (r.state === CANCEL_MARKER_STATE) return alreadyCancelled;
    // 'exists': the reservation arrived meanwhile; the next round reports it.
  }
  throw new FlashSaleError('UNAVAILABLE', 'the reservation kept changing; retry the cancellation');
}

export type LateReclaim =
  | {
      reclaimed: true;
      order: LifecycleOrderRow;
      /** Where the unit came back from (or that it had never left). */
      stock: 'taken-back' | 'still-held';
      source: 'redis' | 'postgres';
    }
  | { reclaimed: false; why: string };

/**
 * Whether a reopened order takes its SKU's live quantity above the stock, or its buyer's above the
 * limit, in PostgreSQL (`activity_skus`, whose row the reopening's trigger has just locked and
 * updated): the stock guard's rule (core/stock-guard.ts) for the one other path that makes an
 * order live. Redis and `activity_stock` can hold units PostgreSQL has already sold when Redis
 * forgot reservations; a late payment must not take one of those. Returns why, or undefined.
 */
async function beyondGuard(c: PoolClient, row: LifecycleOrderRow): Promise<string | undefined> {
  const [sku] = await lockActivitySkus(c, row.activityId, [row.skuId]);
  if (!sku) return undefined; // an activity whose SKUs PostgreSQL never recorded: nothing to hold to
  if (sku.sold > sku.stock) return `its SKU's stock is all live in PostgreSQL (${sku.stock})`;
  const held = await liveQuantityOfBuyers(c, row.activityId, [row]);
  if ((held.get(buyerSkuKey(row.userId, row.skuId)) ?? 0) > sku.limitPerUser)
    return `its buyer holds the limit (${sku.limitPerUser}) with other live orders`;
  return undefined;
}

/**
 * The closed orders whose unit the write-back's snapshot holds for a payment: their reservations
 * are PAID in Redis (reclaimPaid-5.lua took the unit for a payment in time whose transaction died
 * before its commit; its provider retries). Read once the gate is frozen, so no reservation changes
 * after; the write-back marks them in its transaction (core/db/stock-store.ts writeBack). Without
 * the mark the retry, reaching PostgreSQL after the write-back, would take a second unit from
 * activity_stock (or be refunded though paid in time).
 */
export async function ordersHeldForPayment(
  redis: RedisClient,
  pool: Queryable,
  activityId: string,
): Promise<ClosedReservation[]> {
  const closed = await closedByPaymentTimeout(pool, activityId);
  const paid = await paidReservationsAmong(redis, activityId, closed);
  return closed.filter((o) => paid.has(o.reservationId));
}

/**
 * A late payment for an order the write-back found held for it: the snapshot counted its unit
 * held, so activity_stock has none of it to give back; the order is reopened, nothing else moves.
 */
async function reopenHeldForPayment(c: PoolClient, order: LifecycleOrderRow): Promise<LateReclaim> {
  return inSavepoint<LateReclaim>(
    c,
    'late_payment_held',
    async () => {
      // Locked as every reopening locks it: the activity_skus row first (its trigger counts sold).
      await lockActivitySkus(c, order.activityId, [order.skuId]);
      const row = await reopenClosedAsPaid(c, order.id);
      if (!row) return { keep: false, value: { reclaimed: false, why: 'the order is no longer CLOSED' } };
      const beyond = await beyondGuard(c, row);
      if (beyond) return { keep: false, value: { reclaimed: false, why: beyond } };
      return { keep: true, value: { reclaimed: true, order: row, stock: 'still-held', source: 'postgres' } };
    },
    (err) =>
      isUniqueViolation(err)
        ? { reclaimed: false, why: 'the buyer holds this slot with another live order' }
        : undefined,
  );
}

/** A late payment's answer while a cache restore holds the cache: 503, the provider retries. */
function restoring(): FlashSaleError {
  return new FlashSaleError(
    'UNAVAILABLE',
    'the sale cache is being restored from PostgreSQL; retry the notification',
  );
}

/**
 * A payment made within the payment window reached an order the timeout closed meanwhile (source
 * 004: "按支付发生时间裁决", decide by payment time, not by which job ran first). The order is paid
 * after all if, and only if, its unit can be taken back atomically, inside the payment's
 * transaction (the order row is locked by the caller):
 *
 * - cache live (not written back): reclaimPaid-5.lua takes a released unit back from Redis (or
 *   marks a reservation never released PAID) and marks it PAID, atomically, or changes nothing
 *   (sold again, the buyer's slot taken). A frozen cache not yet written back answers
 *   NOT_WRITTEN_BACK (503): the provider retries and the PostgreSQL path decides. While a cache
 *   restore is in progress (a `cache_restores` row not `resumed`; in Redis the hold's `restoring`
 *   mark) nothing is taken back: UNAVAILABLE (503), the provider retries after the resume. A unit
 *   taken back from the lost cache would be overwritten by the reload's absolute stock (sold
 *   twice), and an emptied cache has no reservation to take back (refunded though paid in time).
 * - written back (PostgreSQL is the truth): a unit already returned (via redis before the
 *   freeze, or postgres after it) is taken out of `activity_stock` by a conditional UPDATE
 *   (`remaining >= quantity`); a unit not returned yet and never offered to Redis is still held in
 *   the snapshot, and the settler's conditional `status = 'CLOSED'` can no longer return it.
 * - otherwise (release attempted but its outcome unknown after the freeze, or unresolved): not
 *   reclaimed; the caller records REFUND_PENDING. Never an oversell: a unit is never sold twice.
 *
 * A buyer who meanwhile holds the same slot with another live order cannot get this one back
 * (the unique index refuses it): not reclaimed either.
 */
export async function reclaimClosedOrder(
  c: PoolClient,
  order: LifecycleOrderRow,
  redis?: RedisClient,
  logger?: Logger,
): Promise<LateReclaim> {
  if (order.status !== 'CLOSED') return { reclaimed: false, why: `order is ${order.status}` };
  if (order.unitHeldForPayment) return reopenHeldForPayment(c, order);
  if (order.stockReturnVia === 'unresolved')
    return { reclaimed: false, why: 'its stock return is unresolved' };
  const reopen = async (): Promise<LifecycleOrderRow | 'slot-taken' | { beyond: string } | undefined> =>
    inSavepoint<LifecycleOrderRow | 'slot-taken' | { beyond: string } | undefined>(
      c,
      'late_payment_reopen',
      async () => {
        const row = await reopenClosedAsPaid(c, order.id);
        const beyond = row && (await beyondGuard(c, row));
        if (beyond) return { keep: false, value: { beyond } };
        return { keep: row !== undefined, value: row };
      },
      (err) => (isUniqueViolation(err) ? 'slot-taken' : undefined),
    );

  if (!(await readWriteBack(c, order.activityId))) {
    if (!redis) return { reclaimed: false, why: 'the sale cache is live and no Redis client was given' };
    // Held to the commit: a restore opens before this check (503) or after the commit (its reload
    // counts the order PAID), never in between.
    await holdOffRestores(c, order.activityId);
    if (await restoreInProgress(c, order.activityId)) throw restoring();
    let outcome: ReclaimOutcome;
    try {
      outcome = await reclaimPaid(redis, {
        activityId: order.activityId,
        reservationId: order.reservationId,
        userId: order.userId,
        skuId: order.skuId,
        quantity: order.quantity,
      });
    } catch (err) {
      if (isCode(err, 'FROZEN')) {
        throw new FlashSaleError(
          'NOT_WRITTEN_BACK',
          'the stock is being written back; retry the notification',
        );
      }
      // The restore's hold began after the check above (reclaimPaid-5.lua reads its mark).
      if (isCode(err, 'PAUSED')) throw restoring();
      // Redis lost the sale (the meta hash of the reservation's scope is gone: the activity's, or
      // on a cluster its stock bucket's node alone) and the operator has not opened the restore
      // yet: the reservation is missing, not sold again. The restore brings it back (its unit
      // free once the order closed); answered as during the restore, not refunded.
      if (
        isCode(err, 'UNKNOWN_RESERVATION', 'NOT_LOADED') &&
        !(await scopeLoaded(redis, order.activityId, order.skuId, order.userId))
      )
        throw restoring();
      // Units moving between a bucketed SKU's buckets, not yet safe to land: a retry, not a refund.
      if (isCode(err, 'UNAVAILABLE')) throw err;
      if (err instanceof FlashSaleError) return { reclaimed: false, why: `Redis: ${err.code}` };
      throw err;
    }
    const row = await reopen();
    if (row === undefined || row === 'slot-taken' || 'beyond' in row) {
      // Redis holds the unit as PAID but the order stays CLOSED: one unit out of the sale
      // (never an oversell); reconciliation reports it. Beyond the guard, the unit Redis gave was
      // one it counted beyond PostgreSQL's stock (it forgot reservations), so none is lost.
      logger?.error(
        { orderId: order.id, reservationId: order.reservationId, outcome: outcome.kind, row },
        'LATE PAYMENT: the unit was taken back in Redis but the order could not be reopened',
      );
      return {
        reclaimed: false,
        why:
          row !== undefined && row !== 'slot-taken'
            ? row.beyond
            : 'the order could not be reopened (the buyer holds the slot)',
      };
    }
    return {
      reclaimed: true,
      order: row,
      stock: outcome.kind === 'still-held' ? 'still-held' : 'taken-back',
      source: 'redis',
    };
  }
  if (order.stockReturnVia === null && order.stockReleaseAttemptedAt !== null) {
    return { reclaimed: false, why: 'a Redis release was attempted and its outcome is not settled' };
  }
  const returned = order.stockReturnVia !== null;
  return inSavepoint<LateReclaim>(
    c,
    'late_payment',
    async () => {
      // The SKU's activity_skus row first, then activity_stock: the order returnStock locks them in
      // (the reopening below locks the former through its trigger). Taken the other way round, a
      // late payment and a stock return of the same SKU could wait on each other (a deadlock).
      await lockActivitySkus(c, order.activityId, [order.skuId]);
      if (returned && !(await takeBackStock(c, order.activityId, order.skuId, order.quantity))) {
        return { keep: false, value: { reclaimed: false, why: 'the returned unit was sold again' } };
      }
      const row = await reopenClosedAsPaid(c, order.id);
      if (!row) return { keep: false, value: { reclaimed: false, why: 'the order is no longer CLOSED' } };
      const beyond = await beyondGuard(c, row);
      if (beyond) return { keep: false, value: { reclaimed: false, why: beyond } };
      return {
        keep: true,
        value: {
          reclaimed: true,
          order: row,
          stock: returned ? 'taken-back' : 'still-held',
          source: 'postgres',
        },
      };
    },
    (err) =>
      isUniqueViolation(err)
        ? { reclaimed: false, why: 'the buyer holds this slot with another live order' }
        : undefined,
  );
}
