/** Every query on the `orders` table. */
import type { OrderMessage } from '../model.js';
import { journalOfInsertedSql } from './journal-store.js';
import type { Queryable } from './pool.js';

export type OrderStatus = 'UNPAID' | 'PAID' | 'CLOSED' | 'REFUNDING' | 'REFUNDED';

export interface OrderRow {
  id: string;
  reservationId: string;
  activityId: string;
  userId: string;
  skuId: string;
  slot: number;
  quantity: number;
  unitPrice: string;
  amount: string;
  itemName: string;
  status: OrderStatus;
  closeReason: string | null;
  traceId: string;
  expiresAt: Date;
  stockReturned: boolean;
}

const COLUMNS = `id, reservation_id AS "reservationId", activity_id AS "activityId", user_id AS "userId",
  sku_id AS "skuId", slot, quantity, unit_price::text AS "unitPrice", amount::text AS "amount",
  item_name AS "itemName", status, close_reason AS "closeReason", trace_id AS "traceId",
  expires_at AS "expiresAt", stock_returned AS "stockReturned"`;

export interface InsertOutcome {
  /** Reservation ids inserted by this call, with their order ids. */
  inserted: Map<string, string>;
  /** Reservation ids that already had an order (a redelivery), with id and status. */
  existing: Map<string, { id: string; status: OrderStatus }>;
  /** Reservation ids refused because another live order holds the buyer's slot. */
  rejected: string[];
}

/**
 * Inserts a batch of orders with one statement. The database's unique keys decide: a redelivered
 * message inserts nothing, and a second live order for the same buyer slot is refused.
 *
 * The payment deadline is the reservation's time plus the payment timeout, but never less than
 * half the timeout after the order is written: a buyer pays an order (its id), so one that reached
 * PostgreSQL late (a consumer outage, a dead letter replayed) would otherwise be closed by the next
 * sweep before its buyer could pay it.
 *
 * With `journal`, the same statement also appends each inserted order's journal row (event and
 * status given). One statement instead of two matters on a hot SKU: the statement's trigger
 * (activity_skus sold) locks the SKU's row at the end of the statement until the commit, so
 * every batch of that SKU waits for the one before it. Written in the statement, the journal
 * rows are inserted before that lock is taken rather than while it is held (docs/benchmarks.md,
 * drain).
 */
export async function insertOrders(
  db: Queryable,
  messages: OrderMessage[],
  paymentTimeoutSeconds: number,
  journal?: { event: string; toStatus: OrderStatus },
): Promise<InsertOutcome> {
  const inserted = new Map<string, string>();
  const existing = new Map<string, { id: string; status: OrderStatus }>();
  if (messages.length === 0) return { inserted, existing, rejected: [] };
  const col = <T>(f: (m: OrderMessage) => T): T[] => messages.map(f);
  const journalled = journal ? `, journal AS (${journalOfInsertedSql('ins', '$12', '$13')})` : '';
  const res = await db.query<{ id: string; reservation_id: string }>(
    `WITH ins AS (
     INSERT INTO orders (reservation_id, activity_id, user_id, sku_id, slot, quantity, unit_price, amount,
                         item_name, status, trace_id, reserved_at, expires_at)
     SELECT r, a, u, s, sl, q, p, p * q, n, 'UNPAID', t, to_timestamp(ts / 1000.0),
            GREATEST(to_timestamp(ts / 1000.0) + make_interval(secs => $11),
                     now() + make_interval(secs => $11 / 2.0))
       FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::int[], $7::numeric[],
                   $8::text[], $9::text[], $10::bigint[]) AS x(r, a, u, s, sl, q, p, n, t, ts)
     ON CONFLICT DO NOTHING
     RETURNING id, reservation_id, activity_id, trace_id)${journalled}
     SELECT id, reservation_id FROM ins`,
    [
      col((m) => m.reservationId),
      col((m) => m.activityId),
      col((m) => m.userId),
      col((m) => m.skuId),
      col((m) => m.slot),
      col((m) => m.quantity),
      col((m) => m.unitPrice),
      col((m) => m.itemName),
      col((m) => m.traceId),
      col((m) => m.reservedAt),
      paymentTimeoutSeconds,
      ...(journal ? [journal.event, journal.toStatus] : []),
    ],
  );
  for (const r of res.rows) inserted.set(r.reservation_id, r.id);
  const missing = messages.map((m) => m.reservationId).filter((rid) => !inserted.has(rid));
  if (missing.length > 0) {
    for (const row of await findByReservationIds(db, missing)) {
      existing.set(row.reservationId, { id: row.id, status: row.status });
    }
  }
  const rejected = missing.filter((rid) => !existing.has(rid));
  return { inserted, existing, rejected };
}

