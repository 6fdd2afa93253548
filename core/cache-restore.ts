/**
 * Restoring an activity's Redis cache from PostgreSQL when Redis came back empty (a machine loss,
 * data files gone) or behind (a snapshot older than the last restore, or fewer units taken than
 * PostgreSQL holds as live orders) in the middle of a sale (docs/faults.md window 13). The
 * operator drives the steps (operator/reconcile/restore-cache.ts) and keeps their progress in
 * `cache_restores`; the functions here are the Redis and PostgreSQL work of each step, each
 * idempotent: every Redis write is an absolute value derived from PostgreSQL, fenced by the
 * restore's epoch: a repeat after a crash writes again from its own snapshot (reservations and
 * stock alike), and an earlier restore's epoch never overwrites a later one's mark.
 *
 * The epoch mark: the load script writes the cache's `gen` (absent in an empty Redis), and each
 * restore's reload writes `epoch` (lua/restoreStock-var.lua). PostgreSQL remembers the last epoch
 * reloaded; a cache carrying an older one came back from before that restore.
 */
import { LOAD_CHUNK } from './activity-cache.js';
import { BucketLayout, bucketLayout, bucketShare, forgetBucketLayout, unitsLeft } from './buckets.js';
import { readActivitySkus } from './db/activity-skus-store.js';
import type { ActivitySkuRow } from './db/activity-skus-store.js';
import type { RestoreDivergence, RestoreReason, RestoreReload } from './db/cache-restores-store.js';
import { PAID_STATUSES, findByReservationIds, ordersForRestore } from './db/orders-store.js';
import type { OrderStatus } from './db/orders-store.js';
import { inReadSnapshot } from './db/pool.js';
import type { Pool, Queryable } from './db/pool.js';
import { cancellationsBeforeReservation } from './db/journal-store.js';
import { registeredBuyers } from './db/registrations-store.js';
import { BucketKeys, activityKeys, groupByScope } from './keys.js';
import type { ScopeKeys } from './keys.js';
import { CLAIM_STATE } from './order-message.js';
import { confirmPaid, readReservation, restoreCancelMarker } from './reservations.js';
import type { ReservationRecord } from './reservations.js';
import type { RedisClient } from './scripts.js';
import { runScript } from './scripts.js';
import { ELIGIBILITY_FIELDS, writeBuyerFlags } from './traffic-policy.js';

/** What the operator knows about the activity that an empty cache has forgotten. */
export interface RestoreTarget {
  activityId: string;
  epoch: number;
  /** The generation that was loaded (status.cache.loadedGeneration). */
  generation: number;
  /** The sale window of that generation (activity_registry, which records it after each load). */
  startMs: number;
  endMs: number;
  requireOrderCode: boolean;
  reopenOnRelease: boolean;
  ownerUid: string;
  /**
   * The bucket count of each bucketed SKU as the resource fixes it (sku id -> count >= 2): an
   * empty cache has forgotten its layout, and the api and relay expect the bucket scopes back.
   */
  buckets?: ReadonlyMap<string, number>;
}

export type CacheCheck =
  | { kind: 'consistent'; divergence: RestoreDivergence }
  | { kind: RestoreReason; divergence: RestoreDivergence };

