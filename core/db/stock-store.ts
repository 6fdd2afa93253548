/** Every query on `activity_stock` and `activity_writebacks`: the write-back and its fence. */
import type { Pool } from 'pg';
import type { SkuStock } from '../activity-cache.js';
import { appendJournal } from './journal-store.js';
import { markHeldForPayment } from './orders-store.js';
import type { ClosedReservation } from './orders-store.js';
import { inTransaction } from './pool.js';
import type { Queryable } from './pool.js';

export interface WriteBackInput {
  activityId: string;
  generation: number;
  skus: SkuStock[];
  reserved: number;
  released: number;
  orders: number;
  writtenBy: string;
  /**
   * Closed orders whose reservation the snapshot holds PAID (core/order-lifecycle.ts
   * ordersHeldForPayment): marked in the same transaction, so their payments' retries reopen them
   * without taking a second unit.
   */
  heldForPayment?: readonly ClosedReservation[];
}

/**
 * Writes the remaining stock once: the fence row and the stock rows commit together, so a
 * repeat (after a crash anywhere) either finds the fence and changes nothing, or writes it all.
 *
 * A SKU's remaining stock is written as at most `activity_skus.stock - sold` (its stock less its
 * live orders in PostgreSQL, read in this transaction), which is never below the truth: the units
 * held by in-flight reservations and closed orders not yet returned only lower it further, and a
 * unit released to Redis before the freeze was released after its order's close committed. Redis
 * counts more only when it forgot reservations (a failover, a restart without data) and sold their
 * units again; what nobody bought of those is not written back (`trimmed_total`), so a late
 * payment or a later sale cannot take a unit PostgreSQL has sold. A SKU without its
 * `activity_skus` row is written as Redis has it.
 */
export async function writeBack(
  pool: Pool,
  input: WriteBackInput,
): Promise<{ written: boolean; trimmed: number }> {
  return inTransaction(pool, async (c) => {
    const bound = await c.query<{ sku_id: string; unsold: number }>(
      `SELECT sku_id, stock - sold AS unsold FROM activity_skus WHERE activity_id = $1 AND sku_id = ANY($2::text[])`,
      [input.activityId, input.skus.map((s) => s.skuId)],
    );
    const unsold = new Map(bound.rows.map((r) => [r.sku_id, Math.max(0, r.unsold)]));
    const skus = input.skus.map((s) => ({
      ...s,
      remaining: Math.min(s.remaining, unsold.get(s.skuId) ?? s.remaining),
    }));
    const initial = skus.reduce((n, s) => n + s.initial, 0);
    const remaining = skus.reduce((n, s) => n + s.remaining, 0);
    const trimmed = input.skus.reduce((n, s) => n + s.remaining, 0) - remaining;
    const fence = await c.query(
      `INSERT INTO activity_writebacks (activity_id, generation, initial_total, remaining_total, reserved_total,
                                        released_total, orders_total, written_by, trimmed_total)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (activity_id) DO NOTHING RETURNING activity_id`,
      [
        input.activityId,
        input.generation,
        initial,
        remaining,
        input.reserved,
        input.released,
        input.orders,
        input.writtenBy,
        trimmed,
      ],
    );
    if (fence.rowCount === 0) return { written: false, trimmed: 0 };
    await c.query(
      `INSERT INTO activity_stock (activity_id, sku_id, initial_stock, remaining)
       SELECT $1, s, i, r FROM unnest($2::text[], $3::int[], $4::int[]) AS x(s, i, r)`,
      [input.activityId, skus.map((s) => s.skuId), skus.map((s) => s.initial), skus.map((s) => s.remaining)],
    );
    const held = input.heldForPayment ?? [];
    const marked = new Set(
      await markHeldForPayment(
        c,
        held.map((o) => o.id),
      ),
    );
    await appendJournal(
      c,
      held
        .filter((o) => marked.has(o.id))
        .map((o) => ({
          activityId: o.activityId,
          reservationId: o.reservationId,
          orderId: o.id,
          event: 'STOCK_HELD_FOR_PAYMENT',
          fromStatus: 'CLOSED',
          toStatus: 'CLOSED',
          detail: {
            why: 'the write-back found its reservation PAID in Redis (a payment in time took the unit back)',
          },
        })),
    );
    return { written: true, trimmed };
  });
}