export async function findByReservationIds(db: Queryable, reservationIds: string[]): Promise<OrderRow[]> {
  if (reservationIds.length === 0) return [];
  const res = await db.query<OrderRow>(
    `SELECT ${COLUMNS} FROM orders WHERE reservation_id = ANY($1::text[])`,
    [reservationIds],
  );
  return res.rows;
}

export async function findByReservationId(
  db: Queryable,
  reservationId: string,
): Promise<OrderRow | undefined> {
  return (await findByReservationIds(db, [reservationId]))[0];
}

export interface ActivityOrderCounts {
  orders: number;
  quantity: number;
  byStatus: Record<OrderStatus, number>;
}

export async function countOrders(db: Queryable, activityId: string): Promise<ActivityOrderCounts> {
  const res = await db.query<{ status: OrderStatus; n: string; q: string }>(
    `SELECT status, count(*)::text AS n, coalesce(sum(quantity), 0)::text AS q
       FROM orders WHERE activity_id = $1 GROUP BY status`,
    [activityId],
  );
  const byStatus: Record<OrderStatus, number> = { UNPAID: 0, PAID: 0, CLOSED: 0, REFUNDING: 0, REFUNDED: 0 };
  let orders = 0;
  let quantity = 0;
  for (const r of res.rows) {
    byStatus[r.status] = Number(r.n);
    orders += Number(r.n);
    if (r.status !== 'CLOSED') quantity += Number(r.q);
  }
  return { orders, quantity, byStatus };
}

// ---------------------------------------------------------------------------------------------
// The order state machine (docs/sources seeds 004 and 003): every transition is one conditional UPDATE on the
// expected current status, and reports what happened instead of overwriting a state somebody
// else reached first.
//
//   UNPAID --PAY--> PAID --START_REFUND--> REFUNDING --FINISH_REFUND--> REFUNDED
//   UNPAID --CLOSE--> CLOSED   (payment timeout, buyer cancellation, gap compensation)
// ---------------------------------------------------------------------------------------------

export const ORDER_TRANSITIONS = {
  PAY: { from: 'UNPAID', to: 'PAID' },
  CLOSE: { from: 'UNPAID', to: 'CLOSED' },
  START_REFUND: { from: 'PAID', to: 'REFUNDING' },
  FINISH_REFUND: { from: 'REFUNDING', to: 'REFUNDED' },
} as const satisfies Record<string, { from: OrderStatus; to: OrderStatus }>;

export type OrderTransition = keyof typeof ORDER_TRANSITIONS;

/** Statuses in which the stock of an order is sold (a refund does not return it to the sale). */
export const PAID_STATUSES: readonly OrderStatus[] = ['PAID', 'REFUNDING', 'REFUNDED'];

/**
 * Where a closed order's unit went: back to Redis, to `activity_stock` after write-back, nowhere
 * provable ('unresolved', flagged), or nowhere by design ('withheld': an order the stock guard
 * closed, whose unit Redis had counted beyond PostgreSQL's; core/order-lifecycle.ts guardRelease).
 */
export type StockReturnVia = 'redis' | 'postgres' | 'unresolved' | 'withheld';

/** An order row with the after-sale bookkeeping columns (migration 2). */
export interface LifecycleOrderRow extends OrderRow {
  reservedAt: Date;
  paidAt: Date | null;
  closedAt: Date | null;
  stockReturnVia: StockReturnVia | null;
  stockReleaseAttemptedAt: Date | null;
  /**
   * The write-back's snapshot counted this closed order's unit held for an in-time payment whose
   * transaction died (migration 16): its retry reopens the order without taking a second unit.
   */
  unitHeldForPayment: boolean;
}

/**
 * A closed order whose stock is not settled yet: still held (the partial index
 * `orders_closed_stock_pending`, core/db/migrations.ts, has the same predicate).
 */
