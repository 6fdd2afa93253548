/** Every query on the `orders` table. */
import type { OrderMessage } from '../model.js';
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
 */
export async function insertOrders(
  db: Queryable,
  messages: OrderMessage[],
  paymentTimeoutSeconds: number,
): Promise<InsertOutcome> {
  const inserted = new Map<string, string>();
  const existing = new Map<string, { id: string; status: OrderStatus }>();
  if (messages.length === 0) return { inserted, existing, rejected: [] };
  const col = <T>(f: (m: OrderMessage) => T): T[] => messages.map(f);
  const res = await db.query<{ id: string; reservation_id: string }>(
    `INSERT INTO orders (reservation_id, activity_id, user_id, sku_id, slot, quantity, unit_price, amount,
                         item_name, status, trace_id, reserved_at, expires_at)
     SELECT r, a, u, s, sl, q, p, p * q, n, 'UNPAID', t, to_timestamp(ts / 1000.0),
            to_timestamp(ts / 1000.0) + make_interval(secs => $11)
       FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::int[], $7::numeric[],
                   $8::text[], $9::text[], $10::bigint[]) AS x(r, a, u, s, sl, q, p, n, t, ts)
     ON CONFLICT DO NOTHING
     RETURNING id, reservation_id`,
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
