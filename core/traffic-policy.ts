/**
 * An activity's traffic policy: rate limits per buyer and per client address, and eligibility
 * (pre-registration, deny list, order codes per buyer). The operator writes it next to the cache
 * it loads (merged over its configured defaults); every api replica reads it from Redis, the same
 * way it learns the rest of the activity's definition. docs/operator.md "Traffic shaping and
 * eligibility" describes the fields.
 */
import { z } from 'zod';
import { localAck } from './durable-ack.js';
import type { ReservationAck } from './durable-ack.js';
import { FlashSaleError } from './errors.js';
import { activityKeys, groupByScope } from './keys.js';
import type { ScopeKeys } from './keys.js';
import { bucketLayout } from './buckets.js';
import type { BucketLayout } from './buckets.js';
import { recordRegistration } from './db/registrations-store.js';
import type { Queryable } from './db/pool.js';
import type { RedisClient } from './scripts.js';

/** The bounds of a policy (the CRD's too); the operator's defaults are held to them at start. */
export const POLICY_LIMITS = {
  requests: 1_000_000,
  perSeconds: 86_400,
  orderCodesPerBuyerPerSku: 1000,
} as const;

export const rateLimitSchema = z
  .object({
    /** Requests allowed per window; 0 switches this limit off. */
    requests: z.number().int().min(0).max(POLICY_LIMITS.requests),
    /** The window, in seconds. */
    perSeconds: z.number().int().min(1).max(POLICY_LIMITS.perSeconds),
  })
  .strict();

export type RateLimit = z.infer<typeof rateLimitSchema>;

export const trafficPolicySchema = z
  .object({
    shaping: z
      .object({
        enabled: z.boolean(),
        perBuyer: rateLimitSchema,
        perAddress: rateLimitSchema,
      })
      .strict(),
    eligibility: z
      .object({
        /** Only buyers who registered before the sale started may reserve. */
        preRegistration: z.boolean(),
        /** One-time order codes one buyer may obtain per SKU (0 = no limit). */
        orderCodesPerBuyerPerSku: z.number().int().min(0).max(POLICY_LIMITS.orderCodesPerBuyerPerSku),
      })
      .strict(),
  })
  .strict();

export type TrafficPolicy = z.infer<typeof trafficPolicySchema>;

/**
 * Defaults, chosen so an honest buyer is never refused: a person clicks a few times and polls; a
 * script sends tens of requests a second. The per-address limit is off by default because many
 * honest buyers can share one address (carrier NAT, offices) and because without trusted proxy
 * hops (API_TRUST_PROXY) the address is the gateway's: switch it on per activity, sized for the
 * population behind one address.
 */
export const DEFAULT_TRAFFIC_POLICY: TrafficPolicy = {
  shaping: {
    enabled: true,
    perBuyer: { requests: 20, perSeconds: 10 },
    perAddress: { requests: 0, perSeconds: 10 },
  },
  eligibility: { preRegistration: false, orderCodesPerBuyerPerSku: 5 },
};

/**
 * Writes the policy the api replicas enforce. Idempotent (a plain overwrite); the registration
 * flag also goes into the meta hash because reserve-9.lua reads it atomically with the reservation.
 */
export async function writeTrafficPolicy(
  redis: RedisClient,
  activityId: string,
  policy: TrafficPolicy,
): Promise<void> {
  const k = activityKeys(activityId);
  const valid = trafficPolicySchema.parse(policy);
  const requireReg = valid.eligibility.preRegistration ? '1' : '0';
  // Each stock bucket's reserve script reads its own meta's copy.
  const layout = await bucketLayout(redis, activityId);
  await Promise.all(layout.allBuckets().map((b) => redis.hset(b.meta, 'requireReg', requireReg)));
  await redis.multi().set(k.policy, JSON.stringify(valid)).hset(k.meta, 'requireReg', requireReg).exec();
}

/** Buyer hashes written per pipeline: one round trip per scope and chunk. */
const FLAG_CHUNK = 1000;

/**
 * Sets (or clears) an eligibility flag in the given buyer hashes: one pipeline per scope and chunk
 * (a cluster runs a pipeline within one slot only; each scope is one slot), the scopes in
 * parallel. Idempotent: HSET of the same value, HDEL of an absent field.
 */
