// The fault suite's invariant checker (docs/faults.md). It looks only at final state, Jepsen-style:
// PostgreSQL (orders, order_journal) and Redis (SKU stock, counters, reservation ledger entries,
// outbox, unconfirmed ledger). `checkInvariants` is pure (unit-tested in test/unit/faults/);
// `readFinalState` gathers its input from the real servers.
import type pg from 'pg';
import { countUnconfirmed, readOutbox, readStock } from '../../../core/activity-cache.js';
import { bucketLayout } from '../../../core/buckets.js';
import { activityKeys } from '../../../core/keys.js';
import { primariesOf } from '../../../core/redis.js';
import type { RedisClient } from '../../../core/scripts.js';

export type ReservationStateName = 'RESERVED' | 'RELEASED' | 'CANCELLED' | 'PAID';

export interface SkuFinal {
  skuId: string;
  initial: number;
  remaining: number;
  limitPerUser: number;
}

export interface ReservationFinal {
  reservationId: string;
  state: ReservationStateName;
  userId: string;
  skuId: string;
  quantity: number;
}

export interface OrderFinal {
  reservationId: string;
  userId: string;
  skuId: string;
  quantity: number;
  status: string;
}

/** Figures another component reports (activity status, reconciliation): compared when given. */
export interface ReportedCounters {
  initial?: number;
  remaining?: number;
  released?: number;
  ordered?: number;
}

export interface FinalState {
  activityId: string;
  skus: SkuFinal[];
  counters: { reserved: number; released: number; reservations: number };
  reservations: ReservationFinal[];
  orders: OrderFinal[];
  /**
   * Creation journal events per reservation id (only those seen at least once): ORDER_CREATED, or
   * ORDER_CLOSED with no previous status (an in-flight order inserted CLOSED by a cancellation).
   */
  createdEvents: Map<string, number>;
  /** Outbox stream length: half messages Kafka has not acknowledged. */
  halfMessages: number;
  /** Reservations still in the unconfirmed ledger (no order confirmed in PostgreSQL). */
  unconfirmed: number;
  reported?: ReportedCounters;
}

export interface Violation {
  rule:
    | 'stock-conservation'
    | 'negative-stock'
    | 'counters'
    | 'duplicate-order'
    | 'missing-journal'
    | 'phantom-order'
    | 'missing-order'
    | 'released-but-live'
    | 'buyer-limit'
    | 'half-messages'
    | 'order-gap'
    | 'reported-counters'
    /** A buyer was answered 500 along the way (test/faults/harness/sale.ts answerLog). */
    | 'internal-error';
  detail: string;
}

const LIVE: ReadonlySet<string> = new Set(['RESERVED', 'PAID']);

function sumBy<T>(xs: readonly T[], f: (x: T) => number): number {
  let n = 0;
  for (const x of xs) n += f(x);
  return n;
}

function groupBy<T>(xs: readonly T[], key: (x: T) => string): Map<string, T[]> {
  const m = new Map<string, T[]>();
  for (const x of xs) {
    const k = key(x);
    const list = m.get(k);
    if (list) list.push(x);
    else m.set(k, [x]);
  }
  return m;
}

/**
 * Every violated invariant of one activity's final state; empty means it holds:
 * - per SKU: initial = remaining + live reservations (released units are back in remaining),
 *   remaining never negative; Redis counters: reserved = live + released, released = released
 *   ledger entries (a unit returned twice breaks one of them);
 * - no duplicate order (one row per reservation), and exactly one creation journal event per order
 *   (none lost to a crash, none repeated by a redelivery);
 * - every unreleased reservation is exactly one live order, every order has its reservation,
 *   a released or cancelled reservation has no live order;
 * - no buyer above the per-SKU limit (live orders and live reservations);
 * - half messages 0 and order gap (unconfirmed reservations) 0;
 * - reported counters (activity status, reports) agree, when given.
 */
