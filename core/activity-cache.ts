/**
 * The activity's state in Redis as the operator and the runtime roles see it: cache loading,
 * the gate, stock and outbox figures, buyer results, one-time order codes, and cleanup.
 */
import { randomBytes } from 'node:crypto';
import { bucketLayout, bucketShare, forgetBucketLayout, unitsInFlight } from './buckets.js';
import type { BucketLayout } from './buckets.js';
import { FlashSaleError } from './errors.js';
import { activityKeys, homeBucket } from './keys.js';
import type { ActivityKeys, ScopeKeys } from './keys.js';
import type { ActivityDefinition, CatalogItem, GateState, ReservationResult } from './model.js';
import { isCluster, primariesOf } from './redis.js';
import type { RedisClient } from './scripts.js';
import { runScript } from './scripts.js';
import { ELIGIBILITY_FIELDS, writeBuyerFlags } from './traffic-policy.js';

/** SKUs per script call while loading: keeps each call well under a few milliseconds. */
export const LOAD_CHUNK = 2000;

/**
 * Chunks in flight at once while loading. A few keep Redis busy while the next chunk is encoded;
 * sending every chunk at once makes Redis wait until all of them are built (an auto-pipelined
 * client writes them in one go) and holds every chunk's arguments in memory together
 * (docs/benchmarks.md, warm-up).
 */
export const LOAD_WINDOW = 4;

export interface LoadOutcome {
  created: number;
  topped: number;
  skipped: number;
  stockAdded: number;
}

/**
 * Loads (or tops up) the activity's items and stock, fenced by generation: repeating a load of
 * the same generation changes nothing, so an operator that crashed mid-load simply runs it again.
 */
export async function loadActivity(redis: RedisClient, a: ActivityDefinition): Promise<LoadOutcome> {
  const k = activityKeys(a.id);
  const total: LoadOutcome = { created: 0, topped: 0, skipped: 0, stockAdded: 0 };
  const bucketed = a.items.filter((i) => (i.buckets ?? 1) > 1);
  const bucketStock = bucketed.length > 0 ? await loadBuckets(redis, a, bucketed) : 0;
  // A bucketed SKU's own hash (activity scope) holds no units: its stock is in its buckets.
  const items = a.items.map((i): CatalogItem => ((i.buckets ?? 1) > 1 ? { ...i, stock: 0 } : i));
  const chunks = Math.max(1, Math.ceil(a.items.length / LOAD_CHUNK));
  const load = async (c: number): Promise<void> => {
    const chunk = items.slice(c * LOAD_CHUNK, (c + 1) * LOAD_CHUNK);
    const keys = [k.meta, k.counters, k.skuIndex, ...chunk.map((i) => k.sku(i.skuId))];
    const args: (string | number)[] = [
      a.generation,
      a.startAt.getTime(),
      a.endAt.getTime(),
      a.requireOrderCode ? '1' : '0',
      a.reopenOnRelease ? '1' : '0',
      c === chunks - 1 ? '1' : '0',
    ];
    for (const i of chunk) args.push(i.skuId, i.stock, i.limitPerUser, i.price, i.name);
    const r = await runScript(redis, 'loadItems', keys, args);
    total.created += Number(r[1]);
    total.topped += Number(r[2]);
    total.skipped += Number(r[3]);
    total.stockAdded += Number(r[4]);
  };
  // All chunks but the last are sent a window at a time (one connection keeps them in order). The
  // last chunk marks the generation loaded, so it goes only after every other chunk succeeded; on
  // a refusal no further chunk is sent and the load stops there, as before, and a repeat of the
  // load is idempotent.
  let next = 0;
  let failure: { reason: unknown } | undefined;
  const sender = async (): Promise<void> => {
    while (failure === undefined && next < chunks - 1) {
      const c = next;
      next += 1;
      await load(c).catch((reason: unknown) => {
        failure ??= { reason };
      });
    }
  };
  await Promise.all(Array.from({ length: Math.min(LOAD_WINDOW, chunks - 1) }, sender));
  if (failure) throw failure.reason;
  await load(chunks - 1);
  total.stockAdded += bucketStock;
  forgetBucketLayout(a.id);
  return total;
}

