/**
 * Reservation operations over the cache: reserve, release, confirm. Each is one script call;
 * the scripts hold the rules, this module only supplies keys and arguments.
 */
import { createHash } from 'node:crypto';
import { bucketLayout, completeTransfers, knownBucketLayout, refillBucket, unitsLeft } from './buckets.js';
import type { BucketLayout } from './buckets.js';
import { FlashSaleError, scriptError } from './errors.js';
import { activityKeys, BucketKeys } from './keys.js';
import type { ScopeKeys } from './keys.js';
import { CANCEL_MARKER_STATE, CLAIM_STATE, reservationRecordOf } from './order-message.js';
import type { ReservationRecord, ReservationState } from './order-message.js';
import type { RedisClient, ScriptReply } from './scripts.js';
import { scriptBatch } from './script-batch.js';
import { runScript } from './scripts.js';
import { checkSoldOut } from './sold-out-checks.js';

/**
 * Reservation ids are derived from (activity, buyer, requestId): a retried submission maps to
 * the same id (the script replays it), and a cancellation can name a reservation that has not
 * arrived yet.
 */
export function reservationIdFor(activityId: string, userId: string, requestId: string): string {
  return createHash('sha256')
    .update(`${activityId}\n${userId}\n${requestId}`)
    .digest('base64url')
    .slice(0, 22);
}

/**
 * The per-buyer rate limit a submission counts against (docs/operator.md "Traffic shaping and
 * eligibility"): a fixed window of `perSeconds`, counted in the buyer's counter
 * (ActivityKeys.rateLimitKey) by the reservation's own script call.
 */
export interface BuyerWindow {
  /** Submissions per window; 0: not limited. */
  requests: number;
  perSeconds: number;
}

/** The buyer's window after a submission counted in it. */
export interface WindowCount {
  /** Points of the window, this submission's included. */
  consumed: number;
  /** Milliseconds until the window ends. */
  ttlMs: number;
}

export interface ReserveInput {
  activityId: string;
  userId: string;
  skuId: string;
  quantity: number;
  requestId: string;
  traceId: string;
  orderCode?: string | undefined;
  /** Count the submission in this window (absent: not counted, e.g. already counted). */
  window?: BuyerWindow | undefined;
}

export type ReserveOutcome = (
  | { kind: 'reserved'; reservationId: string; stockLeft: number }
  | { kind: 'replayed'; reservationId: string; state: ReservationState }
) & {
  /** The scope (activity or stock bucket) the reservation lives in: its node for a replica wait. */
  scope: ScopeKeys;
  /** The buyer's window when this call counted the submission in it (never for a replay in the
   * activity's scope, which is answered before the limit). */
  counted?: WindowCount | undefined;
};

/**
 * The wait in ms a refusal from a script carries (its reply's next element): the window's rest of
 * a RATE_LIMITED, the time to the sale's end of a CANCEL_MARKER_LIMIT.
 */
export function retryAfterMs(err: FlashSaleError): number {
  const data = (err.extra as { data?: unknown[] }).data;
  const ms = Number(data?.[0]);
  return Number.isFinite(ms) && ms > 0 ? ms : 1000;
}

/**
 * The units left that a SOLD_OUT from reserve() carries (reserve-9.lua's reply, or the sum over a
 * bucketed SKU's buckets): more than 0 when the buyer asked for more than is left, which is not
 * the SKU sold out for everyone. Undefined when the error carries no figure.
 */
export function stockLeftOf(err: FlashSaleError): number | undefined {
  const data = (err.extra as { data?: unknown[] }).data;
  const left = Number(data?.[0]);
  return data && data.length > 0 && Number.isFinite(left) ? left : undefined;
}

/**
 * The window a script's reply counted the submission in; undefined for 0 points, which a script
 * that was passed a window answers only when Redis, at its maxmemory, refused the count
 * (lua/includes/buyerWindow.lua): nothing counted, so there is no point to give back.
 */
function countOf(consumed: unknown, ttlMs: unknown): WindowCount | undefined {
  const points = Number(consumed);
  return points > 0 ? { consumed: points, ttlMs: Number(ttlMs) } : undefined;
}