const CLOSED_UNSETTLED = `status = 'CLOSED' AND NOT stock_returned AND stock_return_via IS NULL`;

const LIFECYCLE_COLUMNS = `${COLUMNS}, reserved_at AS "reservedAt", paid_at AS "paidAt", closed_at AS "closedAt",
  stock_return_via AS "stockReturnVia", stock_release_attempted_at AS "stockReleaseAttemptedAt",
  unit_held_for_payment AS "unitHeldForPayment"`;

export type TransitionResult =
  | { applied: true; from: OrderStatus; to: OrderStatus; order: LifecycleOrderRow }
  | {
      applied: false;
      /** The status the transition required. */
      expected: OrderStatus;
      to: OrderStatus;
      /** The status found instead, or undefined when the order does not exist. */
      current: OrderStatus | undefined;
      order: LifecycleOrderRow | undefined;
    };

/**
 * Applies one transition if, and only if, the order is still in the transition's source status.
 * `reason` is recorded as close_reason for CLOSE.
 */
export async function transitionOrder(
  db: Queryable,
  orderId: string,
  transition: OrderTransition,
  reason?: string,
): Promise<TransitionResult> {
  const { from, to } = ORDER_TRANSITIONS[transition];
  const res = await db.query<LifecycleOrderRow>(
    `UPDATE orders SET status = $3,
            paid_at = CASE WHEN $3 = 'PAID' THEN now() ELSE paid_at END,
            closed_at = CASE WHEN $3 = 'CLOSED' THEN now() ELSE closed_at END,
            close_reason = CASE WHEN $3 = 'CLOSED' THEN $4 ELSE close_reason END
      WHERE id = $1 AND status = $2
      RETURNING ${LIFECYCLE_COLUMNS}`,
    [orderId, from, to, reason ?? null],
  );
  const row = res.rows[0];
  if (row) return { applied: true, from, to, order: row };
  const current = await findOrderById(db, orderId);
  return { applied: false, expected: from, to, current: current?.status, order: current };
}

/**
 * CLOSED -> PAID for a payment made within the payment window of an order the timeout closed
 * (docs/after-sale.md "Late payment"). Conditional on CLOSED; the caller has locked the row and
 * taken its stock back, so the order holds its unit again (stock_returned reset). close_reason and
 * closed_at stay as history. The live-slot unique index refuses it (23505) when the buyer holds
 * the slot with another live order.
 */
export async function reopenClosedAsPaid(
  db: Queryable,
  orderId: string,
): Promise<LifecycleOrderRow | undefined> {
  const res = await db.query<LifecycleOrderRow>(
    `UPDATE orders SET status = 'PAID', paid_at = now(), stock_returned = false, stock_return_via = NULL,
            unit_held_for_payment = false
      WHERE id = $1 AND status = 'CLOSED'
      RETURNING ${LIFECYCLE_COLUMNS}`,
    [orderId],
  );
  return res.rows[0];
}

export async function findOrderById(db: Queryable, orderId: string): Promise<LifecycleOrderRow | undefined> {
  const res = await db.query<LifecycleOrderRow>(`SELECT ${LIFECYCLE_COLUMNS} FROM orders WHERE id = $1`, [
    orderId,
  ]);
  return res.rows[0];
}

/** Locks the order row (docs/sources seed 004: the order row is always locked before its payment rows). */
export async function lockOrder(db: Queryable, orderId: string): Promise<LifecycleOrderRow | undefined> {
  const res = await db.query<LifecycleOrderRow>(
    `SELECT ${LIFECYCLE_COLUMNS} FROM orders WHERE id = $1 FOR UPDATE`,
    [orderId],
  );
  return res.rows[0];
}

export async function findLifecycleByReservationId(
  db: Queryable,
  reservationId: string,
): Promise<LifecycleOrderRow | undefined> {
  const res = await db.query<LifecycleOrderRow>(
    `SELECT ${LIFECYCLE_COLUMNS} FROM orders WHERE reservation_id = $1`,
    [reservationId],
  );
  return res.rows[0];
}

/**
 * Closes up to `limit` orders of the activity whose payment window has passed, in one statement.
 * `FOR UPDATE SKIP LOCKED` lets several sweepers run at once: each row is taken by exactly one of
 * them, and a row locked by a payment in progress is skipped (the next sweep sees its outcome).
 */