/**
 * Loads each bucket of the bucketed SKUs as a scope of its own (loadItems-var.lua on the bucket's
 * keys: the same generation fence, the bucket's share of the stock, which only grows), copies the
 * activity's gate and registration requirement into it, flags the buyers the deny list named and
 * the buyers who registered (the activity's `denied` and `registered` sets) in their home buckets,
 * then records the layout: the meta field `bucket:<sku>` and the SKU's activity-scope hash field
 * `buckets` (which makes reserve-9.lua send a stale caller to the buckets). The layout is written
 * after the buckets, so a caller that sees it finds them loaded and its buyers flagged.
 */
async function loadBuckets(redis: RedisClient, a: ActivityDefinition, items: CatalogItem[]): Promise<number> {
  const k = activityKeys(a.id);
  let added = 0;
  const gate = await redis.hget(k.meta, 'gate');
  const requireReg = await redis.hget(k.meta, 'requireReg');
  for (const item of items) {
    const n = item.buckets!;
    await Promise.all(
      Array.from({ length: n }, async (_, i) => {
        const b = k.bucket(item.skuId, i, n);
        const r = await runScript(
          redis,
          'loadItems',
          [b.meta, b.counters, b.skuIndex, b.sku(item.skuId)],
          [
            a.generation,
            a.startAt.getTime(),
            a.endAt.getTime(),
            a.requireOrderCode ? '1' : '0',
            a.reopenOnRelease ? '1' : '0',
            '1',
            item.skuId,
            bucketShare(item.stock, i, n),
            item.limitPerUser,
            item.price,
            item.name,
          ],
        );
        added += Number(r[4]);
        if (gate && gate !== 'pending') await runScript(redis, 'setGate', [b.meta], [gate]);
        if (requireReg) await redis.hset(b.meta, 'requireReg', requireReg);
      }),
    );
    // Buyers the deny list named and buyers who registered before the buckets existed
    // (traffic-policy.ts flags the buckets of later ones itself).
    const flagged = await flagHomeBuckets(redis, a.id, item.skuId, n);
    await redis.hset(k.meta, k.bucketField(item.skuId), String(n));
    await redis.hset(k.sku(item.skuId), 'buckets', String(n));
    // A buyer who registered while the buckets were flagged read a layout without this SKU
    // (registerBuyer adds the buyer to the set before it reads the layout): flagged now.
    await flagHomeBuckets(redis, a.id, item.skuId, n, flagged);
  }
  return added;
}

/** The buyers a set names, read with SSCAN (a registration set can be large: no SMEMBERS). */
async function setMembers(redis: RedisClient, key: string): Promise<Set<string>> {
  const members = new Set<string>();
  let cursor = '0';
  do {
    const [next, batch] = await redis.sscan(key, cursor, 'COUNT', 1000);
    cursor = next;
    for (const m of batch) members.add(m);
  } while (cursor !== '0');
  return members;
}

interface FlaggedBuyers {
  denied: Set<string>;
  registered: Set<string>;
}

/**
 * Flags the buyers of the activity's `denied` and `registered` sets in their home buckets of a
 * bucketed SKU (`~deny`, `~reg`), but those `done` already flagged; returns the sets as read.
 */
async function flagHomeBuckets(
  redis: RedisClient,
  activityId: string,
  skuId: string,
  n: number,
  done?: FlaggedBuyers,
): Promise<FlaggedBuyers> {
  const k = activityKeys(activityId);
  const [denied, registered] = await Promise.all([
    setMembers(redis, k.denied),
    setMembers(redis, k.registered),
  ]);
  const home = (users: Set<string>, skip: Set<string> | undefined) =>
    [...users]
      .filter((u) => !skip?.has(u))
      .map((u) => [k.bucket(skuId, homeBucket(activityId, skuId, u, n), n), u] as const);
  await writeBuyerFlags(redis, home(denied, done?.denied), ELIGIBILITY_FIELDS.denied, true);
  await writeBuyerFlags(redis, home(registered, done?.registered), ELIGIBILITY_FIELDS.registered, true);
  return { denied, registered };
}

export interface CacheMeta {
  gate: GateState;
  generation: number;
  loads: number;
  startMs: number;
  endMs: number;
  requireOrderCode: boolean;
  reopenOnRelease: boolean;
  /** When cleanupActivity began deleting the keys (ms), if it has: what is left is partial. */
  cleanupBeganMs?: number | undefined;
}