/**
 * Counts a submission in the buyer's window in a call of its own (countWindow-1.lua): for the
 * scopes whose keys are not in the activity's slot (stock buckets). Throws RATE_LIMITED.
 */
async function countAlone(redis: RedisClient, activityId: string, userId: string, w: BuyerWindow) {
  const reply = await runScript(
    redis,
    'countWindow',
    [activityKeys(activityId).rateLimitKey('buyer', userId)],
    [w.requests, w.perSeconds],
  );
  return countOf(reply[1], reply[2]);
}

const limited = (w: BuyerWindow | undefined): BuyerWindow | undefined =>
  w && w.requests > 0 ? w : undefined;

/**
 * The refusals after which a bucket holds nothing under the submission's id: its claim in the
 * activity's scope is taken back (unclaimRequest-1.lua). After any other outcome (a replay, a
 * conflict, a cancel marker, an error that leaves it unknown) the claim stays: a claim too many
 * only refuses a requestId used again for another SKU, a claim too few would let it reserve twice.
 */
const NOTHING_RESERVED = new Set<string>([
  'SOLD_OUT',
  'LIMIT_REACHED',
  'NOT_STARTED',
  'ENDED',
  'PAUSED',
  'UNKNOWN_SKU',
  'INVALID_ORDER_CODE',
  'FROZEN',
  'NOT_LOADED',
  'BUYER_DENIED',
  'NOT_REGISTERED',
  // Units only in flight between stock buckets, not yet safe to land (reserveClaimed).
  'UNAVAILABLE',
]);

/**
 * Reserves in the buyer's scope: the activity's, or the buyer's home bucket of a bucketed SKU.
 * A home bucket out of units is refilled from the other buckets (crash-safe transfers,
 * core/buckets.ts) and the reservation tried again, so SOLD_OUT means every bucket is empty.
 * A bucket reservation of a submission counted in the buyer's window (the default) first claims
 * its id in the activity's scope, in the call that counts it (claimRequest-2.lua), so one requestId
 * cannot reserve in two scopes. Without a window there is no such call, and none is added: a
 * second call per reservation on the activity's node is what buckets exist to avoid
 * (ARCHITECTURE.md "Stock buckets").
 */
export async function reserve(redis: RedisClient, input: ReserveInput): Promise<ReserveOutcome> {
  let claim: string | undefined;
  let counted: WindowCount | undefined;
  try {
    return await reserveClaimed(
      redis,
      input,
      (c) => (claim = c),
      (c) => (counted = c),
    );
  } catch (err) {
    if (claim && err instanceof FlashSaleError && NOTHING_RESERVED.has(err.code)) {
      await runScript(redis, 'unclaimRequest', [claim], []);
    }
    // Counted by a call of its own (a bucketed SKU's claim) before the one that failed: the
    // caller gives the point back if it answers 5xx, as for a script that counts and fails.
    if (counted && err instanceof Error) (err as Error & { [COUNTED]?: WindowCount })[COUNTED] = counted;
    throw err;
  }
}

const COUNTED = Symbol('windowCounted');

/** The submission's count in the buyer's window when a failed reserve() had counted it already. */
export function countedBeforeFailure(err: unknown): WindowCount | undefined {
  return err instanceof Error ? (err as Error & { [COUNTED]?: WindowCount })[COUNTED] : undefined;
}

/**
 * What a bucket reservation's claim tells its bucket (reserve-9.lua ARGV[11]): nothing (''), the
 * claim met this buyer's cancel marker ('1': the bucket only replays), or a full Redis refused the
 * claim ('2': the bucket only gives the answers that write nothing).
 */
type ClaimMode = '' | '1' | '2';