async function measure(
  redis: RedisClient,
  pool: Pool,
  activityId: string,
  expectedEpoch: number,
  expectedGeneration: number,
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
  // A bucketed SKU's units are in its buckets (its activity-scope hash holds none): the units it
  // has taken are its buckets' initial stock less what their counters leave, which transfers in
  // flight between two buckets do not change (core/buckets.ts unitsLeft).
  const layout = await bucketLayout(redis, activityId, { refresh: true });
  const bucketTaken = new Map<string, number | null>();
  for (const s of skus) {
    const buckets = layout.bucketsOf(s.skuId);
    if (buckets.length === 0) continue;
    const initials = await Promise.all(buckets.map((b) => redis.hget(b.sku(s.skuId), 'initial')));
    const left = await unitsLeft(redis, layout, s.skuId);
    bucketTaken.set(
      s.skuId,
      initials.some((v) => v === null) ? null : initials.reduce((n, v) => n + Number(v), 0) - left,
    );
  }
  const divergence: RestoreDivergence = {
    redis: meta.gate
      ? { present: true, generation: Number(meta.gen ?? 0), epoch: Number(meta.epoch ?? 0) }
      : { present: false },
    expectedEpoch,
    skus: skus.map((s, i) => {
      const [initial, stock] = (replies[i]?.[1] as (string | null)[] | undefined) ?? [];
      const taken = bucketTaken.has(s.skuId)
        ? bucketTaken.get(s.skuId)!
        : initial == null || stock == null
          ? null
          : Number(initial) - Number(stock);
      return { skuId: s.skuId, redisTaken: taken, postgresLive: live.get(s.skuId) ?? 0 };
    }),
  };
  if (!meta.gate || !meta.gen) return { kind: 'CacheEmpty', divergence };
  if (Number(meta.epoch ?? 0) < expectedEpoch) return { kind: 'CacheBehind', divergence };
  // A Redis that came back from a snapshot (or a lagging replica) taken before the last load of a
  // spec generation: what that generation added (stock, items, a later endAt) is gone from it.
  if (Number(meta.gen) < expectedGeneration) return { kind: 'CacheBehind', divergence };
  // A SKU PostgreSQL knows and the cache never listed, with nothing sold: an item added by a spec
  // edit whose load did not finish (sync-spec records the SKU before it loads it). Not a cache
  // that lost anything: the next load writes it, and a restore would pause a healthy sale.
  const unlisted = divergence.skus.filter((s) => s.redisTaken === null && s.postgresLive === 0);
  const listed =
    unlisted.length > 0 ? await redis.smismember(k.skuIndex, ...unlisted.map((s) => s.skuId)) : [];
  const notLoaded = new Set(unlisted.filter((_, i) => listed[i] === 0).map((s) => s.skuId));
  const behind = divergence.skus.some(
    (s) =>
      (s.redisTaken === null && !notLoaded.has(s.skuId)) ||
      (s.redisTaken !== null && s.postgresLive > s.redisTaken),
  );
  return { kind: behind ? 'CacheBehind' : 'consistent', divergence };
}

/** Above this many SKUs, checkCache compares marks only (see there). */
export const UNIT_CHECK_MAX_SKUS = 5000;

/**
 * Whether the cache still holds what PostgreSQL proves was sold: empty (no meta, or a meta the
 * restore's hold wrote with no load mark), behind (an epoch older than `expectedEpoch`, a load
 * mark `gen` older than `expectedGeneration` (the generation the operator recorded as loaded,
 * status.cache.loadedGeneration), or a SKU with fewer units taken in Redis than PostgreSQL's live
 * units), or consistent. A unit count divergence is measured twice, `remeasureMs` apart, and
 * reported only when both measurements show it: a release between the two reads (PostgreSQL
 * closes, then Redis returns the unit) can make one measurement look behind.
 */
export async function checkCache(
  redis: RedisClient,
  pool: Pool,
  activityId: string,
  expectedEpoch: number,
  remeasureMs = 1000,
  expectedGeneration = 0,
): Promise<CacheCheck> {
  // The unit comparison reads every SKU; an activity above UNIT_CHECK_MAX_SKUS is checked by its
  // marks only (empty, older epoch, older generation) on each pass, which keeps a pass cheap for
  // huge catalogs.
  const k = activityKeys(activityId);
  const [gen, epoch, skuCount] = await Promise.all([
    redis.hget(k.meta, 'gen'),
    redis.hget(k.meta, 'epoch'),
    redis.scard(k.skuIndex),
  ]);
  if (
    gen &&
    Number(epoch ?? 0) >= expectedEpoch &&
    Number(gen) >= expectedGeneration &&
    skuCount > UNIT_CHECK_MAX_SKUS
  ) {
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
    expectedGeneration,
    await readActivitySkus(pool, activityId),
  );
  if (first.kind !== 'CacheBehind' || !first.divergence.redis.present) return first;
  // The marks are not a race: behind by a mark is behind at once.
  if ((first.divergence.redis.epoch ?? 0) < expectedEpoch) return first;
  if ((first.divergence.redis.generation ?? 0) < expectedGeneration) return first;
  await new Promise((r) => setTimeout(r, remeasureMs));
  return measure(
    redis,
    pool,
    activityId,
    expectedEpoch,
    expectedGeneration,
    await readActivitySkus(pool, activityId),
  );
}

/**
 * Step 1: keeps buyers out (gate `paused`; an empty cache gets a meta hash holding only that) and
 * puts back the sale window of the generation that was loaded (`startMs`/`endMs`: a cache that came
 * back behind may hold an older generation's, e.g. without an endAt extension already applied).
 */
