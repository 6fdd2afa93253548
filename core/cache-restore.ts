/**
 * Restoring an activity's Redis cache from PostgreSQL when Redis came back empty (a machine loss,
 * data files gone) or behind (a snapshot older than the last restore, or fewer units taken than
 * PostgreSQL holds as live orders) in the middle of a sale (docs/faults.md window 13). The
 * operator drives the steps (operator/reconcile/restore-cache.ts) and keeps their progress in
 * `cache_restores`; the functions here are the Redis and PostgreSQL work of each step, each
 * idempotent: every Redis write is an absolute value derived from PostgreSQL, fenced by the
 * restore's epoch, so a repeat after a crash writes the same thing again or nothing.
 *
 * The epoch mark: the load script writes the cache's `gen` (absent in an empty Redis), and each
 * restore's reload writes `epoch` (lua/restoreStock-var.lua). PostgreSQL remembers the last epoch
 * reloaded; a cache carrying an older one came back from before that restore.
 */
import { LOAD_CHUNK } from './activity-cache.js';
import { readActivitySkus } from './db/activity-skus-store.js';
import type { ActivitySkuRow } from './db/activity-skus-store.js';
import type { RestoreDivergence, RestoreReason, RestoreReload } from './db/cache-restores-store.js';
import { findByReservationIds, ordersForRestore } from './db/orders-store.js';
import type { OrderStatus } from './db/orders-store.js';
import type { Pool } from './db/pool.js';
import { activityKeys } from './keys.js';
import { readReservation } from './reservations.js';
import type { ReservationRecord } from './reservations.js';
import type { RedisClient } from './scripts.js';
import { runScript } from './scripts.js';

/** What the operator knows about the activity that an empty cache has forgotten. */
export interface RestoreTarget {
  activityId: string;
  epoch: number;
  /** The generation that was loaded (status.cache.loadedGeneration). */
  generation: number;
  startMs: number;
  endMs: number;
  requireOrderCode: boolean;
  reopenOnRelease: boolean;
  ownerUid: string;
}

export type CacheCheck =
  | { kind: 'consistent'; divergence: RestoreDivergence }
  | { kind: RestoreReason; divergence: RestoreDivergence };

async function measure(
  redis: RedisClient,
  pool: Pool,
  activityId: string,
  expectedEpoch: number,
  skus: ActivitySkuRow[],
): Promise<{ kind: 'consistent' | RestoreReason; divergence: RestoreDivergence }> {
  const k = activityKeys(activityId);
  // PostgreSQL's live units first, Redis second: Redis takes a unit before PostgreSQL can hold
  // its order, so a healthy cache shows at least as many units taken as PostgreSQL holds live.
  const live = new Map(skus.map((s) => [s.skuId, s.sold]));
  const meta = await redis.hgetall(k.meta);
  const pipeline = redis.pipeline();
  for (const s of skus) pipeline.hmget(k.sku(s.skuId), 'initial', 'stock');
  const replies = skus.length > 0 ? ((await pipeline.exec()) ?? []) : [];
  const divergence: RestoreDivergence = {
    redis: meta.gate
      ? { present: true, generation: Number(meta.gen ?? 0), epoch: Number(meta.epoch ?? 0) }
      : { present: false },
    expectedEpoch,
    skus: skus.map((s, i) => {
      const [initial, stock] = (replies[i]?.[1] as (string | null)[] | undefined) ?? [];
      const taken = initial == null || stock == null ? null : Number(initial) - Number(stock);
      return { skuId: s.skuId, redisTaken: taken, postgresLive: live.get(s.skuId) ?? 0 };
    }),
  };
  if (!meta.gate || !meta.gen) return { kind: 'CacheEmpty', divergence };
  if (Number(meta.epoch ?? 0) < expectedEpoch) return { kind: 'CacheBehind', divergence };
  const behind = divergence.skus.some((s) => s.redisTaken === null || s.postgresLive > s.redisTaken);
  return { kind: behind ? 'CacheBehind' : 'consistent', divergence };
}

/** Above this many SKUs, checkCache compares marks only (see there). */
export const UNIT_CHECK_MAX_SKUS = 5000;

/**
 * Whether the cache still holds what PostgreSQL proves was sold: empty (no meta, or a meta the
 * restore's hold wrote with no load mark), behind (an epoch older than `expectedEpoch`, or a SKU
 * with fewer units taken in Redis than PostgreSQL's live units), or consistent. A unit count
 * divergence is measured twice, `remeasureMs` apart, and reported only when both measurements
 * show it: a release between the two reads (PostgreSQL closes, then Redis returns the unit) can
 * make one measurement look behind.
 */