async function reserveClaimed(
  redis: RedisClient,
  input: ReserveInput,
  claimed: (claimKey: string) => void,
  countedApart: (count: WindowCount) => void,
): Promise<ReserveOutcome> {
  let layout = knownBucketLayout(input.activityId) ?? (await bucketLayout(redis, input.activityId));
  // The submission counts once in the buyer's window, however many attempts it takes.
  let window = limited(input.window);
  const shaped = window !== undefined;
  let counted: WindowCount | undefined;
  let claimChecked = false;
  let claimMode: ClaimMode = '';
  let claimRefusal = '';
  for (let attempt = 0; ; attempt += 1) {
    const scope = layout.scopeFor(input.skuId, input.userId);
    // Counted already by a BUCKETED answer (a layout this process had not seen): the claim alone.
    if (scope instanceof BucketKeys && shaped && !claimChecked) {
      // The claim and the counter are in the activity's slot, the bucket's keys in another: two
      // calls here, the claim counting the submission.
      const own = activityKeys(input.activityId);
      const key = own.reservation(reservationIdFor(input.activityId, input.userId, input.requestId));
      const counter = window ? own.rateLimitKey('buyer', input.userId) : own.none;
      const reply = await runScript(
        redis,
        'claimRequest',
        [key, counter],
        [input.userId, input.skuId, input.quantity, window?.requests ?? 0, window?.perSeconds ?? 0],
      );
      if (window) {
        counted = countOf(reply[1], reply[2]);
        if (counted) countedApart(counted);
      }
      if (reply[0] === 1) claimed(key);
      if (reply[0] === 2) claimMode = '1';
      if (reply[0] === 3) {
        claimMode = '2';
        claimRefusal = String(reply[3]);
      }
      window = undefined;
      claimChecked = true;
    }
    try {
      const outcome = await reserveIn(redis, scope, input, window, claimMode);
      // The bucket would have reserved: refused as the claim was, as any reservation on a full
      // Redis is (core/errors.ts dependencyOutage: 503, nothing written).
      if (outcome.kind === 'unclaimed') throw new Error(claimRefusal);
      return outcome.counted || !counted ? outcome : { ...outcome, counted };
    } catch (err) {
      if (!(err instanceof FlashSaleError)) throw err;
      if (attempt >= 200) {
        // Outrun by other buyers' refills this often: the bucket's own SOLD_OUT speaks for the
        // bucket only, never for the SKU (a phantom sold-out the api would flag for everyone).
        if (!(err.code === 'SOLD_OUT' && scope instanceof BucketKeys)) throw err;
        const left = await unitsLeft(redis, layout, input.skuId);
        if (left < input.quantity)
          throw new FlashSaleError('SOLD_OUT', undefined, { script: 'reserve', data: [left] });
        throw new FlashSaleError(
          'UNAVAILABLE',
          `units of ${input.skuId} keep moving between stock buckets; retry`,
        );
      }
      if (err.code === 'BUCKETED') {
        // A SKU bucketed by a load this process has not seen: read the layout again. The
        // activity-scope call counted the submission already.
        const data = (err.extra as { data?: unknown[] }).data ?? [];
        if (window && data.length >= 2) {
          counted = countOf(data[0], data[1]);
          if (counted) countedApart(counted);
          window = undefined;
        }
        layout = await bucketLayout(redis, input.activityId, { refresh: true });
        continue;
      }
      if (err.code !== 'SOLD_OUT' || !(scope instanceof BucketKeys)) throw err;
      // The SKU's units left over all its buckets, as the script's SOLD_OUT carries its own.
      await refillAfterSoldOut(
        redis,
        layout,
        input.skuId,
        scope,
        input.quantity,
        (left) => new FlashSaleError('SOLD_OUT', undefined, { script: 'reserve', data: [left] }),
      );
    }
  }
}

/**
 * After a stock bucket answered SOLD_OUT: moves units in from the other buckets (crash-safe
 * transfers) so that the caller tries again, unless none has them. Units stranded by a transfer
 * whose process died half-way, or whose donor record was not confirmed on its node's replica,
 * count too once they land. Every donor emptied by other refills meanwhile: throws `soldOut(left)`
 * only if no bucket has `quantity` units, and UNAVAILABLE (a retry, not a phantom SOLD_OUT, and not
 * a loop of one-second WAITs) when the units left are only in flight and not yet safe to land.
 */
async function refillAfterSoldOut(
  redis: RedisClient,
  layout: BucketLayout,
  skuId: string,
  scope: BucketKeys,
  quantity: number,
  soldOut: (left: number) => Error,
): Promise<void> {
  const moved = await refillBucket(redis, layout, skuId, scope, quantity);
  const stranded = moved === 0 ? await completeTransfers(redis, layout, skuId) : undefined;
  if (!stranded || stranded.landed > 0) return;
  const left = await unitsLeft(redis, layout, skuId);
  if (left < quantity) throw soldOut(left);
  if (stranded.unconfirmed > 0)
    throw new FlashSaleError(
      'UNAVAILABLE',
      `${stranded.unconfirmed} unit(s) of ${skuId} are moving between stock buckets; retry`,
    );
}

