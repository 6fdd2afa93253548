/**
 * The activity's state in Redis as the operator and the runtime roles see it: cache loading,
 * the gate, stock and outbox figures, buyer results, one-time order codes, and cleanup.
 */
import { randomBytes } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import { FlashSaleError } from './errors.js';
import { activityKeys } from './keys.js';
import type { ActivityDefinition, GateState, ReservationResult } from './model.js';
import type { RedisClient } from './scripts.js';
import { runScript } from './scripts.js';

/** SKUs per script call while loading: keeps each call well under a few milliseconds. */
export const LOAD_CHUNK = 2000;

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
  const chunks = Math.max(1, Math.ceil(a.items.length / LOAD_CHUNK));
  const load = async (c: number): Promise<void> => {
    const items = a.items.slice(c * LOAD_CHUNK, (c + 1) * LOAD_CHUNK);
    const keys = [k.meta, k.counters, k.skuIndex, ...items.map((i) => k.sku(i.skuId))];
    const args: (string | number)[] = [
      a.generation,
      a.startAt.getTime(),
      a.endAt.getTime(),
      a.requireOrderCode ? '1' : '0',
      a.reopenOnRelease ? '1' : '0',
      c === chunks - 1 ? '1' : '0',
    ];
    for (const i of items) args.push(i.skuId, i.stock, i.limitPerUser, i.price, i.name);
    const r = await runScript(redis, 'loadItems', keys, args);
    total.created += Number(r[1]);
    total.topped += Number(r[2]);
    total.skipped += Number(r[3]);
    total.stockAdded += Number(r[4]);
  };
  // All chunks but the last are sent at once (one connection keeps them in order, and Redis runs
  // them while the next ones are encoded). The last chunk marks the generation loaded, so it goes
  // only after every other chunk succeeded; on a refusal the load stops there, as before, and a
  // repeat of the load is idempotent.
  const first = await Promise.allSettled(Array.from({ length: chunks - 1 }, (_, c) => load(c)));
  const failed = first.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
  await load(chunks - 1);
  return total;
}

export interface CacheMeta {
  gate: GateState;
  generation: number;
  loads: number;
  startMs: number;
  endMs: number;
  requireOrderCode: boolean;
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

export async function setGate(redis: RedisClient, activityId: string, gate: GateState): Promise<GateState> {
  const r = await runScript(redis, 'setGate', [activityKeys(activityId).meta], [gate]);
  return String(r[1]) as GateState;
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

export async function readStock(redis: RedisClient, activityId: string): Promise<StockFigures> {
  const k = activityKeys(activityId);
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
  return {
    skus,
    initial: skus.reduce((n, s) => n + s.initial, 0),
    remaining: skus.reduce((n, s) => n + s.remaining, 0),
    reserved: Number(counters.reserved ?? 0),
    released: Number(counters.released ?? 0),
    reservations: Number(counters.reservations ?? 0),
  };
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
  const k = activityKeys(activityId);
  const [len, first] = await Promise.all([
    redis.xlen(k.outbox),
    redis.xrange(k.outbox, '-', '+', 'COUNT', 1),
  ]);
  const firstId = first[0]?.[0];
  const oldestMs = firstId ? Number(firstId.split('-')[0]) : nowMs;
  return { halfMessages: len, oldestAgeSeconds: Math.max(0, (nowMs - oldestMs) / 1000) };
}

/** Writes buyers' results and confirms the reservations in the ledger (after the DB commit). */
export async function recordResults(
  redis: RedisClient,
  activityId: string,
  results: StoredResult[],
): Promise<void> {
  if (results.length === 0) return;
  const k = activityKeys(activityId);
  const flat: string[] = [];
  for (const r of results) flat.push(r.reservationId, JSON.stringify({ ...r.result, userId: r.userId }));
  await redis
    .multi()
    .hset(k.results, ...flat)
    .zrem(k.ledger, ...results.map((r) => r.reservationId))
    .exec();
}

/** A buyer's result with its owner, so lookups stay owner-checked after cleanup. */
export interface StoredResult {
  reservationId: string;
  userId: string;
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
export async function unconfirmedReservations(
  redis: RedisClient,
  activityId: string,
  olderThanMs: number,
  limit = 1000,
): Promise<{ reservationId: string; reservedAt: number }[]> {
  const flat = await redis.zrangebyscore(
    activityKeys(activityId).ledger,
    '-inf',
    `(${olderThanMs}`,
    'WITHSCORES',
    'LIMIT',
    0,
    limit,
  );
  const out: { reservationId: string; reservedAt: number }[] = [];
  for (let i = 0; i + 1 < flat.length; i += 2)
    out.push({ reservationId: flat[i]!, reservedAt: Number(flat[i + 1]) });
  return out;
}

export async function countUnconfirmed(
  redis: RedisClient,
  activityId: string,
  olderThanMs: number,
): Promise<number> {
  return redis.zcount(activityKeys(activityId).ledger, '-inf', `(${olderThanMs}`);
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
  const k = activityKeys(activityId);
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

export interface CleanupOutcome {
  deleted: number;
  retained: number;
}

function isCluster(redis: RedisClient): redis is Cluster {
  return typeof (redis as Cluster).nodes === 'function' && 'slots' in redis;
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
  if (!opts.force) {
    const [outbox, ledger] = await Promise.all([redis.xlen(k.outbox), redis.zcard(k.ledger)]);
    if (outbox > 0 || ledger > 0) {
      throw new FlashSaleError(
        'UNAVAILABLE',
        `cleanup refused: ${outbox} half message(s) and ${ledger} unconfirmed reservation(s) in flight`,
      );
    }
  }
  const nodes: Redis[] = isCluster(redis) ? redis.nodes('master') : [redis as Redis];
  let deleted = 0;
  let retained = 0;
  for (const node of nodes) {
    let cursor = '0';
    do {
      const [next, keys] = await node.scan(cursor, 'MATCH', k.scanPattern, 'COUNT', 500);
      cursor = next;
      const doomed = keys.filter((key) => key !== k.results);
      if (doomed.length > 0) deleted += await node.unlink(...doomed);
    } while (cursor !== '0');
  }
  if ((await redis.exists(k.results)) === 1) {
    await redis.expire(k.results, Math.max(1, retentionSeconds));
    retained = 1;
  }
  return { deleted, retained };
}