export async function closeExpiredOrders(
  db: Queryable,
  activityId: string,
  limit: number,
  reason = 'PAYMENT_TIMEOUT',
): Promise<LifecycleOrderRow[]> {
  const res = await db.query<LifecycleOrderRow>(
    `WITH due AS (
       SELECT id AS due_id FROM orders
        WHERE activity_id = $1 AND status = 'UNPAID' AND expires_at <= now()
        ORDER BY expires_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED)
     UPDATE orders SET status = 'CLOSED', closed_at = now(), close_reason = $3
       FROM due
      WHERE id = due.due_id AND status = 'UNPAID'
      RETURNING ${LIFECYCLE_COLUMNS}`,
    [activityId, limit, reason],
  );
  return res.rows;
}

/**
 * Inserts the order of an in-flight reservation directly as CLOSED (cancellation or gap
 * compensation before the consumer wrote it): the consumer's later insert then finds this row by
 * the reservation id and the buyer's result becomes FAILED. Returns undefined when an order for
 * the reservation exists already.
 */
export async function insertClosedOrder(
  db: Queryable,
  m: OrderMessage,
  reason: string,
  paymentTimeoutSeconds: number,
): Promise<LifecycleOrderRow | undefined> {
  const res = await db.query<LifecycleOrderRow>(
    `INSERT INTO orders (reservation_id, activity_id, user_id, sku_id, slot, quantity, unit_price, amount,
                         item_name, status, close_reason, closed_at, trace_id, reserved_at, expires_at)
     VALUES ($1, $2, $3, $4, $5::int, $6::int, $7::numeric, $7::numeric * $6::int, $8, 'CLOSED', $9, now(), $10,
             to_timestamp($11::bigint / 1000.0), to_timestamp($11::bigint / 1000.0) + make_interval(secs => $12))
     ON CONFLICT (reservation_id) DO NOTHING
     RETURNING ${LIFECYCLE_COLUMNS}`,
    [
      m.reservationId,
      m.activityId,
      m.userId,
      m.skuId,
      m.slot,
      m.quantity,
      m.unitPrice,
      m.itemName,
      reason,
      m.traceId,
      m.reservedAt,
      paymentTimeoutSeconds,
    ],
  );
  return res.rows[0];
}

/** The live order holding a buyer's slot, if any (the database refuses a second one). */
export async function findLiveSlotHolder(
  db: Queryable,
  activityId: string,
  userId: string,
  skuId: string,
  slot: number,
): Promise<LifecycleOrderRow | undefined> {
  const res = await db.query<LifecycleOrderRow>(
    `SELECT ${LIFECYCLE_COLUMNS} FROM orders
      WHERE activity_id = $1 AND user_id = $2 AND sku_id = $3 AND slot = $4 AND status <> 'CLOSED'`,
    [activityId, userId, skuId, slot],
  );
  return res.rows[0];
}

/** Records that a Redis release is about to be attempted for these orders (see migration 2). */
export async function markReleaseAttempted(db: Queryable, orderIds: string[]): Promise<void> {
  if (orderIds.length === 0) return;
  await db.query(
    `UPDATE orders SET stock_release_attempted_at = now()
      WHERE id = ANY($1::bigint[]) AND stock_release_attempted_at IS NULL`,
    [orderIds],
  );
}

/**
 * Withdraws an order's release-attempt mark while its stock is unsettled: for a reservation read
 * RESERVED once the gate was frozen, which proves that no release of it ever happened.
 */
export async function clearReleaseAttempted(db: Queryable, orderId: string): Promise<void> {
  await db.query(
    `UPDATE orders SET stock_release_attempted_at = NULL
      WHERE id = $1 AND stock_return_via IS NULL AND stock_release_attempted_at IS NOT NULL`,
    [orderId],
  );
}

/** A closed order as the write-back needs it to read its reservation in Redis. */
export interface ClosedReservation {
  id: string;
  activityId: string;
  reservationId: string;
  userId: string;
  skuId: string;
}

/**
 * The activity's orders the payment timeout closed: the only ones a late payment can reopen
 * (core/order-lifecycle.ts reclaimClosedOrder), so the only ones whose unit a payment can hold.
 */
