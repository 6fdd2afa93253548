/**
 * Stock buckets of hot SKUs (ARCHITECTURE.md "Stock buckets"): which SKUs are split into how many
 * buckets (the activity's bucket layout, in its meta hash), which reservation scope a buyer's
 * reservation of a SKU lives in (the buyer's home bucket), and the transfer of units from a bucket
 * that has them to one that ran out (lua/transferStock-4.lua), so no bucket says "sold out" while
 * another still has units.
 */
import { randomUUID } from 'node:crypto';
import { ACK_PROBE_TTL_SECONDS, activityKeys, homeBucket, ActivityKeys } from './keys.js';
import type { BucketKeys, ScopeKeys } from './keys.js';
import type { RedisClient } from './scripts.js';
import { runScript } from './scripts.js';

/** Most buckets one SKU may have (the CRD's maximum). */
export const MAX_BUCKETS = 64;

/**
 * Automatic bucketing: a SKU whose definition leaves its bucket count out is split into `buckets`
 * buckets when its stock is at least `stockThreshold` (0 = never). docs/operator.md "Stock buckets".
 */
export interface AutoBucketing {
  stockThreshold: number;
  buckets: number;
}

/**
 * The default threshold on a Redis Cluster of several primaries. A SKU loads Redis only while it
 * has units (the api answers SOLD_OUT from its own flags afterwards), and one primary at the
 * planning utilisation of docs/capacity.md (0.6 of a core, about 38 µs of Redis CPU per
 * reservation) takes about 15,800 reservations a second: a SKU below 15,000 units is sold out by
 * one primary within a second, so splitting it would buy nothing but transfers.
 */
export const AUTO_BUCKET_STOCK_THRESHOLD = 15_000;

/**
 * What applies where neither the resource nor the operator's settings say: on a Redis Cluster of
 * several primaries, 2 buckets per primary (docs/capacity.md: two per primary leaves room to move
 * one) above AUTO_BUCKET_STOCK_THRESHOLD; elsewhere off (on one node every bucket is on the same
 * core, so buckets cost script calls and transfers and spread nothing).
 */
export function defaultAutoBucketing(primaries: number): AutoBucketing {
  if (primaries < 2) return { stockThreshold: 0, buckets: 2 };
  return { stockThreshold: AUTO_BUCKET_STOCK_THRESHOLD, buckets: Math.min(MAX_BUCKETS, 2 * primaries) };
}

/**
 * A SKU's bucket count: the definition's own when it gives one, else the automatic choice (never
 * more buckets than units, nor than MAX_BUCKETS; 1 = not split).
 */
export function chooseBuckets(stock: number, explicit: number | undefined, auto: AutoBucketing): number {
  if (explicit !== undefined) return explicit;
  if (auto.stockThreshold <= 0 || stock < auto.stockThreshold || auto.buckets < 2) return 1;
  return Math.max(1, Math.min(auto.buckets, stock, MAX_BUCKETS));
}

/**
 * Records each SKU's chosen bucket count before it is loaded, unless a count is recorded already
 * (HSETNX: the first choice wins), and returns the recorded counts. A load cut by a crash is
 * resumed with the counts it began with, whatever the automatic setting says by then.
 */
export async function recordBucketPlan(
  redis: RedisClient,
  activityId: string,
  chosen: ReadonlyMap<string, number>,
): Promise<Map<string, number>> {
  const recorded = new Map<string, number>();
  if (chosen.size === 0) return recorded;
  const k = activityKeys(activityId);
  const skus = [...chosen.keys()];
  const p = redis.pipeline();
  for (const sku of skus) p.hsetnx(k.bucketPlan, sku, String(chosen.get(sku)));
  p.hmget(k.bucketPlan, ...skus);
  const replies = (await p.exec()) ?? [];
  for (const [err] of replies) if (err) throw err;
  const values = (replies[replies.length - 1]?.[1] ?? []) as (string | null)[];
  skus.forEach((sku, i) => recorded.set(sku, Number(values[i] ?? chosen.get(sku))));
  return recorded;
}

/** Bucket i's share of `stock` split into `count` (the first `stock % count` get one more). */
export function bucketShare(stock: number, index: number, count: number): number {
  return Math.floor(stock / count) + (index < stock % count ? 1 : 0);
}