export function checkInvariants(s: FinalState): Violation[] {
  const out: Violation[] = [];
  const v = (rule: Violation['rule'], detail: string): void => {
    out.push({ rule, detail });
  };
  const rsvBySku = groupBy(s.reservations, (r) => r.skuId);
  let liveTotal = 0;
  let releasedTotal = 0;
  for (const sku of s.skus) {
    const rs = rsvBySku.get(sku.skuId) ?? [];
    const live = sumBy(
      rs.filter((r) => LIVE.has(r.state)),
      (r) => r.quantity,
    );
    const released = sumBy(
      rs.filter((r) => r.state === 'RELEASED'),
      (r) => r.quantity,
    );
    liveTotal += live;
    releasedTotal += released;
    if (sku.remaining < 0) v('negative-stock', `sku ${sku.skuId}: remaining ${sku.remaining}`);
    // A release returns its units to the SKU's stock (release-6.lua), so the
    // "initial = remaining + live + released" reads here as: what was ever reserved is live or
    // released, and what is not live is on sale again.
    if (sku.initial !== sku.remaining + live) {
      v(
        'stock-conservation',
        `sku ${sku.skuId}: initial ${sku.initial} != remaining ${sku.remaining} + live ${live} (released ${released}, back in remaining)`,
      );
    }
  }
  const knownSkus = new Set(s.skus.map((k) => k.skuId));
  for (const r of s.reservations) {
    if (!knownSkus.has(r.skuId) && r.state !== 'CANCELLED') {
      v('stock-conservation', `reservation ${r.reservationId} holds unknown sku ${r.skuId}`);
    }
  }
  if (s.counters.reserved !== liveTotal + releasedTotal) {
    v(
      'counters',
      `counters.reserved ${s.counters.reserved} != live ${liveTotal} + released ${releasedTotal}`,
    );
  }
  if (s.counters.released !== releasedTotal) {
    v('counters', `counters.released ${s.counters.released} != released entries ${releasedTotal}`);
  }
  const nonTombstones = s.reservations.filter((r) => r.state !== 'CANCELLED').length;
  if (s.counters.reservations !== nonTombstones) {
    v('counters', `counters.reservations ${s.counters.reservations} != reservations ${nonTombstones}`);
  }

  const ordersByRsv = groupBy(s.orders, (o) => o.reservationId);
  for (const [rid, os] of ordersByRsv) {
    if (os.length > 1) v('duplicate-order', `${os.length} orders for reservation ${rid}`);
  }
  for (const [rid, n] of s.createdEvents) {
    if (n > 1) v('duplicate-order', `${n} ORDER_CREATED events for reservation ${rid}`);
  }
  for (const rid of ordersByRsv.keys()) {
    if (!s.createdEvents.has(rid))
      v('missing-journal', `order of reservation ${rid} has no creation journal row`);
  }
  const rsvById = new Map(s.reservations.map((r) => [r.reservationId, r]));
  for (const o of s.orders) {
    const r = rsvById.get(o.reservationId);
    if (!r) {
      v('phantom-order', `order of reservation ${o.reservationId} has no reservation in Redis`);
      continue;
    }
    if (r.userId !== o.userId || r.skuId !== o.skuId || r.quantity !== o.quantity) {
      v(
        'phantom-order',
        `order ${o.reservationId} (${o.userId}/${o.skuId}x${o.quantity}) differs from its reservation (${r.userId}/${r.skuId}x${r.quantity})`,
      );
    }
    if (!LIVE.has(r.state) && o.status !== 'CLOSED') {
      v('released-but-live', `reservation ${o.reservationId} is ${r.state} but its order is ${o.status}`);
    }
  }
  for (const r of s.reservations) {
    if (!LIVE.has(r.state)) continue;
    const os = ordersByRsv.get(r.reservationId) ?? [];
    const live = os.filter((o) => o.status !== 'CLOSED');
    if (live.length !== 1) {
      v(
        'missing-order',
        `reservation ${r.reservationId} (${r.state}) has ${live.length} live order(s)` +
          (os.length > live.length ? ` and ${os.length - live.length} closed` : ''),
      );
    }
  }

  const limits = new Map(s.skus.map((k) => [k.skuId, k.limitPerUser]));
  const liveOrdersByBuyer = groupBy(
    s.orders.filter((o) => o.status !== 'CLOSED'),
    (o) => `${o.userId}\u0000${o.skuId}`,
  );
  for (const [key, os] of liveOrdersByBuyer) {
    const [user, sku] = key.split('\u0000') as [string, string];
    const held = sumBy(os, (o) => o.quantity);
    const limit = limits.get(sku) ?? 1;
    if (held > limit)
      v('buyer-limit', `buyer ${user} holds ${held} of sku ${sku} in orders (limit ${limit})`);
  }
  const liveRsvByBuyer = groupBy(
    s.reservations.filter((r) => LIVE.has(r.state)),
    (r) => `${r.userId}\u0000${r.skuId}`,
  );
  for (const [key, rs] of liveRsvByBuyer) {
    const [user, sku] = key.split('\u0000') as [string, string];
    const held = sumBy(rs, (r) => r.quantity);
    const limit = limits.get(sku) ?? 1;
    if (held > limit) {
      v('buyer-limit', `buyer ${user} holds ${held} of sku ${sku} in reservations (limit ${limit})`);
    }
  }

  if (s.halfMessages !== 0) v('half-messages', `${s.halfMessages} half message(s) left in the outbox`);
  if (s.unconfirmed !== 0) v('order-gap', `${s.unconfirmed} reservation(s) never confirmed as orders`);

  const r = s.reported;
  if (r) {
    const initial = sumBy(s.skus, (k) => k.initial);
    const remaining = sumBy(s.skus, (k) => k.remaining);
    const ordered = s.orders.filter((o) => o.status !== 'CLOSED').length;
    const cmp = (name: string, got: number | undefined, want: number): void => {
      if (got !== undefined && got !== want) v('reported-counters', `reported ${name} ${got} != ${want}`);
    };
    cmp('initial', r.initial, initial);
    cmp('remaining', r.remaining, remaining);
    cmp('released', r.released, releasedTotal);
    cmp('ordered', r.ordered, ordered);
  }
  return out;
}