/** Reservations per call at most: a bound on one call's keys and on its time in Redis. */
export const RESERVATIONS_PER_CALL = 64;

/** One reservation's keys and arguments: reserve-9.lua's, in its order. */
interface ReserveCall {
  keys: string[];
  args: (string | number)[];
}

/**
 * The reservations of one turn of the event loop in one scope, in one call
 * (lua/reserveMany-var.lua runs reserve-9.lua's body for each, in order; ARCHITECTURE.md "One Redis
 * call per submission"). Each is answered with its own reply, or fails alone: its code through
 * core/errors.ts, an error of its own part as its own call's ReplyError would.
 */
const reserveBatched = scriptBatch<ReserveCall, ScriptReply>({
  script: 'reserveMany',
  maxCalls: RESERVATIONS_PER_CALL,
  leadingArgs: (calls) => [calls.length],
  encode: (c, keys, args) => {
    keys.push(...c.keys);
    args.push(...c.args);
  },
  answer: (reply, i) => {
    const own = reply[1 + i] as unknown as ScriptReply;
    if (String(own[0]) === 'ERR') return Object.assign(new Error(String(own[1])), { name: 'ReplyError' });
    const code = Number(own[0]);
    return code < 0 ? scriptError('reserve', code, own.slice(1)) : own;
  },
});

async function reserveIn(
  redis: RedisClient,
  k: ScopeKeys,
  input: ReserveInput,
  window: BuyerWindow | undefined,
  claimMode: ClaimMode = '',
): Promise<ReserveOutcome | { kind: 'unclaimed' }> {
  const rid = reservationIdFor(input.activityId, input.userId, input.requestId);
  // Only an activity scope is passed a window (reserve() counts a bucket's apart): its counter
  // shares the activity's hash tag.
  const counter = window ? activityKeys(input.activityId).rateLimitKey('buyer', input.userId) : k.none;
  const reply = await reserveBatched(redis, k.prefix, {
    keys: [
      k.meta,
      k.sku(input.skuId),
      k.buyer(input.userId),
      k.reservation(rid),
      k.outbox,
      k.ledger,
      k.counters,
      input.orderCode ? k.orderCode(input.orderCode) : k.none,
      counter,
    ],
    args: [
      rid,
      input.userId,
      input.skuId,
      input.quantity,
      input.requestId,
      input.traceId,
      input.orderCode ?? '',
      input.activityId,
      window?.requests ?? 0,
      window?.perSeconds ?? 0,
      claimMode,
    ],
  });
  if (reply[0] === 3) return { kind: 'unclaimed' };
  if (reply[0] === 1)
    return {
      kind: 'reserved',
      reservationId: rid,
      stockLeft: Number(reply[2]),
      scope: k,
      counted: window ? countOf(reply[3], reply[4]) : undefined,
    };
  // The id's claim (claimRequest-2.lua): its reservation is in a bucket of a SKU this process
  // took for an ordinary one (bucketed by a load it has not seen; the claim answered before the
  // script's own BUCKETED check, uncounted): read the layout again and go there.
  if (String(reply[2]) === CLAIM_STATE)
    throw new FlashSaleError('BUCKETED', undefined, { script: 'reserve' });
  return { kind: 'replayed', reservationId: rid, state: String(reply[2]) as ReservationState, scope: k };
}

export interface ReleaseInput {
  activityId: string;
  reservationId: string;
  userId: string;
  skuId: string;
  reason: string;
  /**
   * What the release gives back (default: both). An order the PostgreSQL stock guard closed
   * withholds its unit, and keeps the buyer's slot when it was closed for the buyer's limit
   * (core/order-lifecycle.ts, `guardRelease`).
   */
  returnStock?: boolean;
  freeSlot?: boolean;
}

export type ReleaseOutcome = { kind: 'released'; stockAfter: number } | { kind: 'already-released' };

/**
 * Runs one of the scripts that settle a reservation (release-6.lua, returnWithheld-6.lua): the same
 * six keys in the buyer's scope, and the reservation, buyer and SKU first among the arguments.
 */