export async function checkCache(
  redis: RedisClient,
  pool: Pool,
  activityId: string,
  expectedEpoch: number,
  remeasureMs = 1000,
): Promise<CacheCheck> {
  // The unit comparison reads every SKU; an activity above UNIT_CHECK_MAX_SKUS is checked by its
  // marks only (empty, older epoch) on each pass, which keeps a pass cheap for huge catalogs.
  const k = activityKeys(activityId);
  const [gen, epoch, skuCount] = await Promise.all([
    redis.hget(k.meta, 'gen'),
    redis.hget(k.meta, 'epoch'),
    redis.scard(k.skuIndex),
  ]);
  if (gen && Number(epoch ?? 0) >= expectedEpoch && skuCount > UNIT_CHECK_MAX_SKUS) {
    return {
      kind: 'consistent',
      divergence: {
        redis: { present: true, generation: Number(gen), epoch: Number(epoch ?? 0) },
        expectedEpoch,
        skus: [],
      },
    };
  }
  const first = await measure(
    redis,
    pool,
    activityId,
    expectedEpoch,
    await readActivitySkus(pool, activityId),
  );
  if (first.kind !== 'CacheBehind' || !first.divergence.redis.present) return first;
  if ((first.divergence.redis.epoch ?? 0) < expectedEpoch) return first;
  await new Promise((r) => setTimeout(r, remeasureMs));
  return measure(redis, pool, activityId, expectedEpoch, await readActivitySkus(pool, activityId));
}

/** Step 1: keeps buyers out (gate `paused`; an empty cache gets a meta hash holding only that). */
export async function holdForRestore(redis: RedisClient, t: RestoreTarget): Promise<string> {
  const r = await runScript(
    redis,
    'holdForRestore',
    [activityKeys(t.activityId).meta],
    [t.epoch, t.startMs, t.endMs, t.requireOrderCode ? '1' : '0', t.reopenOnRelease ? '1' : '0', t.ownerUid],
  );
  return String(r[1]);
}

/** Half messages still in the cache's outbox (the relay empties it while the gate is paused). */
export async function outboxLength(redis: RedisClient, activityId: string): Promise<number> {
  return redis.xlen(activityKeys(activityId).outbox);
}

const PAGE = 1000;

function reservationState(status: OrderStatus): 'RESERVED' | 'PAID' | 'RELEASED' {
  if (status === 'CLOSED') return 'RELEASED';
  if (status === 'UNPAID') return 'RESERVED';
  return 'PAID';
}

interface BuyerHold {
  userId: string;
  skuId: string;
  quantity: number;
  slots: Map<number, string>;
}

/**
 * Step 3 (after the gate was paused and the backlog drained): rebuilds the cache from PostgreSQL.
 * Every order's reservation (so a buyer's retry is a replay and a later close returns its unit
 * exactly once), every buyer's held quantity and slots, then each SKU's stock = initial − live
 * orders − reservations still in flight (in the ledger, `RESERVED`, no order: only a cache that
 * came back behind has any), and last the epoch mark. Nothing opens the gate here.
 */