/** One line per violation, for assertion messages and the report. */
export function formatViolations(vs: readonly Violation[]): string {
  return vs.map((x) => `[${x.rule}] ${x.detail}`).join('\n');
}

function isState(s: string | undefined): s is ReservationStateName {
  return s === 'RESERVED' || s === 'RELEASED' || s === 'CANCELLED' || s === 'PAID';
}

/** Reads the final state of one activity from the real Redis and PostgreSQL. */
export async function readFinalState(
  redis: RedisClient,
  sql: pg.Pool,
  activityId: string,
  reported?: ReportedCounters,
): Promise<FinalState> {
  const k = activityKeys(activityId);
  // Stock and counters summed over the activity's scopes (its stock buckets included).
  const stock = await readStock(redis, activityId);
  const skus: SkuFinal[] = [];
  for (const s of stock.skus) {
    const limit = await redis.hget(k.sku(s.skuId), 'limit');
    skus.push({
      skuId: s.skuId,
      initial: s.initial,
      remaining: s.remaining,
      limitPerUser: Number(limit ?? 1),
    });
  }
  const c = { reserved: stock.reserved, released: stock.released, reservations: stock.reservations };
  const reservations: ReservationFinal[] = [];
  for (const scope of (await bucketLayout(redis, activityId, { refresh: true })).allScopes()) {
    const keys: string[] = [];
    for (const node of primariesOf(redis)) {
      let cursor = '0';
      do {
        const [next, batch] = await node.scan(cursor, 'MATCH', scope.reservation('*'), 'COUNT', 1000);
        cursor = next;
        keys.push(...batch);
      } while (cursor !== '0');
    }
    const prefix = scope.reservation('');
    for (let i = 0; i < keys.length; i += 500) {
      const chunk = keys.slice(i, i + 500);
      const p = redis.pipeline();
      for (const key of chunk) p.hmget(key, 'state', 'user', 'sku', 'qty');
      const replies = (await p.exec()) ?? [];
      chunk.forEach((key, j) => {
        const [state, user, sku, qty] = (replies[j]?.[1] as (string | null)[] | undefined) ?? [];
        if (!isState(state ?? undefined)) return;
        reservations.push({
          reservationId: key.slice(prefix.length),
          state: state as ReservationStateName,
          userId: user ?? '',
          skuId: sku ?? '',
          quantity: Number(qty ?? 0),
        });
      });
    }
  }
  const orders = await sql.query<{
    reservation_id: string;
    user_id: string;
    sku_id: string;
    quantity: number;
    status: string;
  }>('SELECT reservation_id, user_id, sku_id, quantity, status FROM orders WHERE activity_id = $1', [
    activityId,
  ]);
  const events = await sql.query<{ reservation_id: string; n: number }>(
    `SELECT reservation_id, count(*)::int AS n FROM order_journal
      WHERE activity_id = $1 AND (event = 'ORDER_CREATED' OR (event = 'ORDER_CLOSED' AND from_status IS NULL))
      GROUP BY reservation_id`,
    [activityId],
  );
  const [{ halfMessages }, unconfirmed] = await Promise.all([
    readOutbox(redis, activityId),
    countUnconfirmed(redis, activityId, Number.MAX_SAFE_INTEGER),
  ]);
  return {
    activityId,
    skus,
    counters: {
      reserved: c.reserved,
      released: c.released,
      reservations: c.reservations,
    },
    reservations,
    orders: orders.rows.map((o) => ({
      reservationId: o.reservation_id,
      userId: o.user_id,
      skuId: o.sku_id,
      quantity: Number(o.quantity),
      status: o.status,
    })),
    createdEvents: new Map(events.rows.map((e) => [e.reservation_id, e.n])),
    halfMessages,
    unconfirmed,
    ...(reported ? { reported } : {}),
  };
}

/** Reads the final state and checks it. */
export async function checkActivity(
  redis: RedisClient,
  sql: pg.Pool,
  activityId: string,
  reported?: ReportedCounters,
): Promise<Violation[]> {
  return checkInvariants(await readFinalState(redis, sql, activityId, reported));
}