async function runOnReservation(
  redis: RedisClient,
  script: 'release' | 'returnWithheld',
  input: { activityId: string; reservationId: string; userId: string; skuId: string },
  args: string[],
): Promise<ScriptReply> {
  const k = (await bucketLayout(redis, input.activityId)).scopeFor(input.skuId, input.userId);
  return runScript(
    redis,
    script,
    [
      k.meta,
      k.reservation(input.reservationId),
      k.sku(input.skuId),
      k.buyer(input.userId),
      k.ledger,
      k.counters,
    ],
    [input.reservationId, input.userId, input.skuId, ...args],
  );
}

export async function release(redis: RedisClient, input: ReleaseInput): Promise<ReleaseOutcome> {
  const reply = await runOnReservation(redis, 'release', input, [
    input.reason,
    activityKeys(input.activityId).restockChannel,
    input.returnStock === false ? '0' : '1',
    input.freeSlot === false ? '0' : '1',
  ]);
  if (reply[0] === 1) return { kind: 'released', stockAfter: Number(reply[1]) };
  return { kind: 'already-released' };
}

export interface ReturnWithheldInput {
  activityId: string;
  /** The guard-closed reservation whose unit was withheld. */
  reservationId: string;
  userId: string;
  skuId: string;
  /** The closed order (its reservation forgotten by Redis) the unit is given back for. */
  forOrderId: string;
}

export type ReturnWithheldOutcome =
  { kind: 'returned'; stockAfter: number } | { kind: 'returned-earlier'; forOrderId: string };

/**
 * Gives back, once, the unit a guard-closed reservation withheld, for the forgotten order it stood
 * in for (returnWithheld-6.lua; core/order-lifecycle.ts settleForgotten). NOT_WITHHELD when the
 * reservation was not released with its unit withheld.
 */
export async function returnWithheld(
  redis: RedisClient,
  input: ReturnWithheldInput,
): Promise<ReturnWithheldOutcome> {
  const reply = await runOnReservation(redis, 'returnWithheld', input, [
    input.forOrderId,
    activityKeys(input.activityId).restockChannel,
  ]);
  if (reply[0] === 1) return { kind: 'returned', stockAfter: Number(reply[1]) };
  return { kind: 'returned-earlier', forOrderId: String(reply[1]) };
}

/** The order a withheld unit was given back for (returnWithheld-6.lua), if it was. */
export async function withheldReturnedFor(
  redis: RedisClient,
  input: Omit<ReturnWithheldInput, 'forOrderId'>,
): Promise<string | undefined> {
  const k = (await bucketLayout(redis, input.activityId)).scopeFor(input.skuId, input.userId);
  return (await redis.hget(k.reservation(input.reservationId), 'withheldReturnedFor')) ?? undefined;
}

/**
 * Whether Redis no longer holds this reservation's unit: released with its stock returned
 * (release-6.lua), or withheld and given back since (returnWithheld-6.lua).
 */
export async function unitBackInRedis(
  redis: RedisClient,
  input: Omit<ReturnWithheldInput, 'forOrderId'>,
): Promise<boolean> {
  const k = (await bucketLayout(redis, input.activityId)).scopeFor(input.skuId, input.userId);
  const [state, withheld, returnedFor] = await redis.hmget(
    k.reservation(input.reservationId),
    'state',
    'withheld',
    'withheldReturnedFor',
  );
  return state === 'RELEASED' && (withheld === null || returnedFor !== null);
}

/** Bounds of cancel markers (docs/after-sale.md, "Cancelling before the reservation arrives"). */
export interface CancelMarkerPolicy {
  /** Seconds a marker outlives the sale's end (covers an endAt extended after the marker). */
  graceSeconds: number;
  /** Most markers one buyer may leave per activity. */
  maxPerBuyer: number;
}

export const DEFAULT_CANCEL_MARKER_POLICY: CancelMarkerPolicy = { graceSeconds: 86_400, maxPerBuyer: 16 };

export type CancelMarkerOutcome =
  | { kind: 'marked'; ttlSeconds: number }
  | { kind: 'exists'; state: ReservationState }
  | { kind: 'sale-over' };