export async function closedByPaymentTimeout(
  db: Queryable,
  activityId: string,
): Promise<ClosedReservation[]> {
  const res = await db.query<ClosedReservation>(
    `SELECT id, activity_id AS "activityId", reservation_id AS "reservationId", user_id AS "userId",
            sku_id AS "skuId"
       FROM orders WHERE activity_id = $1 AND status = 'CLOSED' AND close_reason = 'PAYMENT_TIMEOUT'
      ORDER BY id`,
    [activityId],
  );
  return res.rows;
}

/**
 * Records that the write-back's snapshot counted these closed orders' units held for a payment
 * (migration 16): settled 'unresolved' (neither returned nor sold until the payment's retry
 * reopens the order), so no later settlement returns the unit to activity_stock. Call in the
 * write-back's transaction; returns the ids marked (those still CLOSED).
 */
export async function markHeldForPayment(db: Queryable, orderIds: readonly string[]): Promise<string[]> {
  if (orderIds.length === 0) return [];
  const res = await db.query<{ id: string }>(
    `UPDATE orders SET unit_held_for_payment = true, stock_returned = false, stock_return_via = 'unresolved'
      WHERE id = ANY($1::bigint[]) AND status = 'CLOSED'
      RETURNING id`,
    [orderIds],
  );
  return res.rows.map((r) => r.id);
}

/**
 * Settles where the stock of closed orders went; conditional, so each order is settled once.
 * Returns the ids settled by this call.
 */
export async function markStockReturned(
  db: Queryable,
  orderIds: string[],
  via: StockReturnVia,
): Promise<string[]> {
  if (orderIds.length === 0) return [];
  const res = await db.query<{ id: string }>(
    `UPDATE orders SET stock_returned = ($2 IN ('redis', 'postgres')), stock_return_via = $2
      WHERE id = ANY($1::bigint[]) AND ${CLOSED_UNSETTLED}
      RETURNING id`,
    [orderIds, via],
  );
  return res.rows.map((r) => r.id);
}

/**
 * The buyer's orders the guard closed for the buyer's limit whose withheld unit is not given back
 * yet (core/order-lifecycle.ts settleForgotten): the reservations Redis gave the buyer in place of
 * one it forgot. Includes those not settled yet (`stockReturnVia` null), whose unit is not
 * withheld in Redis yet.
 */
export async function findWithheldForBuyer(
  db: Queryable,
  order: { id: string; activityId: string; userId: string; skuId: string },
): Promise<LifecycleOrderRow[]> {
  const res = await db.query<LifecycleOrderRow>(
    `SELECT ${LIFECYCLE_COLUMNS} FROM orders
      WHERE activity_id = $1 AND user_id = $2 AND sku_id = $3 AND id <> $4
        AND close_reason IN ('BUYER_LIMIT_EXCEEDED', 'GAP_COMPENSATED') AND withheld_returned_for IS NULL
        AND status = 'CLOSED' AND (stock_return_via = 'withheld' OR stock_return_via IS NULL)
      ORDER BY id`,
    [order.activityId, order.userId, order.skuId, order.id],
  );
  return res.rows;
}

/**
 * Orders of the SKU the guard closed as beyond its stock (`OVERSELL_PREVENTED`) whose withheld
 * unit is not given back yet, oldest first (core/order-lifecycle.ts settleForgotten).
 */
export async function findWithheldOfSku(
  db: Queryable,
  activityId: string,
  skuId: string,
  limit: number,
): Promise<LifecycleOrderRow[]> {
  const res = await db.query<LifecycleOrderRow>(
    `SELECT ${LIFECYCLE_COLUMNS} FROM orders
      WHERE activity_id = $1 AND sku_id = $2 AND close_reason = 'OVERSELL_PREVENTED'
        AND withheld_returned_for IS NULL AND stock_return_via = 'withheld'
      ORDER BY id LIMIT $3`,
    [activityId, skuId, limit],
  );
  return res.rows;
}

/**
 * Locks a closed order whose stock is not settled yet (FOR UPDATE, until the transaction ends);
 * false when it is settled (or not closed). Lock an order before its SKU's row, as every
 * transaction that changes an order does (the row first, then the trigger's SKU row).
 */
