/**
 * The one place that composes Redis keys and channel names. Every key of an activity carries the
 * hash tag `{<activityId>}` so all of them live in one Redis Cluster slot and every script that
 * touches them stays atomic. Nothing else in the code base concatenates key strings.
 *
 * A hot SKU's stock can be split into buckets (ARCHITECTURE.md "Stock buckets"): each bucket is a
 * reservation scope of its own, with the same key names as the activity's reservation keys under
 * its own hash tag `{<activityId>/<skuId>/<tag>}`, so buckets spread over the cluster's slots.
 * A reservation of a bucketed SKU lives entirely in its buyer's home bucket (`homeBucket`).
 */
import { createHash } from 'node:crypto';
import calculateSlot from 'cluster-key-slot';

const PREFIX = 'fs';
/** Redis Cluster's hash slots. */
const SLOTS = 16384;

/** Activity and SKU ids become parts of keys: keep them to a safe alphabet. */
const SAFE_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

export function isSafeId(id: string): boolean {
  return SAFE_ID.test(id);
}

function assertSafe(kind: string, id: string): string {
  if (!SAFE_ID.test(id)) throw new Error(`${kind} "${id}" is not a safe identifier (${SAFE_ID.source})`);
  return id;
}

/**
 * The keys one reserve script call touches: the activity's own (`ActivityKeys`), or one stock
 * bucket's (`BucketKeys`). Every key of a scope shares its hash tag (one slot).
 */
/**
 * Lifetime of an ack probe write. The probe may be written after the activity's cleanup deleted
 * its keys (a replica wait that was already under way); it must not outlive the activity then.
 */
export const ACK_PROBE_TTL_SECONDS = 600;

export class ScopeKeys {
  readonly activityId: string;
  /** Prefix shared by every key of this scope. */
  readonly prefix: string;

  protected constructor(activityId: string, tag: string) {
    this.activityId = assertSafe('activity id', activityId);
    this.prefix = `${PREFIX}:{${tag}}:`;
  }

  /** Hash: gate, load generation, sale window, policies (a bucket's: a copy of the activity's). */
  get meta(): string {
    return `${this.prefix}meta`;
  }
  /** Hash: aggregate counters (reserved / released quantities, reservations). */
  get counters(): string {
    return `${this.prefix}counters`;
  }
  /** Stream: the outbox of half messages, one entry per reservation, until Kafka acknowledged it. */
  get outbox(): string {
    return `${this.prefix}outbox`;
  }
  /** Sorted set (score = reserved-at ms): reservations not yet confirmed as orders in PostgreSQL. */
  get ledger(): string {
    return `${this.prefix}ledger`;
  }
  /** Hash: reservation id -> buyer-visible result JSON. Kept with a TTL after cleanup. */
  get results(): string {
    return `${this.prefix}results`;
  }
  /** Set: every sku id of the activity. */
  get skuIndex(): string {
    return `${this.prefix}skus`;
  }
  /** Hash per SKU: stock, initial, limit, price, name, gen. */
  sku(skuId: string): string {
    return `${this.prefix}sku:${assertSafe('sku id', skuId)}`;
  }
  /** Hash per buyer: `<sku>:qty` held quantity, `<sku>:slot:<n>` reservation id. */
  buyer(userId: string): string {
    return `${this.prefix}buyer:${userId}`;
  }
  /** Hash per reservation: the reservation ledger entry. */
  reservation(reservationId: string): string {
    return `${this.prefix}rsv:${reservationId}`;
  }
  /** String per one-time order code: "<user>|<sku>", short TTL. */
  orderCode(code: string): string {
    return `${this.prefix}code:${code}`;
  }
  /**
   * Key written (SET … EX ACK_PROBE_TTL_SECONDS) before a replica wait: a write on its own
   * connection, so Redis WAIT covers every earlier write on the primary (the original included).
   */
  get ackProbe(): string {
    return `${this.prefix}ackprobe`;
  }
  /** Placeholder in the same slot for scripts whose optional key is absent. */
  get none(): string {
    return `${this.prefix}none`;
  }
  /** Hash (bucket scopes): `out:<transferId>` / `in:<transferId>` records of stock transfers. */
  get transfers(): string {
    return `${this.prefix}xfer`;
  }
}

/**
 * Items grouped by the scope each belongs to, in first-seen order: one slot per group, so one
 * pipeline, transaction or WAIT per group (a cluster runs each within one slot's node only).
 */
export function groupByScope<T>(
  items: Iterable<T>,
  scopeOf: (item: T) => ScopeKeys,
): { scope: ScopeKeys; items: T[] }[] {
  const groups = new Map<string, { scope: ScopeKeys; items: T[] }>();
  for (const item of items) {
    const scope = scopeOf(item);
    const group = groups.get(scope.prefix);
    if (group) group.items.push(item);
    else groups.set(scope.prefix, { scope, items: [item] });
  }
  return [...groups.values()];
}

export class ActivityKeys extends ScopeKeys {
  constructor(activityId: string) {
    super(activityId, activityId);
  }