export async function reloadFromPostgres(
  redis: RedisClient,
  pool: Pool,
  t: RestoreTarget,
  maxLedger = 100_000,
): Promise<RestoreReload> {
  const k = activityKeys(t.activityId);
  const skus = await readActivitySkus(pool, t.activityId);
  if (skus.length === 0)
    throw new Error(`activity ${t.activityId} has no activity_skus rows to restore from`);
  const limits = new Map(skus.map((s) => [s.skuId, s.limitPerUser]));

  // Reservations in flight that the cache can still prove (a cache that came back behind).
  const ledger = await redis.zrange(k.ledger, 0, maxLedger - 1);
  const ordered = new Set((await findByReservationIds(pool, ledger)).map((o) => o.reservationId));
  const inFlight: ReservationRecord[] = [];
  for (const rid of ledger) {
    if (ordered.has(rid)) continue;
    const r = await readReservation(redis, t.activityId, rid);
    if (r?.state === 'RESERVED' && limits.has(r.skuId)) inFlight.push(r);
  }

  const holds = new Map<string, BuyerHold>();
  const hold = (userId: string, skuId: string): BuyerHold => {
    const key = `${userId}\n${skuId}`;
    let h = holds.get(key);
    if (!h) {
      h = { userId, skuId, quantity: 0, slots: new Map() };
      holds.set(key, h);
    }
    return h;
  };
  for (const r of inFlight) {
    const h = hold(r.userId, r.skuId);
    h.quantity += r.quantity;
    h.slots.set(r.slot, r.reservationId);
  }

  let orders = 0;
  let reserved = inFlight.reduce((n, r) => n + r.quantity, 0);
  let released = 0;
  for (let after = '0'; ;) {
    const page = await ordersForRestore(pool, t.activityId, after, PAGE);
    if (page.length === 0) break;
    after = page.at(-1)!.id;
    const p = redis.pipeline();
    for (const o of page) {
      orders += 1;
      reserved += o.quantity;
      const state = reservationState(o.status);
      if (state === 'RELEASED') released += o.quantity;
      p.hset(k.reservation(o.reservationId), {
        state,
        user: o.userId,
        sku: o.skuId,
        qty: o.quantity,
        slot: o.slot,
        price: o.unitPrice,
        name: o.itemName,
        ts: Math.round(o.reservedAtMs),
        trace: o.traceId,
      });
      // Every buyer with an order of the SKU is rewritten (a closed order's slot must not stay
      // taken in a cache that came back behind); a released unit still counts against the buyer
      // when released stock does not reopen slots.
      const h = hold(o.userId, o.skuId);
      if (state !== 'RELEASED' || !t.reopenOnRelease) h.quantity += o.quantity;
      if (state !== 'RELEASED') h.slots.set(o.slot, o.reservationId);
    }
    p.zrem(k.ledger, ...page.map((o) => o.reservationId));
    await p.exec();
  }

  // Each buyer's fields absolutely: slots of the SKU cleared, then the proven ones written.
  const buyerList = [...holds.values()];
  for (let i = 0; i < buyerList.length; i += PAGE) {
    const m = redis.multi();
    for (const h of buyerList.slice(i, i + PAGE)) {
      const limit = limits.get(h.skuId) ?? 0;
      const stale = Array.from({ length: limit }, (_, n) => `${h.skuId}:slot:${n + 1}`);
      if (stale.length > 0) m.hdel(k.buyer(h.userId), ...stale);
      const fields: Record<string, string | number> = { [`${h.skuId}:qty`]: h.quantity };
      for (const [slot, rid] of h.slots) fields[`${h.skuId}:slot:${slot}`] = rid;
      m.hset(k.buyer(h.userId), fields);
    }
    await m.exec();
  }

  const inFlightBySku = new Map<string, number>();
  for (const r of inFlight) inFlightBySku.set(r.skuId, (inFlightBySku.get(r.skuId) ?? 0) + r.quantity);
  const rows = skus.map((s) => {
    const flight = inFlightBySku.get(s.skuId) ?? 0;
    return {
      skuId: s.skuId,
      initial: s.stock,
      live: s.sold,
      inFlight: flight,
      remaining: Math.max(0, s.stock - s.sold - flight),
      limit: s.limitPerUser,
      price: s.unitPrice,
      name: s.itemName,
    };
  });
  const initialTotal = rows.reduce((n, r) => n + r.initial, 0);
  const chunks = Math.max(1, Math.ceil(rows.length / LOAD_CHUNK));
  for (let c = 0; c < chunks; c += 1) {
    const chunk = rows.slice(c * LOAD_CHUNK, (c + 1) * LOAD_CHUNK);
    const args: (string | number)[] = [
      t.epoch,
      t.generation,
      c === chunks - 1 ? '1' : '0',
      initialTotal,
      reserved,
      released,
      orders + inFlight.length,
    ];
    for (const r of chunk) args.push(r.skuId, r.initial, r.limit, r.price, r.name, r.remaining);
    await runScript(
      redis,
      'restoreStock',
      [k.meta, k.counters, k.skuIndex, ...chunk.map((r) => k.sku(r.skuId))],
      args,
    );
  }
  return {
    skus: rows.map(({ skuId, initial, live, inFlight: f, remaining }) => ({
      skuId,
      initial,
      live,
      inFlight: f,
      remaining,
    })),
    orders,
    buyers: holds.size,
  };
}

/** The epoch the cache carries (0: never restored, or empty). */
export async function cacheEpoch(redis: RedisClient, activityId: string): Promise<number> {
  return Number((await redis.hget(activityKeys(activityId).meta, 'epoch')) ?? 0);
}

/** When the cache was last restored (Redis clock, ms), if ever: the api's buyer view reads it. */
export async function restoredAt(redis: RedisClient, activityId: string): Promise<number | undefined> {
  const v = await redis.hget(activityKeys(activityId).meta, 'restoredAt');
  return v ? Number(v) : undefined;
}