export async function readMeta(redis: RedisClient, activityId: string): Promise<CacheMeta | undefined> {
  const m = await redis.hgetall(activityKeys(activityId).meta);
  if (!m.gate) return undefined;
  return {
    gate: m.gate as GateState,
    generation: Number(m.gen ?? 0),
    loads: Number(m.loads ?? 0),
    startMs: Number(m.startMs ?? 0),
    endMs: Number(m.endMs ?? 0),
    requireOrderCode: m.requireCode === '1',
    reopenOnRelease: m.reopen === '1',
    ...(m.cleanupBegan ? { cleanupBeganMs: Number(m.cleanupBegan) } : {}),
  };
}

/**
 * Records `uid` as the owner of the activity's cache (the meta hash's `owner`) unless one is
 * recorded already, and returns the recorded owner; `loadedBefore` tells that a cache was loaded
 * before any owner was recorded (an activity older than ownership records).
 */
export async function claimCacheOwner(
  redis: RedisClient,
  activityId: string,
  uid: string,
): Promise<{ owner: string; loadedBefore: boolean }> {
  const k = activityKeys(activityId);
  const [[, set], [, fields]] = (await redis
    .multi()
    .hsetnx(k.meta, 'owner', uid)
    .hmget(k.meta, 'owner', 'gate')
    .exec()) as [[null, number], [null, (string | null)[]]];
  const [owner, gate] = fields;
  return { owner: owner ?? uid, loadedBefore: set === 1 && gate !== null && gate !== undefined };
}

/**
 * Moves the gate of the activity and of every stock bucket (each bucket's reserve script reads its
 * own copy). The buckets move first: once `frozen` is answered, no bucket takes a reservation or a
 * transfer any more (write-back reads the snapshot after it). A repeat after a crash moves the
 * ones left.
 */
export async function setGate(redis: RedisClient, activityId: string, gate: GateState): Promise<GateState> {
  const layout = await bucketLayout(redis, activityId);
  await Promise.all(layout.allBuckets().map((b) => runScript(redis, 'setGate', [b.meta], [gate])));
  const r = await runScript(redis, 'setGate', [activityKeys(activityId).meta], [gate]);
  return String(r[1]) as GateState;
}

/**
 * How many of the activity's stock buckets have a gate other than `gate`: a setGate that stopped
 * half-way (a crash, a node that did not answer) moved some buckets and not the activity, whose
 * gate alone then no longer tells whether every bucket follows it.
 */
export async function bucketsNotAt(redis: RedisClient, activityId: string, gate: GateState): Promise<number> {
  const layout = await bucketLayout(redis, activityId);
  const gates = await Promise.all(layout.allBuckets().map((b) => redis.hget(b.meta, 'gate')));
  return gates.filter((g) => g !== null && g !== gate).length;
}

/**
 * How many of the activity's stock buckets have lost their meta hash (a node restarted without its
 * data): their stock is unknown, so nothing can be written back for them.
 */
export async function bucketsLost(redis: RedisClient, activityId: string): Promise<number> {
  const layout = await bucketLayout(redis, activityId);
  const present = await Promise.all(layout.allBuckets().map((b) => redis.exists(b.meta)));
  return present.filter((n) => n === 0).length;
}

/**
 * Whether the meta hash of the scope a buyer's reservation of a SKU lives in is there: the
 * activity's, or on a cluster the stock bucket's, whose node alone can come back empty.
 */
export async function scopeLoaded(
  redis: RedisClient,
  activityId: string,
  skuId: string,
  userId: string,
): Promise<boolean> {
  const scope = (await bucketLayout(redis, activityId)).scopeFor(skuId, userId);
  return (await redis.exists(scope.meta)) === 1;
}

export interface SkuStock {
  skuId: string;
  initial: number;
  remaining: number;
}

export interface StockFigures {
  skus: SkuStock[];
  initial: number;
  remaining: number;
  /** Quantities reserved and released since loading (from the counters hash). */
  reserved: number;
  released: number;
  reservations: number;
}

/**
 * Stock and counters of the activity, every stock bucket included: a bucketed SKU's figures are
 * the sums over its buckets, plus (as remaining) the units of transfers in flight between them.
 */