  /** String: the activity's traffic policy (JSON, core/traffic-policy.ts), written by the operator. */
  get policy(): string {
    return `${this.prefix}policy`;
  }
  /**
   * Hash: sku id -> the bucket count the operator chose for it before loading it (first choice
   * wins, HSETNX): an operator resumed after a crash half-way through a load, or running with
   * another automatic-bucketing setting, loads the rest with the same count (core/buckets.ts).
   */
  get bucketPlan(): string {
    return `${this.prefix}bucketplan`;
  }
  /** Set: buyers the deny list marked (so a later list can clear the ones it no longer names). */
  get denied(): string {
    return `${this.prefix}denied`;
  }
  /**
   * Set: buyers who pre-registered (a copy of PostgreSQL's `activity_registrations`), so a stock
   * bucket loaded later flags them as the deny list's buyers are (core/activity-cache.ts).
   */
  get registered(): string {
    return `${this.prefix}registered`;
  }
  /**
   * Key prefix of a rate limiter's counters (rate-limiter-flexible appends `:<subject>`): inside
   * the activity's hash tag, so cleanup's scan removes them with the rest of the activity.
   */
  rateLimitPrefix(kind: 'buyer' | 'address'): string {
    return `${this.prefix}rl:${kind}`;
  }
  /**
   * A subject's rate-limit counter: the key rate-limiter-flexible composes from the prefix above
   * (`<prefix>:<subject>`), so the scripts that count the per-buyer window (reserve-9.lua,
   * soldOutChecks-var.lua, countWindow-1.lua) and the library count the same window.
   */
  rateLimitKey(kind: 'buyer' | 'address', subject: string): string {
    return `${this.rateLimitPrefix(kind)}:${subject}`;
  }
  /** SCAN pattern covering every key of this activity's own slot and nothing else. */
  get scanPattern(): string {
    // `{`, `}` and the id's characters are not glob metacharacters except `[`/`*`/`?`, which
    // SAFE_ID excludes, so the prefix matches literally.
    return `${this.prefix}*`;
  }
  /**
   * SCAN pattern covering every key of every stock bucket of this activity and nothing else: `/`
   * cannot occur in an activity id, so `fs:{<id>/` is no other activity's prefix.
   */
  get bucketScanPattern(): string {
    return `${PREFIX}:{${this.activityId}/*`;
  }
  /** Meta hash field holding a bucketed SKU's bucket count (the activity's bucket layout). */
  bucketField(skuId: string): string {
    return `bucket:${assertSafe('sku id', skuId)}`;
  }
  /** The SKU id of a meta field written by `bucketField`, or undefined. */
  static skuOfBucketField(field: string): string | undefined {
    return field.startsWith('bucket:') ? field.slice('bucket:'.length) : undefined;
  }
  /** Bucket `index` (0-based) of `skuId` split into `count` buckets. */
  bucket(skuId: string, index: number, count: number): BucketKeys {
    return new BucketKeys(this.activityId, skuId, index, count);
  }
  /** Pub/sub channel announcing that stock of a SKU came back (resets sold-out flags). */
  get restockChannel(): string {
    return `${this.prefix}restock`;
  }
}

/**
 * One stock bucket of a hot SKU: a reservation scope under its own hash tag. The tag's suffix is
 * chosen (deterministically) so that bucket i of n hashes into the middle of the i-th n-th of the
 * slot space: a cluster whose primaries own contiguous, equal slot ranges (what `redis-cli
 * --cluster create` and most operators produce) gets the buckets spread evenly over its primaries.
 */
export class BucketKeys extends ScopeKeys {
  readonly skuId: string;
  readonly index: number;

  constructor(activityId: string, skuId: string, index: number, count: number) {
    super(
      activityId,
      bucketTag(assertSafe('activity id', activityId), assertSafe('sku id', skuId), index, count),
    );
    this.skuId = skuId;
    this.index = index;
  }
}

const tagCache = new Map<string, string>();

function bucketTag(activityId: string, skuId: string, index: number, count: number): string {
  if (!Number.isInteger(count) || count < 1 || !Number.isInteger(index) || index < 0 || index >= count) {
    throw new Error(`bucket ${index} of ${count} is not a bucket`);
  }
  const id = `${activityId}/${skuId}/${index}/${count}`;
  const known = tagCache.get(id);
  if (known) return known;
  const width = SLOTS / count;
  const lo = Math.floor((index + 0.25) * width);
  const hi = Math.max(lo + 1, Math.floor((index + 0.75) * width));
  let tag = `${activityId}/${skuId}/${index}`;
  for (let salt = 0; salt < 100_000; salt += 1) {
    const candidate = `${activityId}/${skuId}/${index}.${salt}`;
    const slot = calculateSlot(candidate);
    if (slot >= lo && slot < hi) {
      tag = candidate;
      break;
    }
  }
  tagCache.set(id, tag);
  return tag;
}

/**
 * A buyer's home bucket of a SKU split into `count` buckets: every reservation of that buyer and
 * SKU lives there, so the per-buyer limit is checked in the same script as the decrement.
 */
export function homeBucket(activityId: string, skuId: string, userId: string, count: number): number {
  if (count <= 1) return 0;
  const h = createHash('sha256').update(`${activityId}\n${skuId}\n${userId}`).digest();
  return h.readUInt32BE(0) % count;
}

export function activityKeys(activityId: string): ActivityKeys {
  return new ActivityKeys(activityId);
}

/** Pattern matching every activity's restock channel (for api replicas serving all activities). */
export const RESTOCK_CHANNEL_PATTERN = `${PREFIX}:{*}:restock`;

/** The activity id of a restock channel name, or undefined for anything else. */
export function activityOfRestockChannel(channel: string): string | undefined {
  const m = /^fs:\{([^}]+)\}:restock$/.exec(channel);
  return m?.[1];
}