/**
 * Marks a submission of this buyer as cancelled before it reached the cache, so the late
 * submission is refused. The id is derived here from the buyer's own requestId: no caller can
 * mark an id it chose, so nobody can mark another buyer's submission or a made-up id.
 */
export async function cancelBeforeReserve(
  redis: RedisClient,
  input: { activityId: string; userId: string; requestId: string; reason: string },
  policy: CancelMarkerPolicy = DEFAULT_CANCEL_MARKER_POLICY,
): Promise<CancelMarkerOutcome> {
  const rid = reservationIdFor(input.activityId, input.userId, input.requestId);
  // The submission's SKU is not known: its reservation would be in one of the buyer's scopes (the
  // activity's, or the buyer's home bucket of a bucketed SKU), so each gets the marker.
  const scopes = (await bucketLayout(redis, input.activityId)).scopesForUser(input.userId);
  const outcomes: CancelMarkerOutcome[] = [];
  for (const k of scopes) {
    const reply = await runScript(
      redis,
      'cancelBeforeReserve',
      [k.meta, k.reservation(rid), k.buyer(input.userId)],
      [input.userId, input.reason, Math.max(1, policy.graceSeconds), Math.max(0, policy.maxPerBuyer)],
    );
    // A claim (claimRequest-2.lua) says the reservation is in a bucket: look there.
    if (reply[0] === 2 && reply[1] === CLAIM_STATE) continue;
    // This buyer's marker from an earlier cancellation, perhaps one that stopped before the
    // buyer's other scopes (a crash, a lost connection): the rest are marked now.
    if (reply[0] === 2 && reply[1] === CANCEL_MARKER_STATE) {
      outcomes.push({ kind: 'exists', state: CANCEL_MARKER_STATE });
      continue;
    }
    if (reply[0] === 2) return { kind: 'exists', state: String(reply[1]) as ReservationState };
    outcomes.push(reply[0] === 1 ? { kind: 'marked', ttlSeconds: Number(reply[1]) } : { kind: 'sale-over' });
  }
  return (
    outcomes.find((o) => o.kind === 'marked') ??
    outcomes.find((o) => o.kind === 'exists') ?? { kind: 'sale-over' }
  );
}

/**
 * Puts a buyer's cancel marker back in each of `scopes` where the reservation id names nothing
 * (a cache restore: core/cache-restore.ts), with the marker's usual expiry; idempotent (a marker
 * or reservation already there is kept). Restored markers are not held to the per-buyer bound:
 * each was admitted under it.
 */
export async function restoreCancelMarker(
  redis: RedisClient,
  scopes: readonly ScopeKeys[],
  reservationId: string,
  userId: string,
): Promise<void> {
  for (const k of scopes) {
    await runScript(
      redis,
      'cancelBeforeReserve',
      [k.meta, k.reservation(reservationId), k.buyer(userId)],
      [userId, 'CANCELLED', DEFAULT_CANCEL_MARKER_POLICY.graceSeconds, Number.MAX_SAFE_INTEGER],
    );
  }
}

/** Where a reservation is (buyer and SKU): which scope holds it. */
export interface ReservationOwner {
  userId: string;
  skuId?: string | undefined;
}

/** The scopes a reservation of this owner can be in: one when the SKU is known. */
async function scopesOf(
  redis: RedisClient,
  activityId: string,
  owner?: ReservationOwner,
): Promise<ScopeKeys[]> {
  if (!owner) return [activityKeys(activityId)];
  const layout = await bucketLayout(redis, activityId);
  if (owner.skuId !== undefined) return [layout.scopeFor(owner.skuId, owner.userId)];
  return layout.scopesForUser(owner.userId);
}

export async function confirmPaid(
  redis: RedisClient,
  activityId: string,
  reservationId: string,
  owner?: ReservationOwner & { skuId: string },
): Promise<'paid' | 'already-paid'> {
  const [k] = (await scopesOf(redis, activityId, owner)) as [ScopeKeys];
  const reply = await runScript(
    redis,
    'confirmPaid',
    [k.reservation(reservationId), k.meta],
    [reservationId],
  );
  return reply[0] === 1 ? 'paid' : 'already-paid';
}

export type ReclaimOutcome =
  { kind: 'taken-back'; stockAfter: number } | { kind: 'already-paid' } | { kind: 'still-held' };