export class BucketLayout {
  readonly keys: ActivityKeys;
  constructor(
    readonly activityId: string,
    /** sku id -> bucket count, for bucketed SKUs only (count >= 2). */
    readonly counts: ReadonlyMap<string, number>,
    /** The loaded generation (the meta's `gen`) this layout was read at. */
    readonly generation = 0,
  ) {
    this.keys = activityKeys(activityId);
  }

  countOf(skuId: string): number {
    return this.counts.get(skuId) ?? 1;
  }

  /** The scope a buyer's reservations of a SKU live in. */
  scopeFor(skuId: string, userId: string): ScopeKeys {
    const n = this.countOf(skuId);
    if (n <= 1) return this.keys;
    return this.keys.bucket(skuId, homeBucket(this.activityId, skuId, userId, n), n);
  }

  /** Every scope a reservation of this buyer can be in (when the SKU is not known). */
  scopesForUser(userId: string): ScopeKeys[] {
    return [this.keys, ...[...this.counts.keys()].map((sku) => this.scopeFor(sku, userId))];
  }

  bucketsOf(skuId: string): BucketKeys[] {
    const n = this.countOf(skuId);
    if (n <= 1) return [];
    return Array.from({ length: n }, (_, i) => this.keys.bucket(skuId, i, n));
  }

  /** Every bucket of every bucketed SKU. */
  allBuckets(): BucketKeys[] {
    return [...this.counts.keys()].sort().flatMap((sku) => this.bucketsOf(sku));
  }

  /** The activity's own scope first, then every bucket. */
  allScopes(): ScopeKeys[] {
    return [this.keys, ...this.allBuckets()];
  }
}

const cache = new Map<string, BucketLayout>();

/**
 * The activity's remembered layout, without a promise and without checking `gen`: the reserve path
 * asks on every request, and learns of a bucketed SKU added since from the script itself (BUCKETED,
 * core/reservations.ts). Undefined when it must be read (bucketLayout).
 */
export function knownBucketLayout(activityId: string): BucketLayout | undefined {
  return cache.get(activityId);
}

/**
 * The activity's bucket layout as loaded (meta fields `bucket:<sku>`). A SKU's bucket count never
 * changes once loaded (the CRD refuses the edit), but a later load can add a bucketed SKU, and
 * every load stamps the meta's `gen`: a process keeps the layout and re-reads it only when `gen`
 * has moved (one small read), or at once with `refresh` (a reserve script that found a bucketed
 * SKU's activity hash). Without that check a consumer, the jobs or another api would go on
 * settling a new bucketed SKU's reservations in the activity's own scope, where they are not.
 */
export async function bucketLayout(
  redis: RedisClient,
  activityId: string,
  opts: { refresh?: boolean } = {},
): Promise<BucketLayout> {
  const known = cache.get(activityId);
  const k = activityKeys(activityId);
  if (known && !opts.refresh && Number(await redis.hget(k.meta, 'gen')) === known.generation) return known;
  const meta = await redis.hgetall(k.meta);
  const counts = new Map<string, number>();
  for (const [field, value] of Object.entries(meta)) {
    const sku = ActivityKeys.skuOfBucketField(field);
    if (sku !== undefined && Number(value) > 1) counts.set(sku, Number(value));
  }
  const layout = new BucketLayout(activityId, counts, Number(meta.gen ?? 0));
  // An activity not loaded yet is not remembered: its layout is still to come. Nor is a meta
  // without the load mark `gen`: a half-done load, or the paused meta a cache restore holds an
  // empty Redis with (core/cache-restore.ts), whose layout comes back with the reload.
  if (meta.gate && meta.gen) cache.set(activityId, layout);
  else cache.delete(activityId);
  return layout;
}

/** Forgets remembered layouts (tests that reuse activity ids; cleanup). */
export function forgetBucketLayout(activityId?: string): void {
  if (activityId === undefined) cache.clear();
  else cache.delete(activityId);
}

export interface TransferOutcome {
  transferId: string;
  /** Units the donor gave up. */
  moved: number;
  /** Whether they are in the recipient now; false: in flight until `completeTransfers` lands them. */
  landed: boolean;
}