export async function readStock(redis: RedisClient, activityId: string): Promise<StockFigures> {
  const layout = await bucketLayout(redis, activityId);
  const bySku = new Map<string, SkuStock>();
  let reserved = 0;
  let released = 0;
  let reservations = 0;
  // One pipeline per scope: a cluster runs a pipeline only within one slot.
  const scopes = await Promise.all(layout.allScopes().map((k) => readScopeStock(redis, k)));
  for (const sc of scopes) {
    for (const s of sc.skus) {
      const sum = bySku.get(s.skuId) ?? { skuId: s.skuId, initial: 0, remaining: 0 };
      sum.initial += s.initial;
      sum.remaining += s.remaining;
      bySku.set(s.skuId, sum);
    }
    reserved += Number(sc.counters.reserved ?? 0);
    released += Number(sc.counters.released ?? 0);
    reservations += Number(sc.counters.reservations ?? 0);
  }
  for (const sku of layout.counts.keys()) {
    const sum = bySku.get(sku);
    if (sum) sum.remaining += await unitsInFlight(redis, layout, sku);
  }
  const skus = [...bySku.values()].sort((a, b) => (a.skuId < b.skuId ? -1 : a.skuId > b.skuId ? 1 : 0));
  return {
    skus,
    initial: skus.reduce((n, s) => n + s.initial, 0),
    remaining: skus.reduce((n, s) => n + s.remaining, 0),
    reserved,
    released,
    reservations,
  };
}

async function readScopeStock(
  redis: RedisClient,
  k: ScopeKeys,
): Promise<{ skus: SkuStock[]; counters: Record<string, string> }> {
  const skuIds = (await redis.smembers(k.skuIndex)).sort();
  const pipeline = redis.pipeline();
  for (const s of skuIds) pipeline.hmget(k.sku(s), 'initial', 'stock');
  pipeline.hgetall(k.counters);
  const replies = (await pipeline.exec()) ?? [];
  const skus: SkuStock[] = skuIds.map((skuId, i) => {
    const [, v] = replies[i] ?? [];
    const [initial, stock] = (v as (string | null)[] | undefined) ?? [];
    return { skuId, initial: Number(initial ?? 0), remaining: Number(stock ?? 0) };
  });
  const counters = (replies[skuIds.length]?.[1] as Record<string, string> | undefined) ?? {};
  return { skus, counters };
}

export interface OutboxFigures {
  /** Entries Kafka has not acknowledged yet (the relay deletes an entry once Kafka acked it). */
  halfMessages: number;
  oldestAgeSeconds: number;
}

export async function readOutbox(
  redis: RedisClient,
  activityId: string,
  nowMs = Date.now(),
): Promise<OutboxFigures> {
  const layout = await bucketLayout(redis, activityId);
  // Every outbox: the activity's and each stock bucket's.
  const figures = await Promise.all(
    layout.allScopes().map(async (k) => {
      const [len, first] = await Promise.all([
        redis.xlen(k.outbox),
        redis.xrange(k.outbox, '-', '+', 'COUNT', 1),
      ]);
      const firstId = first[0]?.[0];
      return { len, oldestMs: firstId ? Number(firstId.split('-')[0]) : nowMs };
    }),
  );
  const oldestMs = Math.min(nowMs, ...figures.map((f) => f.oldestMs));
  return {
    halfMessages: figures.reduce((n, f) => n + f.len, 0),
    oldestAgeSeconds: Math.max(0, (nowMs - oldestMs) / 1000),
  };
}

/** The outbox streams of the activity: its own and one per stock bucket (the relay reads all). */
export async function outboxStreams(redis: RedisClient, activityId: string): Promise<string[]> {
  return (await bucketLayout(redis, activityId, { refresh: true })).allScopes().map((k) => k.outbox);
}

/** Writes buyers' results and confirms the reservations in the ledger (after the DB commit). */
export async function recordResults(
  redis: RedisClient,
  activityId: string,
  results: StoredResult[],
): Promise<void> {
  if (results.length === 0) return;
  const k = activityKeys(activityId);
  const layout = await bucketLayout(redis, activityId);
  const flat: string[] = [];
  for (const r of results) flat.push(r.reservationId, JSON.stringify({ ...r.result, userId: r.userId }));
  // Results first, then each scope's ledger (one slot per command on a cluster): a crash between
  // them leaves a ledger entry that the next confirmation (or the gap job) removes.
  const byLedger = new Map<string, string[]>();
  for (const r of results) {
    const scope = r.skuId === undefined ? k : layout.scopeFor(r.skuId, r.userId);
    const ids = byLedger.get(scope.ledger);
    if (ids) ids.push(r.reservationId);
    else byLedger.set(scope.ledger, [r.reservationId]);
  }
  if (byLedger.size === 1 && byLedger.has(k.ledger)) {
    await redis
      .multi()
      .hset(k.results, ...flat)
      .zrem(k.ledger, ...results.map((r) => r.reservationId))
      .exec();
    await expireIfCleanedUp(redis, k, layout);
    return;
  }
  await redis.hset(k.results, ...flat);
  await Promise.all([...byLedger].map(([ledger, ids]) => redis.zrem(ledger, ...ids)));
  await expireIfCleanedUp(redis, k, layout);
}