/** Refills of a bucketed SKU's home bucket one late payment tries before it is SOLD_OUT. */
const RECLAIM_REFILLS = 8;

/**
 * Takes a released reservation's unit back and marks it PAID, or marks a still-reserved one PAID
 * (reclaimPaid-5.lua): for a payment made in time for an order the timeout closed. Throws
 * SOLD_OUT, LIMIT_REACHED, FROZEN, ... when it cannot (nothing changed then).
 *
 * A bucketed SKU's unit went back to the buyer's home bucket; sold again there, the payment takes
 * one moved in from another bucket (crash-safe transfers, as a reservation does), so a payment in
 * time is refunded only when no bucket has a unit: not a phantom sold-out. Units only in flight
 * between buckets, not yet safe to land, are UNAVAILABLE (the provider retries), not SOLD_OUT.
 */
export async function reclaimPaid(
  redis: RedisClient,
  input: { activityId: string; reservationId: string; userId: string; skuId: string; quantity: number },
): Promise<ReclaimOutcome> {
  const layout = await bucketLayout(redis, input.activityId);
  const k = layout.scopeFor(input.skuId, input.userId);
  for (let attempt = 0; ; attempt += 1) {
    let reply: ScriptReply;
    try {
      reply = await runScript(
        redis,
        'reclaimPaid',
        [k.meta, k.reservation(input.reservationId), k.sku(input.skuId), k.buyer(input.userId), k.counters],
        [input.reservationId, input.userId, input.skuId],
      );
    } catch (err) {
      if (!isSoldOut(err) || !(k instanceof BucketKeys)) throw err;
      if (attempt >= RECLAIM_REFILLS) {
        // Outrun by other buyers' refills this often: the home bucket's SOLD_OUT speaks for the
        // bucket only. Refused for the SKU (the payment refunded) only when no bucket has a unit;
        // otherwise a retry (the provider's redelivery), as reserve() answers.
        if ((await unitsLeft(redis, layout, input.skuId)) < input.quantity) throw err;
        throw new FlashSaleError(
          'UNAVAILABLE',
          `units of ${input.skuId} keep moving between stock buckets; retry`,
        );
      }
      await refillAfterSoldOut(redis, layout, input.skuId, k, input.quantity, () => err);
      continue;
    }
    if (reply[0] === 1) return { kind: 'taken-back', stockAfter: Number(reply[1]) };
    if (reply[0] === 2) return { kind: 'already-paid' };
    return { kind: 'still-held' };
  }
}

const isSoldOut = (err: unknown): err is FlashSaleError =>
  err instanceof FlashSaleError && err.code === 'SOLD_OUT';

export type { ReservationRecord } from './order-message.js';
export { orderMessageOf } from './order-message.js';

export type SoldOutCheck =
  /** A reservation or cancel marker exists under the derived id: reserve() replays it. */
  | { kind: 'replay'; counted?: WindowCount | undefined }
  /** Not a replay: the answer is SOLD_OUT. */
  | { kind: 'sold-out'; counted?: WindowCount | undefined };

/**
 * The sold-out fast path's check (soldOutChecks-var.lua): a replay (which still gets its
 * reservation, not SOLD_OUT), else the submission's point in the buyer's window, in one call in the
 * activity's scope, shared with the other checks of this turn of the event loop in that scope
 * (core/sold-out-checks.ts). A bucketed SKU's reservation is in another slot than the counter: two
 * calls there.
 * Throws RATE_LIMITED. A 'replay' that `counted` must not be counted again by reserve().
 */