export async function writeBuyerFlags(
  redis: RedisClient,
  targets: readonly (readonly [ScopeKeys, string])[],
  field: string,
  set: boolean,
): Promise<void> {
  await Promise.all(
    groupByScope(targets, ([scope]) => scope).map(async ({ scope, items }) => {
      const users = items.map(([, userId]) => userId);
      for (let i = 0; i < users.length; i += FLAG_CHUNK) {
        const p = redis.pipeline();
        for (const u of users.slice(i, i + FLAG_CHUNK)) {
          if (set) p.hset(scope.buyer(u), field, '1');
          else p.hdel(scope.buyer(u), field);
        }
        throwFirstError(await p.exec());
      }
    }),
  );
}

/**
 * Sets or clears an eligibility flag in the buyer's hash of every stock bucket the buyer's
 * reservations can be in, by `layout`.
 */
async function bucketFlags(
  redis: RedisClient,
  layout: BucketLayout,
  userIds: readonly string[],
  field: string,
  set: boolean,
): Promise<void> {
  if (layout.counts.size === 0) return;
  await writeBuyerFlags(
    redis,
    userIds.flatMap((u) =>
      layout
        .scopesForUser(u)
        .slice(1)
        .map((scope) => [scope, u] as const),
    ),
    field,
    set,
  );
}

/**
 * The layout read afresh, not the process's remembered one: a load in progress writes a new
 * bucketed SKU's layout before it moves `gen`, which is what tells a remembered layout is stale.
 */
const currentLayout = (redis: RedisClient, activityId: string): Promise<BucketLayout> =>
  bucketLayout(redis, activityId, { refresh: true });

/** The policy in Redis, or undefined when none was written (the api then uses the defaults). */
export async function readTrafficPolicy(
  redis: RedisClient,
  activityId: string,
): Promise<TrafficPolicy | undefined> {
  const raw = await redis.get(activityKeys(activityId).policy);
  if (raw === null) return undefined;
  const parsed = trafficPolicySchema.safeParse(JSON.parse(raw) as unknown);
  return parsed.success ? parsed.data : undefined;
}

/** Buyer-hash fields of eligibility; `~` cannot start a sku id (keys.ts SAFE_ID), so no clash. */
export const ELIGIBILITY_FIELDS = { registered: '~reg', denied: '~deny' } as const;

export type RegisterOutcome = 'registered' | 'already-registered';

/**
 * Pre-registration: allowed from cache loading until the sale starts, judged by the Redis clock like
 * the sale window (and refused once the sale is closed). Not one script: registration only ever adds a flag, and a flag that lands
 * just after startAt admits a buyer who asked in time, so no interleaving breaks the rule that
 * only buyers who registered before the start may reserve. Reserving reads the flag atomically.
 *
 * `db` (the api always passes it) records the registration in PostgreSQL first
 * (`activity_registrations`, idempotent), before any flag: a cache restore flags the buyer again
 * from there once Redis lost them (core/cache-restore.ts), since nobody can register after the
 * start. Then the buyer joins the activity's `registered` set, before the layout is read: a load
 * adding a bucketed SKU flags the set's buyers in its buckets after it wrote the layout
 * (core/activity-cache.ts), so a buyer is flagged in a new bucket by one side or the other.
 *
 * `ack` (the api passes its RESERVE_ACK): the flags must reach a replica before the buyer is told
 * they are registered, as a reservation must before its 202. A failover to a replica without them
 * would refuse a registered buyer at the start (403 NOT_REGISTERED), and nobody can register again
 * then; no restore runs for a failover that lost only a suffix of writes. Not confirmed:
 * NOT_REPLICATED (503), and a repeat of the registration (idempotent) confirms again.
 */