/**
 * Results written after cleanup (a dead letter replayed once the retained results had expired)
 * would re-create the hash without a TTL, a key nothing deletes: it gets one, unless it has one.
 * Checked only when the layout says the activity is not loaded (generation 0), the rare case.
 */
const LATE_RESULTS_TTL_SECONDS = 24 * 3600;

async function expireIfCleanedUp(redis: RedisClient, k: ActivityKeys, layout: BucketLayout): Promise<void> {
  if (layout.generation !== 0 || (await redis.exists(k.meta)) === 1) return;
  await redis.expire(k.results, LATE_RESULTS_TTL_SECONDS, 'NX');
}

/** A buyer's result with its owner, so lookups stay owner-checked after cleanup. */
export interface StoredResult {
  reservationId: string;
  userId: string;
  /** The reservation's SKU (which scope's ledger confirms it); absent: the activity's own. */
  skuId?: string | undefined;
  result: ReservationResult;
}

export async function readResult(
  redis: RedisClient,
  activityId: string,
  reservationId: string,
): Promise<StoredResult | undefined> {
  const raw = await redis.hget(activityKeys(activityId).results, reservationId);
  if (!raw) return undefined;
  const { userId, ...result } = JSON.parse(raw) as ReservationResult & { userId: string };
  return { reservationId, userId, result };
}

/** Reservations older than `olderThanMs` that are not yet confirmed as orders. */
/** Reservations not yet confirmed as orders, from every scope's ledger, with their scope. */
export async function unconfirmedReservations(
  redis: RedisClient,
  activityId: string,
  olderThanMs: number,
  limit = 1000,
  offset = 0,
): Promise<{ reservationId: string; reservedAt: number; scope: ScopeKeys }[]> {
  const layout = await bucketLayout(redis, activityId);
  const out: { reservationId: string; reservedAt: number; scope: ScopeKeys }[] = [];
  // The first `offset` entries (scope after scope, oldest first in each) are passed over.
  let skip = offset;
  for (const scope of layout.allScopes()) {
    if (out.length >= limit) break;
    if (skip > 0) {
      const inScope = await redis.zcount(scope.ledger, '-inf', `(${olderThanMs}`);
      if (inScope <= skip) {
        skip -= inScope;
        continue;
      }
    }
    const flat = await redis.zrangebyscore(
      scope.ledger,
      '-inf',
      `(${olderThanMs}`,
      'WITHSCORES',
      'LIMIT',
      skip,
      limit - out.length,
    );
    skip = 0;
    for (let i = 0; i + 1 < flat.length; i += 2)
      out.push({ reservationId: flat[i]!, reservedAt: Number(flat[i + 1]), scope });
  }
  return out;
}

export async function countUnconfirmed(
  redis: RedisClient,
  activityId: string,
  olderThanMs: number,
): Promise<number> {
  const layout = await bucketLayout(redis, activityId);
  const counts = await Promise.all(
    layout.allScopes().map((k) => redis.zcount(k.ledger, '-inf', `(${olderThanMs}`)),
  );
  return counts.reduce((n, c) => n + c, 0);
}

/** Issues a one-time order code bound to buyer, sku and activity. */
/**
 * Issues a one-time order code bound to buyer + sku, only inside the sale window and at most
 * `maxPerBuyerPerSku` per buyer and sku (0 = no limit): lua/issueOrderCode-3.lua decides both.
 */