export async function soldOutCheck(
  redis: RedisClient,
  input: {
    activityId: string;
    userId: string;
    skuId: string;
    requestId: string;
    window?: BuyerWindow | undefined;
  },
): Promise<SoldOutCheck> {
  const rid = reservationIdFor(input.activityId, input.userId, input.requestId);
  const layout = knownBucketLayout(input.activityId) ?? (await bucketLayout(redis, input.activityId));
  const k = layout.scopeFor(input.skuId, input.userId);
  let window = limited(input.window);
  let counted: WindowCount | undefined;
  if (window && k instanceof BucketKeys) {
    counted = await countAlone(redis, input.activityId, input.userId, window);
    window = undefined;
  }
  const counter = window ? activityKeys(input.activityId).rateLimitKey('buyer', input.userId) : k.none;
  let answer;
  try {
    answer = await checkSoldOut(redis, k.prefix, {
      metaKey: k.meta,
      reservationKey: k.reservation(rid),
      counterKey: counter,
      requests: window?.requests ?? 0,
      perSeconds: window?.perSeconds ?? 0,
    });
  } catch (err) {
    // Counted in the activity's scope before the bucket's check failed: given back on a 5xx, as
    // reserve() tags a bucket claim's count (countedBeforeFailure).
    if (counted && err instanceof Error) (err as Error & { [COUNTED]?: WindowCount })[COUNTED] = counted;
    throw err;
  }
  if (window && answer.code === 1) counted = countOf(answer.consumed, answer.ttlMs);
  return { kind: answer.code === 2 ? 'replay' : 'sold-out', counted };
}

/**
 * The reservation (or cancel marker) under this id. Without its owner only the activity's own
 * scope is searched; with the buyer, every scope the buyer's reservations can be in.
 */
export async function readReservation(
  redis: RedisClient,
  activityId: string,
  reservationId: string,
  owner?: ReservationOwner | ScopeKeys,
): Promise<ReservationRecord | undefined> {
  const scopes = owner && 'prefix' in owner ? [owner] : await scopesOf(redis, activityId, owner);
  return (await firstRecord(redis, reservationId, scopes))?.record;
}

/**
 * The reservation under this id in the first of the scopes that holds one; a cancel marker
 * (cancelBeforeReserve-3.lua, state CANCELLED) only when no scope holds a reservation. Both can be
 * there under one id: a cancellation by requestId marks the buyer's scopes one after the other,
 * and a bucketed submission that makes no claim (per-buyer limit off) reserves in its bucket if
 * the cancellation has not marked that one yet. Read first, the marker would hide that reservation
 * from the cancellation's next round (which must close it), the buyer's status and the order-gap
 * repair.
 */
async function firstRecord(
  redis: RedisClient,
  reservationId: string,
  scopes: readonly ScopeKeys[],
): Promise<{ record: ReservationRecord; scope: ScopeKeys } | undefined> {
  let marker: { record: ReservationRecord; scope: ScopeKeys } | undefined;
  for (const scope of scopes) {
    const record = reservationRecordOf(reservationId, await redis.hgetall(scope.reservation(reservationId)));
    if (record?.state === CANCEL_MARKER_STATE) marker ??= { record, scope };
    else if (record) return { record, scope };
  }
  return marker;
}

/** Reservations read at once by paidReservationsAmong. */
const PAID_READ_CHUNK = 1_000;

/**
 * The ids among these reservations (with their buyer and SKU) that Redis holds PAID, each read in
 * the one scope its buyer and SKU map to. The write-back reads the closed orders' reservations
 * with it once the gate is frozen (core/order-lifecycle.ts ordersHeldForPayment).
 */
export async function paidReservationsAmong(
  redis: RedisClient,
  activityId: string,
  owned: readonly { reservationId: string; userId: string; skuId: string }[],
): Promise<Set<string>> {
  const paid = new Set<string>();
  if (owned.length === 0) return paid;
  const layout = await bucketLayout(redis, activityId);
  for (let i = 0; i < owned.length; i += PAID_READ_CHUNK) {
    const chunk = owned.slice(i, i + PAID_READ_CHUNK);
    const states = await Promise.all(
      chunk.map((o) => redis.hget(layout.scopeFor(o.skuId, o.userId).reservation(o.reservationId), 'state')),
    );
    chunk.forEach((o, j) => {
      if (states[j] === 'PAID') paid.add(o.reservationId);
    });
  }
  return paid;
}

/**
 * Finds a reservation whose buyer and SKU are not known (a ledger entry the order-gap repair
 * found) in every scope of the activity, and says which scope holds it.
 */
export async function locateReservation(
  redis: RedisClient,
  activityId: string,
  reservationId: string,
): Promise<{ record: ReservationRecord; scope: ScopeKeys } | undefined> {
  return firstRecord(redis, reservationId, (await bucketLayout(redis, activityId)).allScopes());
}