/**
 * Moves up to `wanted` units of a SKU from bucket `from` to bucket `to`, exactly once, in two
 * idempotent script calls keyed by one transfer id: the donor records `out:<id>` (units and
 * recipient) in the step that takes the units, the recipient `in:<id>` in the step that adds them.
 * A process killed between the two leaves the donor's record, and `completeTransfers` (run by the
 * reserve path before it answers SOLD_OUT) adds the units to the recipient; until then they count
 * as in flight (`unitsLeft`, and write-back's `readStock`, which sum them); a repeat of either
 * step changes nothing.
 */
export async function transferStock(
  redis: RedisClient,
  from: BucketKeys,
  to: BucketKeys,
  wanted: number,
  transferId: string = randomUUID(),
): Promise<TransferOutcome> {
  const out = await runScript(
    redis,
    'transferStock',
    [from.meta, from.sku(from.skuId), from.transfers, from.counters],
    ['out', transferId, wanted, to.index, from.skuId],
  );
  const moved = Number(out[1]);
  if (moved > 0 && (await donorRecordDurable(redis, from, transferId))) {
    const landed = await transferIn(redis, to, from.index, transferId, moved, String(out[2] ?? ''));
    return { transferId, moved, landed };
  }
  return { transferId, moved, landed: false };
}

/**
 * The donor's record must survive a failover of the donor's node before the units land in the
 * recipient (else a promoted replica would still have them, and they would exist twice). Asked of
 * whichever node serves the donor's slot now, in one pipeline on that node's connection: the
 * record is there, and a WAIT after a probe write in the donor's scope saw one replica acknowledge
 * every write of that node up to then, the record's included. A reply from another node than the
 * script's (the slot moved in a failover) therefore speaks for its own copy of the record, never
 * for the old node's; an error anywhere is "not confirmed". A node without replicas has nothing to
 * wait for. Not confirmed: the transfer stays in flight, `completeTransfers` asks again.
 */
async function donorRecordDurable(
  redis: RedisClient,
  from: BucketKeys,
  transferId: string,
): Promise<boolean> {
  const record = `out:${transferId}`;
  const replies = async (p: ReturnType<RedisClient['pipeline']>): Promise<unknown[] | undefined> => {
    const r = (await p.exec().catch(() => null)) ?? [];
    if (r.length === 0 || r.some(([err]) => err)) return undefined;
    return r.map(([, value]) => value);
  };
  // Keyless commands after keyed ones of the donor's slot: a cluster routes the pipeline there.
  const info = await replies(redis.pipeline().hexists(from.transfers, record).info('replication'));
  if (!info || Number(info[0]) !== 1) return false;
  if (/^connected_slaves:0\b/m.test(String(info[1]))) return true;
  const waited = await replies(
    redis
      .pipeline()
      .hexists(from.transfers, record)
      .set(from.ackProbe, '1', 'EX', ACK_PROBE_TTL_SECONDS)
      .wait(1, 1000),
  );
  return waited !== undefined && Number(waited[0]) === 1 && Number(waited[2]) >= 1;
}

/**
 * The recipient's step. False when a cache restore rebuilt the recipient after the donor's step
 * (`donorEpoch`, from the donor's record, is older than the recipient's): the restore counted those
 * units from PostgreSQL and dropped the donor's record, so they must not be added again.
 */
async function transferIn(
  redis: RedisClient,
  to: BucketKeys,
  fromIndex: number,
  transferId: string,
  units: number,
  donorEpoch: string,
): Promise<boolean> {
  const r = await runScript(
    redis,
    'transferStock',
    [to.meta, to.sku(to.skuId), to.transfers, to.counters],
    ['in', transferId, units, fromIndex, to.skuId, donorEpoch],
  );
  return Number(r[0]) === 1;
}

/** A transfer whose donor step ran and whose recipient step did not (yet). */
interface PendingTransfer {
  id: string;
  units: number;
  from: number;
  to: number;
  /** The donor's restore epoch when it took the units ('' in a record written before it was kept). */
  donorEpoch: string;
}

async function pendingTransfers(
  redis: RedisClient,
  layout: BucketLayout,
  skuId: string,
): Promise<{ buckets: BucketKeys[]; pending: PendingTransfer[] }> {
  const buckets = layout.bucketsOf(skuId);
  const records = await Promise.all(buckets.map((b) => redis.hgetall(b.transfers)));
  const pending: PendingTransfer[] = [];
  for (const [from, donor] of records.entries()) {
    for (const [field, value] of Object.entries(donor)) {
      if (!field.startsWith('out:')) continue;
      const id = field.slice(4);
      const [units, to, donorEpoch = ''] = value.split('|');
      const target = Number(to);
      if (records[target]?.[`in:${id}`] === undefined)
        pending.push({ id, units: Number(units), from, to: target, donorEpoch });
    }
  }
  return { buckets, pending };
}