export async function issueOrderCode(
  redis: RedisClient,
  activityId: string,
  userId: string,
  skuId: string,
  ttlSeconds: number,
  maxPerBuyerPerSku = 0,
): Promise<string> {
  // The code lives in the scope the buyer's reservation of this SKU will be made in.
  const k = (await bucketLayout(redis, activityId)).scopeFor(skuId, userId);
  const code = randomBytes(16).toString('base64url');
  await runScript(
    redis,
    'issueOrderCode',
    [k.meta, k.buyer(userId), k.orderCode(code)],
    [userId, skuId, ttlSeconds, maxPerBuyerPerSku],
  );
  return code;
}

export async function skuExists(redis: RedisClient, activityId: string, skuId: string): Promise<boolean> {
  return (await redis.sismember(activityKeys(activityId).skuIndex, skuId)) === 1;
}

/**
 * Refuses (UNAVAILABLE, the message starting with `what`) while any scope of the activity holds
 * half messages or unconfirmed reservations: orders still on their way to PostgreSQL.
 */
export async function assertNothingInFlight(
  redis: RedisClient,
  activityId: string,
  what: string,
): Promise<void> {
  const [{ halfMessages: outbox }, ledger] = await Promise.all([
    readOutbox(redis, activityId),
    countUnconfirmed(redis, activityId, Number.MAX_SAFE_INTEGER),
  ]);
  if (outbox > 0 || ledger > 0) {
    throw new FlashSaleError(
      'UNAVAILABLE',
      `${what}: ${outbox} half message(s) and ${ledger} unconfirmed reservation(s) in flight`,
    );
  }
}

async function markCleanupBegan(redis: RedisClient, activityId: string): Promise<void> {
  const now = String(Date.now());
  const layout = await bucketLayout(redis, activityId, { refresh: true });
  for (const meta of layout.allScopes().map((k) => k.meta)) {
    if ((await redis.exists(meta)) === 1) await redis.hset(meta, 'cleanupBegan', now);
  }
}

export interface CleanupOutcome {
  deleted: number;
  retained: number;
}

/**
 * Stateful cleanup: deletes this activity's keys only (SCAN over its own prefix, never KEYS or a
 * global pattern) and keeps the buyers' results for `retentionSeconds`. Refuses while half
 * messages or unconfirmed reservations exist, so it can never race in-flight orders.
 */
export async function cleanupActivity(
  redis: RedisClient,
  activityId: string,
  retentionSeconds: number,
  opts: { force?: boolean } = {},
): Promise<CleanupOutcome> {
  const k = activityKeys(activityId);
  if (!opts.force) await assertNothingInFlight(redis, activityId, 'cleanup refused');
  // Marked before the first key goes: from here on the keys are partial (SCAN deletes them in no
  // particular order, and a cleanup may stop half-way), so readers that compare them (the stock
  // audit, a restarted relay) know not to, and the buyer's scripts (reserve-9.lua,
  // soldOutChecks-var.lua) send a submission to PostgreSQL instead of refusing it from a
  // reservation already deleted. Every scope's meta hash is marked, a bucket's too (its
  // reservations are answered from its own). The activity's meta hash is deleted last; a cleanup
  // run again after a meta hash went has nothing to mark there (and must not re-create it).
  await markCleanupBegan(redis, activityId);
  let deleted = 0;
  let retained = 0;
  // SCAN runs per primary on a cluster; the buckets' keys (their own hash tags) are matched by
  // their own prefix. The activity's meta (with the bucket layout) goes last, so a cleanup killed
  // half-way still finds the buckets when it runs again.
  for (const pattern of [k.bucketScanPattern, k.scanPattern]) {
    for (const node of primariesOf(redis)) {
      let cursor = '0';
      do {
        const [next, keys] = await node.scan(cursor, 'MATCH', pattern, 'COUNT', 500);
        cursor = next;
        const doomed = keys.filter((key) => key !== k.results && key !== k.meta);
        // On a cluster keys of different slots cannot share a command: one UNLINK per key there.
        if (doomed.length > 0 && !isCluster(redis)) deleted += await node.unlink(...doomed);
        else for (const key of doomed) deleted += await node.unlink(key);
      } while (cursor !== '0');
    }
  }
  // The results' TTL before the meta hash goes: a cleanup that dies after the meta hash is not run
  // again (nothing marks the activity as loaded), and would leave the results for ever.
  if ((await redis.exists(k.results)) === 1) {
    await redis.expire(k.results, Math.max(1, retentionSeconds));
    retained = 1;
  }
  deleted += await redis.unlink(k.meta);
  forgetBucketLayout(activityId);
  return { deleted, retained };
}