export async function holdForRestore(redis: RedisClient, t: RestoreTarget): Promise<string> {
  const args = [
    t.epoch,
    t.startMs,
    t.endMs,
    t.requireOrderCode ? '1' : '0',
    t.reopenOnRelease ? '1' : '0',
    t.ownerUid,
  ];
  // Every bucket too (each bucket's reserve script reads its own gate), before the activity's.
  const layout = await restoreLayout(redis, t);
  await Promise.all(layout.allBuckets().map((b) => runScript(redis, 'holdForRestore', [b.meta], args)));
  const k = activityKeys(t.activityId);
  const r = await runScript(redis, 'holdForRestore', [k.meta], args);
  // An activity meta hash that came back empty (on a cluster, only the activity's node may lose
  // its data) no longer names the buckets, whose outboxes may still hold half messages: the relay,
  // the half-message gauge and gap repair find their streams from it, and this restore waits for
  // those outboxes to drain. Named again here, as the load had them (HSET only on the hash the
  // hold just wrote or found).
  if (layout.counts.size > 0)
    await redis.hset(
      k.meta,
      Object.fromEntries([...layout.counts].map(([sku, n]) => [k.bucketField(sku), String(n)])),
    );
  return String(r[1]);
}

/**
 * Lifts the restore's hold mark (`restoring`) from the activity's meta hash and every bucket's,
 * before the gate opens. The reload lifts each mark as it rewrites a scope; this lifts any left
 * (a scope a repeated hold marked again that no reload rewrote, an earlier version's reload that
 * skipped a scope already marked with the epoch): left, a bucket's mark refuses its stock
 * transfers (its units stranded, buyers whose bucket is empty told the sale is paused) and the
 * activity's late in-time payments, for the rest of the sale. Idempotent; HDEL creates no key.
 */
export async function endHold(redis: RedisClient, t: RestoreTarget): Promise<void> {
  const layout = await restoreLayout(redis, t);
  await Promise.all(layout.allBuckets().map((b) => redis.hdel(b.meta, 'restoring')));
  await redis.hdel(activityKeys(t.activityId).meta, 'restoring');
}

/**
 * The bucket layout a restore rebuilds: the resource's (fixed once warm-up began), with any
 * bucketed SKU a cache that came back behind still names.
 */
async function restoreLayout(redis: RedisClient, t: RestoreTarget): Promise<BucketLayout> {
  const counts = new Map(t.buckets ?? []);
  for (const [sku, n] of (await bucketLayout(redis, t.activityId, { refresh: true })).counts) {
    if (!counts.has(sku)) counts.set(sku, n);
  }
  return new BucketLayout(t.activityId, counts);
}

/**
 * Half messages still in the cache's outboxes, the activity's and every stock bucket's (the relay
 * empties them while the gate is paused). A bucket on a node that kept its data still holds
 * entries the relay has not sent: reloaded before they reach PostgreSQL, each would count once as
 * in flight and again as an order.
 */