export async function lockUnsettledClosed(db: Queryable, orderId: string): Promise<boolean> {
  const res = await db.query(
    `SELECT id FROM orders
      WHERE id = $1 AND ${CLOSED_UNSETTLED}
      FOR UPDATE`,
    [orderId],
  );
  return (res.rowCount ?? 0) > 0;
}

/**
 * The SKU's closed orders whose stock is not settled yet, but `exceptId`, oldest first: the ones
 * whose release Redis has run already, before PostgreSQL recorded it, hold nothing in Redis.
 */
export async function findUnsettledClosedOfSku(
  db: Queryable,
  activityId: string,
  skuId: string,
  exceptId: string,
  limit: number,
): Promise<LifecycleOrderRow[]> {
  const res = await db.query<LifecycleOrderRow>(
    `SELECT ${LIFECYCLE_COLUMNS} FROM orders
      WHERE activity_id = $1 AND sku_id = $2 AND id <> $3
        AND ${CLOSED_UNSETTLED}
      ORDER BY id LIMIT $4`,
    [activityId, skuId, exceptId, limit],
  );
  return res.rows;
}

/**
 * Which of these reservations have an order holding stock in PostgreSQL: live, or closed with its
 * stock not settled yet.
 */
export async function reservationsHoldingStock(
  db: Queryable,
  activityId: string,
  reservationIds: string[],
): Promise<Set<string>> {
  if (reservationIds.length === 0) return new Set();
  const res = await db.query<{ reservationId: string }>(
    `SELECT reservation_id AS "reservationId" FROM orders
      WHERE activity_id = $1 AND reservation_id = ANY($2::text[])
        AND (status <> 'CLOSED' OR (${CLOSED_UNSETTLED}))`,
    [activityId, reservationIds],
  );
  return new Set(res.rows.map((r) => r.reservationId));
}

/** Quantity of the SKU's closed orders whose stock is not settled yet (still held). */
export async function closedUnsettledQuantity(
  db: Queryable,
  activityId: string,
  skuId: string,
): Promise<number> {
  const res = await db.query<{ q: string }>(
    `SELECT coalesce(sum(quantity), 0)::text AS q FROM orders
      WHERE activity_id = $1 AND sku_id = $2
        AND ${CLOSED_UNSETTLED}`,
    [activityId, skuId],
  );
  return Number(res.rows[0]?.q ?? 0);
}

/** Records that these orders' withheld units were given back for `forOrderId` (once). */
export async function markWithheldReturned(
  db: Queryable,
  orderIds: string[],
  forOrderId: string,
): Promise<string[]> {
  if (orderIds.length === 0) return [];
  const res = await db.query<{ id: string }>(
    `UPDATE orders SET withheld_returned_for = $2
      WHERE id = ANY($1::bigint[]) AND stock_return_via = 'withheld' AND withheld_returned_for IS NULL
      RETURNING id`,
    [orderIds, forOrderId],
  );
  return res.rows.map((r) => r.id);
}

/**
 * Closed orders not settled yet whose stock release was attempted: only their reservation in Redis
 * tells whether the release ran (the unit free in Redis) or not (held), so the activity's cleanup
 * waits for them (operator/reconcile/clean-up.ts).
 */
export async function countReleasesUnproven(db: Queryable, activityId: string): Promise<number> {
  const res = await db.query<{ n: string }>(
    `SELECT count(*)::text AS n FROM orders
      WHERE activity_id = $1 AND ${CLOSED_UNSETTLED} AND stock_release_attempted_at IS NOT NULL`,
    [activityId],
  );
  return Number(res.rows[0]?.n ?? 0);
}

/** Closed orders whose stock is not settled yet and were closed at least `graceSeconds` ago. */
export async function findUnsettledClosedOrders(
  db: Queryable,
  activityId: string,
  graceSeconds: number,
  limit: number,
): Promise<LifecycleOrderRow[]> {
  const res = await db.query<LifecycleOrderRow>(
    `SELECT ${LIFECYCLE_COLUMNS} FROM orders
      WHERE activity_id = $1 AND ${CLOSED_UNSETTLED}
        AND closed_at <= now() - make_interval(secs => $2)
      ORDER BY closed_at LIMIT $3`,
    [activityId, graceSeconds, limit],
  );
  return res.rows;
}

