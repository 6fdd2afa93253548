/**
 * Reservation operations over the cache: reserve, release, confirm. Each is one script call;
 * the scripts hold the rules, this module only supplies keys and arguments.
 */
import { createHash } from 'node:crypto';
import { activityKeys } from './keys.js';
import { reservationRecordOf } from './order-message.js';
import type { ReservationRecord, ReservationState } from './order-message.js';
import type { RedisClient } from './scripts.js';
import { runScript } from './scripts.js';

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

export interface ReserveInput {
  activityId: string;
  userId: string;
  skuId: string;
  quantity: number;
  requestId: string;
  traceId: string;
  orderCode?: string | undefined;
}

export type ReserveOutcome =
  | { kind: 'reserved'; reservationId: string; stockLeft: number }
  | { kind: 'replayed'; reservationId: string; state: ReservationState };

export async function reserve(redis: RedisClient, input: ReserveInput): Promise<ReserveOutcome> {
  const k = activityKeys(input.activityId);
  const rid = reservationIdFor(input.activityId, input.userId, input.requestId);
  const reply = await runScript(
    redis,
    'reserve',
    [
      k.meta,
      k.sku(input.skuId),
      k.buyer(input.userId),
      k.reservation(rid),
      k.outbox,
      k.ledger,
      k.counters,
      input.orderCode ? k.orderCode(input.orderCode) : k.none,
    ],
    [
      rid,
      input.userId,
      input.skuId,
      input.quantity,
      input.requestId,
      input.traceId,
      input.orderCode ?? '',
      input.activityId,
    ],
  );
  if (reply[0] === 1) return { kind: 'reserved', reservationId: rid, stockLeft: Number(reply[2]) };
  return { kind: 'replayed', reservationId: rid, state: String(reply[2]) as ReservationState };
}

export interface ReleaseInput {
  activityId: string;
  reservationId: string;
  userId: string;
  skuId: string;
  reason: string;
}

export type ReleaseOutcome = { kind: 'released'; stockAfter: number } | { kind: 'already-released' };

export async function release(redis: RedisClient, input: ReleaseInput): Promise<ReleaseOutcome> {
  const k = activityKeys(input.activityId);
  const reply = await runScript(
    redis,
    'release',
    [
      k.meta,
      k.reservation(input.reservationId),
      k.sku(input.skuId),
      k.buyer(input.userId),
      k.ledger,
      k.counters,
    ],
    [input.reservationId, input.userId, input.skuId, input.reason, k.restockChannel],
  );
  if (reply[0] === 1) return { kind: 'released', stockAfter: Number(reply[1]) };
  return { kind: 'already-released' };
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
  const k = activityKeys(input.activityId);
  const rid = reservationIdFor(input.activityId, input.userId, input.requestId);
  const reply = await runScript(
    redis,
    'cancelBeforeReserve',
    [k.meta, k.reservation(rid), k.buyer(input.userId)],
    [input.userId, input.reason, Math.max(1, policy.graceSeconds), Math.max(0, policy.maxPerBuyer)],
  );
  if (reply[0] === 1) return { kind: 'marked', ttlSeconds: Number(reply[1]) };
  if (reply[0] === 2) return { kind: 'exists', state: String(reply[1]) as ReservationState };
  return { kind: 'sale-over' };
}

export async function confirmPaid(
  redis: RedisClient,
  activityId: string,
  reservationId: string,
): Promise<'paid' | 'already-paid'> {
  const k = activityKeys(activityId);
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

/**
 * Takes a released reservation's unit back and marks it PAID, or marks a still-reserved one PAID
 * (reclaimPaid-5.lua): for a payment made in time for an order the timeout closed. Throws
 * SOLD_OUT, LIMIT_REACHED, FROZEN, ... when it cannot (nothing changed then).
 */
export async function reclaimPaid(
  redis: RedisClient,
  input: { activityId: string; reservationId: string; userId: string; skuId: string },
): Promise<ReclaimOutcome> {
  const k = activityKeys(input.activityId);
  const reply = await runScript(
    redis,
    'reclaimPaid',
    [k.meta, k.reservation(input.reservationId), k.sku(input.skuId), k.buyer(input.userId), k.counters],
    [input.reservationId, input.userId, input.skuId],
  );
  if (reply[0] === 1) return { kind: 'taken-back', stockAfter: Number(reply[1]) };
  if (reply[0] === 2) return { kind: 'already-paid' };
  return { kind: 'still-held' };
}

export type { ReservationRecord } from './order-message.js';
export { orderMessageOf } from './order-message.js';

/**
 * Whether a reservation (or a cancel marker) exists under this id: what makes a submission
 * a replay for reserve-8.lua. One EXISTS, for the sold-out fast path.
 */
export async function reservationExists(
  redis: RedisClient,
  activityId: string,
  reservationId: string,
): Promise<boolean> {
  return (await redis.exists(activityKeys(activityId).reservation(reservationId))) === 1;
}

export async function readReservation(
  redis: RedisClient,
  activityId: string,
  reservationId: string,
): Promise<ReservationRecord | undefined> {
  return reservationRecordOf(
    reservationId,
    await redis.hgetall(activityKeys(activityId).reservation(reservationId)),
  );
}