export interface WriteBackRecord {
  activityId: string;
  generation: number;
  initialTotal: number;
  remainingTotal: number;
  reservedTotal: number;
  releasedTotal: number;
  ordersTotal: number;
  /** Units Redis counted beyond PostgreSQL's stock, not written back (see writeBack). */
  trimmedTotal: number;
  writtenAt: Date;
}

export async function readWriteBack(db: Queryable, activityId: string): Promise<WriteBackRecord | undefined> {
  const res = await db.query<WriteBackRecord>(
    `SELECT activity_id AS "activityId", generation::int AS generation, initial_total::int AS "initialTotal",
            remaining_total::int AS "remainingTotal", reserved_total::int AS "reservedTotal",
            released_total::int AS "releasedTotal", orders_total::int AS "ordersTotal",
            trimmed_total::int AS "trimmedTotal", written_at AS "writtenAt"
       FROM activity_writebacks WHERE activity_id = $1`,
    [activityId],
  );
  return res.rows[0];
}

export async function readStockRows(db: Queryable, activityId: string): Promise<SkuStock[]> {
  const res = await db.query<SkuStock>(
    `SELECT sku_id AS "skuId", initial_stock AS initial, remaining FROM activity_stock
      WHERE activity_id = $1 ORDER BY sku_id`,
    [activityId],
  );
  return res.rows;
}

/**
 * Returns a closed order's stock after write-back (payment timeouts, cancellations); PostgreSQL is
 * the truth then. Held to the write-back's bound, `activity_skus.stock - sold` (sold: the live
 * orders' quantity, this closed one no longer among them): a unit Redis had forgotten and sold
 * again was not written back, and the units of closed orders come back on top of what was, so
 * without the bound they would take `remaining` above what PostgreSQL has left to sell. The SKU's
 * `activity_skus` row is locked first, as a late payment's reopening locks it
 * (`reclaimClosedOrder`) before it takes a unit out of `activity_stock`, so the bound is read as of
 * this return and the two never wait on each other in opposite orders. The units left out are added to the write-back's
 * `trimmed_total` and returned; a SKU without its `activity_skus` row gets the whole quantity back.
 * Call in the transaction that marks the order settled.
 */
export async function returnStock(
  db: Queryable,
  activityId: string,
  skuId: string,
  quantity: number,
): Promise<{ returned: number; trimmed: number }> {
  const bound = await db.query<{ unsold: number }>(
    `SELECT GREATEST(stock - sold, 0) AS unsold FROM activity_skus
      WHERE activity_id = $1 AND sku_id = $2 FOR UPDATE`,
    [activityId, skuId],
  );
  const unsold = bound.rows[0]?.unsold;
  const res = await db.query<{ returned: number }>(
    `WITH old AS (SELECT remaining FROM activity_stock WHERE activity_id = $1 AND sku_id = $2 FOR UPDATE)
     UPDATE activity_stock s
        SET remaining = GREATEST(s.remaining, LEAST(s.remaining + $3, COALESCE($4::int, s.remaining + $3))),
            updated_at = now()
       FROM old
      WHERE s.activity_id = $1 AND s.sku_id = $2
     RETURNING s.remaining - old.remaining AS returned`,
    [activityId, skuId, quantity, unsold ?? null],
  );
  const returned = res.rows[0]?.returned ?? 0;
  const trimmed = res.rows.length > 0 ? quantity - returned : 0;
  if (trimmed > 0)
    await db.query(
      `UPDATE activity_writebacks SET trimmed_total = trimmed_total + $2 WHERE activity_id = $1`,
      [activityId, trimmed],
    );
  return { returned, trimmed };
}

/**
 * Takes returned stock back out after write-back (a late payment for an order the timeout
 * closed): conditional, so the remaining stock never goes below zero (never an oversell).
 */
export async function takeBackStock(
  db: Queryable,
  activityId: string,
  skuId: string,
  quantity: number,
): Promise<boolean> {
  const res = await db.query(
    `UPDATE activity_stock SET remaining = remaining - $3, updated_at = now()
      WHERE activity_id = $1 AND sku_id = $2 AND remaining >= $3`,
    [activityId, skuId, quantity],
  );
  return res.rowCount === 1;
}