export async function registerBuyer(
  redis: RedisClient,
  activityId: string,
  userId: string,
  db?: Queryable,
  ack: ReservationAck = localAck,
): Promise<RegisterOutcome> {
  const k = activityKeys(activityId);
  const [metaReply, timeReply] = (await redis
    .pipeline()
    .hmget(k.meta, 'gate', 'startMs', 'requireReg')
    .time()
    .exec()) ?? [[new Error('pipeline aborted'), null]];
  const failed = metaReply?.[0] ?? timeReply?.[0];
  if (failed) throw failed;
  const meta = metaReply?.[1] as (string | null)[];
  const time = timeReply?.[1] as [string, string];
  const [gate, startMs, requireReg] = meta;
  if (!gate)
    throw new FlashSaleError('NOT_STARTED', 'the activity is not loaded yet; registration opens at warm-up');
  if (requireReg !== '1') throw new FlashSaleError('REGISTRATION_DISABLED');
  const now = Number(time[0]) * 1000 + Math.floor(Number(time[1]) / 1000);
  if (gate === 'closed' || gate === 'frozen' || now >= Number(startMs)) {
    throw new FlashSaleError('REGISTRATION_CLOSED', 'registration closes when the sale starts');
  }
  if (db) await recordRegistration(db, activityId, userId);
  await redis.sadd(k.registered, userId);
  const layout = await currentLayout(redis, activityId);
  // The buyer's stock buckets first: the activity's flag is what a repeat checks.
  await bucketFlags(redis, layout, [userId], ELIGIBILITY_FIELDS.registered, true);
  const added = await redis.hsetnx(k.buyer(userId), ELIGIBILITY_FIELDS.registered, '1');
  // Every scope holding one of the buyer's flags (a cluster node each); a probe write first in each.
  try {
    await Promise.all(layout.scopesForUser(userId).map((scope) => ack.confirm(activityId, '', true, scope)));
  } catch (err) {
    if (!(err instanceof FlashSaleError) || err.code !== 'NOT_REPLICATED') throw err;
    throw new FlashSaleError(
      'NOT_REPLICATED',
      'the registration is not on a replica yet; register again (a repeat is harmless)',
    );
  }
  return added === 1 ? 'registered' : 'already-registered';
}

/** Whether the buyer registered (for the api's answer to a registration lookup). */
export async function isRegistered(redis: RedisClient, activityId: string, userId: string): Promise<boolean> {
  return (await redis.hexists(activityKeys(activityId).buyer(userId), ELIGIBILITY_FIELDS.registered)) === 1;
}

function throwFirstError(replies: [Error | null, unknown][] | null): void {
  const failed = (replies ?? []).find(([err]) => err !== null);
  if (failed?.[0]) throw failed[0];
}

export interface DenyListOutcome {
  /** Listed buyers the `denied` set did not name yet. */
  added: number;
  removed: number;
}

/**
 * Makes the deny flags of the activity's buyers equal to `userIds`: flags each listed buyer's hash
 * (reserve-9.lua refuses them atomically with the reservation) and clears buyers a previous list
 * named but this one does not. Idempotent; a repeat after a crash completes the same state.
 *
 * Every listed buyer's flag is written again on every call, not only the buyers the `denied` set
 * does not name yet: a buyer hash can lose its flag while the set keeps the buyer (a cluster node
 * holding a bucket lost its data, a failover lost a suffix of writes, a cache restore rebuilt the
 * hash), and a flag only the set remembers refuses nobody. The cost is one pipelined HSET per
 * listed buyer and scope a pass (docs/operator.md "Traffic shaping and eligibility").
 */
export async function syncDenyList(
  redis: RedisClient,
  activityId: string,
  userIds: readonly string[],
): Promise<DenyListOutcome> {
  const k = activityKeys(activityId);
  const wanted = [...new Set(userIds)];
  const wantedSet = new Set(wanted);
  const current = new Set(await redis.smembers(k.denied));
  const added = wanted.filter((u) => !current.has(u)).length;
  const remove = [...current].filter((u) => !wantedSet.has(u));
  const layout = await currentLayout(redis, activityId);
  const CHUNK = 1000;
  for (let i = 0; i < wanted.length; i += CHUNK) {
    const part = wanted.slice(i, i + CHUNK);
    await bucketFlags(redis, layout, part, ELIGIBILITY_FIELDS.denied, true);
    // The set with the activity's flags (one slot, one pipeline): a crash in between leaves a
    // listed buyer whose flag the repeat writes (every listed buyer's is), never a flag nobody
    // tracks.
    const p = redis.pipeline().sadd(k.denied, ...part);
    for (const u of part) p.hset(k.buyer(u), ELIGIBILITY_FIELDS.denied, '1');
    throwFirstError(await p.exec());
  }
  for (let i = 0; i < remove.length; i += CHUNK) {
    const part = remove.slice(i, i + CHUNK);
    await bucketFlags(redis, layout, part, ELIGIBILITY_FIELDS.denied, false);
    const p = redis.pipeline();
    for (const u of part) p.hdel(k.buyer(u), ELIGIBILITY_FIELDS.denied);
    p.srem(k.denied, ...part);
    throwFirstError(await p.exec());
  }
  return { added, removed: remove.length };
}