export async function outboxLength(redis: RedisClient, t: RestoreTarget): Promise<number> {
  const layout = await restoreLayout(redis, t);
  const lengths = await Promise.all(layout.allScopes().map((scope) => redis.xlen(scope.outbox)));
  return lengths.reduce((n, l) => n + l, 0);
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
 * orders − reservations still in flight (in a ledger, `RESERVED`, no order: only a cache that
 * came back behind has any), and last the epoch mark. Nothing opens the gate here. Everything it
 * reads from PostgreSQL comes from one snapshot (a REPEATABLE READ, READ ONLY transaction on one
 * pooled connection; the pool's statement and query timeouts apply to each read).
 *
 * A bucketed SKU is rebuilt as the warm-up laid it out (ARCHITECTURE.md "Stock buckets"): each
 * reservation and buyer slot in the buyer's home bucket, each bucket's share of the remaining
 * units (lua/restoreBucket-5.lua, fenced by the epoch on the bucket's meta), then the layout (the
 * meta's `bucket:<sku>` and the SKU hash's `buckets`), then the activity's epoch mark. Each bucket
 * reservation's claim of its id in the activity's scope is written back with it.
 *
 * Every pre-registered buyer (PostgreSQL's `activity_registrations`) is flagged again (`~reg`) in
 * every scope they may reserve in, and named in the `registered` set: registration closes at
 * startAt, so a buyer whose flag the lost cache took along could not register again.
 */
export async function reloadFromPostgres(
  redis: RedisClient,
  pool: Pool,
  t: RestoreTarget,
  maxLedger = 100_000,
): Promise<RestoreReload> {
  // Every PostgreSQL read of the reload sees one snapshot: the sweeper, cancellations and payments
  // go on while it reads, and each SKU's live count must be the one its orders' pages add up to.
  // Read at different moments, an order closed in between would be rebuilt RELEASED while its unit
  // is counted held (its release after the resume finds it released: the unit lost), or one
  // reopened in between counted free while its reservation is PAID. An order that changes after
  // the snapshot is rebuilt as it was before; its settlement or payment follows the resume as on a
  // live cache. Read only: nothing to undo when the reload dies midway (a repeat reads anew).
  const { reload, rebuiltReserved } = await inReadSnapshot(pool, (c) =>
    reloadFromSnapshot(redis, c, t, maxLedger),
  );
  return { ...reload, paidDuringReload: await markPaidSinceSnapshot(redis, pool, t, rebuiltReserved) };
}

/**
 * The reservations the reload wrote `RESERVED` (their orders `UNPAID` in its snapshot) whose
 * orders are paid now are marked `PAID`, as the payment itself marks them on a live cache: a
 * payment committed after the snapshot found no reservation to mark while the cache was empty
 * (runtime/payments/apply.ts takes `UNKNOWN_RESERVATION` as a cache PostgreSQL holds alone), and
 * without the mark Redis' own guard (release-6.lua's `ALREADY_PAID`) would not stand between a
 * racing release and the sold unit. Read after every reservation is written: a payment that
 * commits later finds its reservation and marks it itself. Idempotent (confirmPaid-2.lua).
 */
async function markPaidSinceSnapshot(
  redis: RedisClient,
  pool: Pool,
  t: RestoreTarget,
  reservationIds: string[],
): Promise<number> {
  let marked = 0;
  for (let i = 0; i < reservationIds.length; i += PAGE) {
    for (const o of await findByReservationIds(pool, reservationIds.slice(i, i + PAGE))) {
      if (o.activityId !== t.activityId || !PAID_STATUSES.includes(o.status)) continue;
      const owner = { userId: o.userId, skuId: o.skuId };
      if ((await confirmPaid(redis, t.activityId, o.reservationId, owner)) === 'paid') marked += 1;
    }
  }
  return marked;
}

async function reloadFromSnapshot(
  redis: RedisClient,
  db: Queryable,
  t: RestoreTarget,
  maxLedger: number,
): Promise<{ reload: Omit<RestoreReload, 'paidDuringReload'>; rebuiltReserved: string[] }> {
  const k = activityKeys(t.activityId);
  const skus = await readActivitySkus(db, t.activityId);
  if (skus.length === 0)
    throw new Error(`activity ${t.activityId} has no activity_skus rows to restore from`);
  const limits = new Map(skus.map((s) => [s.skuId, s.limitPerUser]));
  const layout = await restoreLayout(redis, t);

  // Reservations in flight that the cache can still prove (a cache that came back behind), in
  // every ledger: the activity's and each bucket's.
  const ledgers = await Promise.all(
    layout
      .allScopes()
      .map(async (scope) => ({ scope, ids: await redis.zrange(scope.ledger, 0, maxLedger - 1) })),
  );
  const ordered = new Set(
    (
      await findByReservationIds(
        db,
        ledgers.flatMap((l) => l.ids),
      )
    ).map((o) => o.reservationId),
  );
  const inFlight: ReservationRecord[] = [];
  for (const { scope, ids } of ledgers) {
    for (const rid of ids) {
      if (ordered.has(rid)) continue;
      const r = await readReservation(redis, t.activityId, rid, scope);
      if (r?.state === 'RESERVED' && limits.has(r.skuId)) inFlight.push(r);
    }
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
  // Counter figures per scope and SKU (a bucket's counters carry its home buyers' reservations).
  const figures = new Map<string, Figures>();
  const figure = (scope: ScopeKeys, skuId: string): Figures => {
    const key = `${scope.prefix}\n${skuId}`;
    let f = figures.get(key);
    if (!f) {
      f = { reserved: 0, released: 0, reservations: 0 };
      figures.set(key, f);
    }
    return f;
  };
  for (const r of inFlight) {
    const h = hold(r.userId, r.skuId);
    h.quantity += r.quantity;
    h.slots.set(r.slot, r.reservationId);
    const f = figure(layout.scopeFor(r.skuId, r.userId), r.skuId);
    f.reserved += r.quantity;
    f.reservations += 1;
  }

  await writeClaims(
    redis,
    k,
    inFlight.filter((r) => layout.scopeFor(r.skuId, r.userId) instanceof BucketKeys),
  );

  let orders = 0;
  const rebuiltReserved: string[] = [];
  for (let after = '0'; ;) {
    const page = await ordersForRestore(db, t.activityId, after, PAGE);
    if (page.length === 0) break;
    after = page.at(-1)!.id;
    // One pipeline per scope: a cluster runs a pipeline within one slot's node only.
    for (const { scope, items: group } of groupByScope(page, (o) => layout.scopeFor(o.skuId, o.userId))) {
      const p = redis.pipeline();
      for (const o of group) {
        orders += 1;
        const state = reservationState(o.status);
        const f = figure(scope, o.skuId);
        f.reserved += o.quantity;
        f.reservations += 1;
        if (state === 'RELEASED') f.released += o.quantity;
        if (state === 'RESERVED') rebuiltReserved.push(o.reservationId);
        p.hset(scope.reservation(o.reservationId), {
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
        // taken in a cache that came back behind); a released unit still counts against the
        // buyer when released stock does not reopen slots.
        const h = hold(o.userId, o.skuId);
        if (state !== 'RELEASED' || !t.reopenOnRelease) h.quantity += o.quantity;
        if (state !== 'RELEASED') h.slots.set(o.slot, o.reservationId);
      }
      p.zrem(scope.ledger, ...group.map((o) => o.reservationId));
      await p.exec();
      if (scope instanceof BucketKeys) await writeClaims(redis, k, group);
    }
  }

  // Each buyer's fields absolutely, in the buyer's home scope of the SKU: slots of the SKU
  // cleared, then the proven ones written. One transaction per scope (one slot each).
  for (const { scope, items: list } of groupByScope(holds.values(), (h) =>
    layout.scopeFor(h.skuId, h.userId),
  )) {
    for (let i = 0; i < list.length; i += PAGE) {
      const m = redis.multi();
      for (const h of list.slice(i, i + PAGE)) {
        const limit = limits.get(h.skuId) ?? 0;
        const stale = Array.from({ length: limit }, (_, n) => `${h.skuId}:slot:${n + 1}`);
        if (stale.length > 0) m.hdel(scope.buyer(h.userId), ...stale);
        const fields: Record<string, string | number> = { [`${h.skuId}:qty`]: h.quantity };
        for (const [slot, rid] of h.slots) fields[`${h.skuId}:slot:${slot}`] = rid;
        m.hset(scope.buyer(h.userId), fields);
      }
      await m.exec();
    }
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

  // Bucketed SKUs first: each bucket's share, then the layout that sends buyers to them.
  for (const r of rows) {
    const buckets = layout.bucketsOf(r.skuId);
    if (buckets.length === 0) continue;
    await Promise.all(
      buckets.map((b) => {
        const f = figures.get(`${b.prefix}\n${r.skuId}`) ?? { reserved: 0, released: 0, reservations: 0 };
        return runScript(
          redis,
          'restoreBucket',
          [b.meta, b.counters, b.skuIndex, b.sku(r.skuId), b.transfers],
          [
            t.epoch,
            t.generation,
            r.skuId,
            bucketShare(r.initial, b.index, buckets.length),
            r.limit,
            r.price,
            r.name,
            bucketShare(r.remaining, b.index, buckets.length),
            f.reserved,
            f.released,
            f.reservations,
          ],
        );
      }),
    );
    // Absolute values the resource fixes once warm-up began: a repeat writes the same.
    await redis.hset(k.meta, k.bucketField(r.skuId), String(buckets.length));
    await redis.hset(k.sku(r.skuId), 'buckets', String(buckets.length));
  }

  await reflagRegistrations(redis, db, layout);
  await remarkCancellations(redis, db, layout);

  // The activity's own scope: a bucketed SKU's hash holds no units (as loaded), and its counters
  // only the figures of the SKUs that are not bucketed.
  const own = rows.map((r) => (layout.countOf(r.skuId) > 1 ? { ...r, initial: 0, remaining: 0 } : r));
  const ownFigures = own
    .filter((r) => layout.countOf(r.skuId) <= 1)
    .map((r) => figures.get(`${k.prefix}\n${r.skuId}`) ?? { reserved: 0, released: 0, reservations: 0 });
  const initialTotal = own.reduce((n, r) => n + r.initial, 0);
  const reserved = ownFigures.reduce((n, f) => n + f.reserved, 0);
  const released = ownFigures.reduce((n, f) => n + f.released, 0);
  const reservations = ownFigures.reduce((n, f) => n + f.reservations, 0);
  const chunks = Math.max(1, Math.ceil(own.length / LOAD_CHUNK));
  for (let c = 0; c < chunks; c += 1) {
    const chunk = own.slice(c * LOAD_CHUNK, (c + 1) * LOAD_CHUNK);
    const args: (string | number)[] = [
      t.epoch,
      t.generation,
      c === chunks - 1 ? '1' : '0',
      initialTotal,
      reserved,
      released,
      reservations,
    ];
    for (const r of chunk) args.push(r.skuId, r.initial, r.limit, r.price, r.name, r.remaining);
    await runScript(
      redis,
      'restoreStock',
      [k.meta, k.counters, k.skuIndex, ...chunk.map((r) => k.sku(r.skuId))],
      args,
    );
  }
  // This process's remembered layout may be the empty one of the hold's meta.
  forgetBucketLayout(t.activityId);
  return {
    reload: {
      skus: rows.map(({ skuId, initial, live, inFlight: f, remaining }) => ({
        skuId,
        initial,
        live,
        inFlight: f,
        remaining,
      })),
      orders,
      buyers: holds.size,
    },
    rebuiltReserved,
  };
}

/**
 * The registered buyers' flags in the activity's scope and their home bucket of every bucketed
 * SKU (BucketLayout.scopesForUser), and the `registered` set a later load's buckets read; page by
 * page from PostgreSQL. Absolute (a flag and a set member), so a repeat writes the same.
 */
async function reflagRegistrations(redis: RedisClient, db: Queryable, layout: BucketLayout): Promise<void> {
  const k = layout.keys;
  for (let after = ''; ;) {
    const users = await registeredBuyers(db, layout.activityId, after, PAGE);
    if (users.length === 0) break;
    after = users.at(-1)!;
    await redis.sadd(k.registered, ...users);
    await writeBuyerFlags(
      redis,
      users.flatMap((u) => layout.scopesForUser(u).map((scope) => [scope, u] as const)),
      ELIGIBILITY_FIELDS.registered,
      true,
    );
  }
}

/**
 * The buyers' cancellations that arrived before their submissions (cancel markers, which only
 * Redis held), from the journal, in every scope the buyer may reserve in: without them a late
 * submission, or a client's retry, of a cancelled request would reserve after the resume, an
 * order the buyer cancelled. Written after the reservations, so a marker never stands in for one.
 */
async function remarkCancellations(redis: RedisClient, db: Queryable, layout: BucketLayout): Promise<void> {
  for (let after = '0'; ;) {
    const page = await cancellationsBeforeReservation(db, layout.activityId, after, PAGE);
    if (page.length === 0) break;
    after = page.at(-1)!.id;
    for (const c of page)
      await restoreCancelMarker(redis, layout.scopesForUser(c.userId), c.reservationId, c.userId);
  }
}

/**
 * The claims in the activity's own scope of reservations made in a stock bucket
 * (lua/claimRequest-2.lua): without them a requestId that reserved in a bucket before the loss
 * could reserve again under the same id in another scope once the sale resumes. Absolute, like
 * every write of the reload (the gate is paused: no submission claims meanwhile).
 */
async function writeClaims(
  redis: RedisClient,
  k: ScopeKeys,
  reservations: { reservationId: string; userId: string; skuId: string; quantity: number }[],
): Promise<void> {
  if (reservations.length === 0) return;
  const p = redis.pipeline();
  for (const r of reservations)
    p.hset(k.reservation(r.reservationId), {
      state: CLAIM_STATE,
      sku: r.skuId,
      qty: r.quantity,
      user: r.userId,
      // The reservation exists: no refused attempt may take this claim back (unclaimRequest-1.lua).
      held: 1,
    });
  await p.exec();
}

interface Figures {
  reserved: number;
  released: number;
  reservations: number;
}

/** The generation the cache carries as loaded (its load mark `gen`; 0: empty or never loaded). */
export async function cacheGeneration(redis: RedisClient, activityId: string): Promise<number> {
  return Number((await redis.hget(activityKeys(activityId).meta, 'gen')) ?? 0);
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