/**
 * Finishes every transfer of a SKU whose donor step ran and whose recipient step did not (a
 * process killed between them, or a donor record its replicas had not confirmed): each lands only
 * once its record is confirmed on the donor's node (`donorRecordDurable`). Returns the units that
 * landed, and those still in flight unconfirmed.
 */
export async function completeTransfers(
  redis: RedisClient,
  layout: BucketLayout,
  skuId: string,
): Promise<{ landed: number; unconfirmed: number }> {
  const { buckets, pending } = await pendingTransfers(redis, layout, skuId);
  let landed = 0;
  let unconfirmed = 0;
  for (const t of pending) {
    const from = buckets[t.from];
    const to = buckets[t.to];
    if (t.units <= 0 || !from || !to) continue;
    if (!(await donorRecordDurable(redis, from, t.id))) {
      unconfirmed += t.units;
      continue;
    }
    if (await transferIn(redis, to, from.index, t.id, t.units, t.donorEpoch)) landed += t.units;
  }
  return { landed, unconfirmed };
}

/**
 * Units of a SKU taken from a donor bucket and not yet added to their recipient (write-back and
 * the stock audit count them as remaining: they are nobody's).
 */
export async function unitsInFlight(
  redis: RedisClient,
  layout: BucketLayout,
  skuId: string,
): Promise<number> {
  const { pending } = await pendingTransfers(redis, layout, skuId);
  return pending.reduce((n, t) => n + t.units, 0);
}

/**
 * An upper bound of the units a SKU has left in all its buckets, from the buckets' counters
 * (loaded - reserved + released; transfers move units without touching them). Both counters only
 * grow, so every bucket's `reserved` is read first and every `released` after: the sum is then at
 * least what was left at any instant between the two reads, and when it is below the quantity
 * asked for, the SKU had fewer units than that at such an instant. (Reading each bucket's pair in
 * turn would not do: a release in a bucket read already, then a reservation of the last unit of
 * one read later, gives a sum below any instant's; summing the buckets' stock could miss units
 * moving between two buckets while they are read.)
 */
export async function unitsLeft(redis: RedisClient, layout: BucketLayout, skuId: string): Promise<number> {
  const buckets = layout.bucketsOf(skuId);
  const reserved = await Promise.all(buckets.map((b) => redis.hget(b.counters, 'reserved')));
  const loadedAndReleased = await Promise.all(
    buckets.map((b) => redis.hmget(b.counters, 'initial', 'released')),
  );
  return loadedAndReleased.reduce(
    (n, [initial, released], i) =>
      n + Number(initial ?? 0) - Number(reserved[i] ?? 0) + Number(released ?? 0),
    0,
  );
}

/**
 * Refills an empty bucket: takes half of the fullest other bucket's units (at least `needed`)
 * while any other bucket has units. Returns the units that landed in the target (0: every other
 * bucket is empty, or what was taken is in flight, not confirmed on its donor's node yet).
 */
export async function refillBucket(
  redis: RedisClient,
  layout: BucketLayout,
  skuId: string,
  target: BucketKeys,
  needed: number,
): Promise<number> {
  const buckets = layout.bucketsOf(skuId);
  const stocks = await Promise.all(
    buckets.map(async (b) => Number((await redis.hget(b.sku(skuId), 'stock')) ?? 0)),
  );
  let moved = 0;
  let have = stocks[target.index] ?? 0;
  // Fullest donors first; each at most once per refill.
  const donors = buckets
    .filter((b) => b.index !== target.index && (stocks[b.index] ?? 0) > 0)
    .sort((a, b) => (stocks[b.index] ?? 0) - (stocks[a.index] ?? 0));
  for (const donor of donors) {
    if (have >= needed) break;
    const want = Math.max(needed - have, Math.ceil((stocks[donor.index] ?? 0) / 2));
    const r = await transferStock(redis, donor, target, want);
    // Units in flight are not in the target: a later call lands them once confirmed.
    if (!r.landed) continue;
    moved += r.moved;
    have += r.moved;
  }
  return moved;
}