export interface OrderQuantities {
  /** Quantity of orders holding stock: UNPAID, PAID, REFUNDING, REFUNDED. */
  live: number;
  /** Quantity per status. */
  byStatus: Record<OrderStatus, number>;
  /** Closed orders whose stock has not been settled yet (still held). */
  closedUnsettled: number;
  /** Closed orders whose stock return could not be proven (flagged). */
  closedUnresolved: number;
  /** Closed by the stock guard: their units were Redis' surplus and are not returned. */
  closedWithheld: number;
  closedViaRedis: number;
  closedViaPostgres: number;
}

export async function orderQuantities(db: Queryable, activityId: string): Promise<OrderQuantities> {
  const res = await db.query<{
    status: OrderStatus;
    via: StockReturnVia | null;
    returned: boolean;
    q: string;
  }>(
    `SELECT status, stock_return_via AS via, stock_returned AS returned, coalesce(sum(quantity), 0)::text AS q
       FROM orders WHERE activity_id = $1 GROUP BY 1, 2, 3`,
    [activityId],
  );
  const out: OrderQuantities = {
    live: 0,
    byStatus: { UNPAID: 0, PAID: 0, CLOSED: 0, REFUNDING: 0, REFUNDED: 0 },
    closedUnsettled: 0,
    closedUnresolved: 0,
    closedWithheld: 0,
    closedViaRedis: 0,
    closedViaPostgres: 0,
  };
  for (const r of res.rows) {
    const q = Number(r.q);
    out.byStatus[r.status] += q;
    if (r.status !== 'CLOSED') out.live += q;
    else if (r.via === 'unresolved') out.closedUnresolved += q;
    else if (r.via === 'withheld') out.closedWithheld += q;
    else if (r.via === 'redis') out.closedViaRedis += q;
    else if (r.via === 'postgres') out.closedViaPostgres += q;
    else out.closedUnsettled += q;
  }
  return out;
}

/**
 * Activities with after-sale work due: UNPAID orders past their deadline, or closed orders whose
 * stock is still unsettled `graceSeconds` after closing (served by the partial indexes
 * orders_unpaid_expiry and orders_closed_stock_pending).
 */
export async function activitiesWithAfterSaleWork(db: Queryable, graceSeconds: number): Promise<string[]> {
  const res = await db.query<{ activity_id: string }>(
    `SELECT DISTINCT activity_id FROM orders WHERE status = 'UNPAID' AND expires_at <= now()
     UNION
     SELECT DISTINCT activity_id FROM orders
      WHERE ${CLOSED_UNSETTLED}
        AND closed_at <= now() - make_interval(secs => $1)`,
    [graceSeconds],
  );
  return res.rows.map((r) => r.activity_id).sort();
}

export interface SettlementCounts {
  unpaid: number;
  paid: number;
  closed: number;
  refunding: number;
  refunded: number;
  /** Closed orders whose stock is neither returned nor flagged unresolved yet. */
  closedUnsettled: number;
  /** The latest payment deadline among UNPAID orders (undefined when none). */
  lastUnpaidDeadline: Date | undefined;
}

/** The order side of an activity's settlement (the operator's Settling phase). */
export async function settlementCounts(db: Queryable, activityId: string): Promise<SettlementCounts> {
  const res = await db.query<{
    unpaid: string;
    paid: string;
    closed: string;
    refunding: string;
    refunded: string;
    unsettled: string;
    last: Date | null;
  }>(
    `SELECT count(*) FILTER (WHERE status = 'UNPAID')::text AS unpaid,
            count(*) FILTER (WHERE status = 'PAID')::text AS paid,
            count(*) FILTER (WHERE status = 'CLOSED')::text AS closed,
            count(*) FILTER (WHERE status = 'REFUNDING')::text AS refunding,
            count(*) FILTER (WHERE status = 'REFUNDED')::text AS refunded,
            count(*) FILTER (WHERE ${CLOSED_UNSETTLED})::text
              AS unsettled,
            max(expires_at) FILTER (WHERE status = 'UNPAID') AS last
       FROM orders WHERE activity_id = $1`,
    [activityId],
  );
  const r = res.rows[0]!;
  return {
    unpaid: Number(r.unpaid),
    paid: Number(r.paid),
    closed: Number(r.closed),
    refunding: Number(r.refunding),
    refunded: Number(r.refunded),
    closedUnsettled: Number(r.unsettled),
    lastUnpaidDeadline: r.last ?? undefined,
  };
}

