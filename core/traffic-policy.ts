/**
 * An activity's traffic policy: rate limits per buyer and per client address, and eligibility
 * (pre-registration, deny list, order codes per buyer). The operator writes it next to the cache
 * it loads (merged over its configured defaults); every api replica reads it from Redis, the same
 * way it learns the rest of the activity's definition. docs/operator.md "Traffic shaping and
 * eligibility" describes the fields.
 */
import { z } from 'zod';
import { FlashSaleError } from './errors.js';
import { activityKeys } from './keys.js';
import { bucketLayout } from './buckets.js';
import type { RedisClient } from './scripts.js';

export const rateLimitSchema = z
  .object({
    /** Requests allowed per window; 0 switches this limit off. */
    requests: z.number().int().min(0).max(1_000_000),
    /** The window, in seconds. */
    perSeconds: z.number().int().min(1).max(86_400),
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
        orderCodesPerBuyerPerSku: z.number().int().min(0).max(1000),
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

/**
 * Sets or clears an eligibility flag in the buyer's hash of every stock bucket the buyer's
 * reservations can be in (one command per bucket: each has its own slot).
 */
async function bucketFlags(
  redis: RedisClient,
  activityId: string,
  userIds: readonly string[],
  field: string,
  set: boolean,
): Promise<void> {
  const layout = await bucketLayout(redis, activityId);
  if (layout.counts.size === 0) return;
  const writes: Promise<unknown>[] = [];
  for (const u of userIds) {
    for (const scope of layout.scopesForUser(u).slice(1)) {
      writes.push(set ? redis.hset(scope.buyer(u), field, '1') : redis.hdel(scope.buyer(u), field));
    }
  }
  await Promise.all(writes);
}

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
 */
export async function registerBuyer(
  redis: RedisClient,
  activityId: string,
  userId: string,
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
  // The buyer's stock buckets first: the activity's flag is what a repeat checks.
  await bucketFlags(redis, activityId, [userId], ELIGIBILITY_FIELDS.registered, true);
  const added = await redis.hsetnx(k.buyer(userId), ELIGIBILITY_FIELDS.registered, '1');
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
  added: number;
  removed: number;
}

/**
 * Makes the deny flags of the activity's buyers equal to `userIds`: flags each listed buyer's hash
 * (reserve-9.lua refuses them atomically with the reservation) and clears buyers a previous list
 * named but this one does not. Idempotent; a repeat after a crash completes the same state.
 */
export async function syncDenyList(
  redis: RedisClient,
  activityId: string,
  userIds: readonly string[],
): Promise<DenyListOutcome> {
  const k = activityKeys(activityId);
  const wanted = new Set(userIds);
  const current = new Set(await redis.smembers(k.denied));
  const add = [...wanted].filter((u) => !current.has(u));
  const remove = [...current].filter((u) => !wanted.has(u));
  const CHUNK = 1000;
  for (let i = 0; i < add.length; i += CHUNK) {
    const part = add.slice(i, i + CHUNK);
    // The buyers' stock buckets before the set: a repeat skips buyers the set already names.
    await bucketFlags(redis, activityId, part, ELIGIBILITY_FIELDS.denied, true);
    // The set is written first: a crash in between leaves a listed buyer whose flag the repeat
    // still writes (it is in `wanted`, and HSET is idempotent), never a flag nobody tracks.
    const p = redis.pipeline().sadd(k.denied, ...part);
    for (const u of part) p.hset(k.buyer(u), ELIGIBILITY_FIELDS.denied, '1');
    throwFirstError(await p.exec());
  }
  for (let i = 0; i < remove.length; i += CHUNK) {
    const part = remove.slice(i, i + CHUNK);
    await bucketFlags(redis, activityId, part, ELIGIBILITY_FIELDS.denied, false);
    const p = redis.pipeline();
    for (const u of part) p.hdel(k.buyer(u), ELIGIBILITY_FIELDS.denied);
    p.srem(k.denied, ...part);
    throwFirstError(await p.exec());
  }
  return { added: add.length, removed: remove.length };
}