/** Quantity of live (not CLOSED) orders per SKU of the activity (seeds `activity_skus.sold`). */
export async function liveQuantityBySku(
  db: Queryable,
  activityId: string,
  skuIds: string[],
): Promise<Map<string, number>> {
  const res = await db.query<{ sku_id: string; q: string }>(
    `SELECT sku_id, coalesce(sum(quantity), 0)::text AS q FROM orders
      WHERE activity_id = $1 AND sku_id = ANY($2::text[]) AND status <> 'CLOSED' GROUP BY sku_id`,
    [activityId, skuIds],
  );
  return new Map(res.rows.map((r) => [r.sku_id, Number(r.q)]));
}

/** Key of a (buyer, sku) pair in `liveQuantityOfBuyers`' answer. */
export function buyerSkuKey(userId: string, skuId: string): string {
  return `${userId}\n${skuId}`;
}

/**
 * Quantity of live orders each (buyer, sku) pair holds, as this transaction sees it (its own
 * inserts included). Keyed by `buyerSkuKey`.
 */
export async function liveQuantityOfBuyers(
  db: Queryable,
  activityId: string,
  pairs: { userId: string; skuId: string }[],
): Promise<Map<string, number>> {
  if (pairs.length === 0) return new Map();
  const res = await db.query<{ user_id: string; sku_id: string; q: string }>(
    `SELECT o.user_id, o.sku_id, sum(o.quantity)::text AS q
       FROM orders o JOIN unnest($2::text[], $3::text[]) AS b(u, s) ON o.user_id = b.u AND o.sku_id = b.s
      WHERE o.activity_id = $1 AND o.status <> 'CLOSED'
      GROUP BY o.user_id, o.sku_id`,
    [activityId, pairs.map((p) => p.userId), pairs.map((p) => p.skuId)],
  );
  return new Map(res.rows.map((r) => [buyerSkuKey(r.user_id, r.sku_id), Number(r.q)]));
}

/**
 * Closes these orders if they are still UNPAID (conditional, one statement) with a reason per
 * order; returns the rows closed by this call.
 */
export async function closeUnpaidOrders(
  db: Queryable,
  closes: { orderId: string; reason: string }[],
): Promise<LifecycleOrderRow[]> {
  if (closes.length === 0) return [];
  const res = await db.query<LifecycleOrderRow>(
    `UPDATE orders SET status = 'CLOSED', closed_at = now(), close_reason = c.close_as
       FROM unnest($1::bigint[], $2::text[]) AS c(close_id, close_as)
      WHERE id = c.close_id AND status = 'UNPAID'
      RETURNING ${LIFECYCLE_COLUMNS}`,
    [closes.map((c) => c.orderId), closes.map((c) => c.reason)],
  );
  return res.rows;
}

/** One order as the cache restore rebuilds its reservation and its buyer's slot from it. */
export interface RestoreOrderRow {
  id: string;
  reservationId: string;
  userId: string;
  skuId: string;
  slot: number;
  quantity: number;
  unitPrice: string;
  itemName: string;
  status: OrderStatus;
  traceId: string;
  reservedAtMs: number;
}

/**
 * A page of the activity's orders (every status) in id order after `afterId`, for the cache
 * restore (core/cache-restore.ts). Keyset pagination: a restore of a large sale never holds every
 * order in memory at once. The ORDER BY names the table's column: the output's `id` is text, and
 * ordering by it would repeat rows across pages.
 */
export async function ordersForRestore(
  db: Queryable,
  activityId: string,
  afterId: string,
  limit: number,
): Promise<RestoreOrderRow[]> {
  const res = await db.query<RestoreOrderRow>(
    `SELECT id::text AS id, reservation_id AS "reservationId", user_id AS "userId", sku_id AS "skuId", slot,
            quantity, unit_price::text AS "unitPrice", item_name AS "itemName", status,
            trace_id AS "traceId", (extract(epoch FROM reserved_at) * 1000)::float8 AS "reservedAtMs"
       FROM orders o WHERE o.activity_id = $1 AND o.id > $2::bigint ORDER BY o.id LIMIT $3`,
    [activityId, afterId, limit],
  );
  return res.rows;
}
