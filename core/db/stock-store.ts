/** Every query on `activity_stock` and `activity_writebacks`: the write-back and its fence. */
import type { Pool } from 'pg';
import type { SkuStock } from '../activity-cache.js';
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
}

/**
 * Writes the remaining stock once: the fence row and the stock rows commit together, so a
 * repeat (after a crash anywhere) either finds the fence and changes nothing, or writes it all.
 */
export async function writeBack(pool: Pool, input: WriteBackInput): Promise<{ written: boolean }> {
  return inTransaction(pool, async (c) => {
    const initial = input.skus.reduce((n, s) => n + s.initial, 0);
    const remaining = input.skus.reduce((n, s) => n + s.remaining, 0);
    const fence = await c.query(
      `INSERT INTO activity_writebacks (activity_id, generation, initial_total, remaining_total, reserved_total,
                                        released_total, orders_total, written_by)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (activity_id) DO NOTHING RETURNING activity_id`,
      [
        input.activityId,
        input.generation,
        initial,
        remaining,
        input.reserved,
        input.released,
        input.orders,
        input.writtenBy,
      ],
    );
    if (fence.rowCount === 0) return { written: false };
    await c.query(
      `INSERT INTO activity_stock (activity_id, sku_id, initial_stock, remaining)
       SELECT $1, s, i, r FROM unnest($2::text[], $3::int[], $4::int[]) AS x(s, i, r)`,
      [
        input.activityId,
        input.skus.map((s) => s.skuId),
        input.skus.map((s) => s.initial),
        input.skus.map((s) => s.remaining),
      ],
    );
    return { written: true };
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
  writtenAt: Date;
}

export async function readWriteBack(db: Queryable, activityId: string): Promise<WriteBackRecord | undefined> {
  const res = await db.query<WriteBackRecord>(
    `SELECT activity_id AS "activityId", generation::int AS generation, initial_total::int AS "initialTotal",
            remaining_total::int AS "remainingTotal", reserved_total::int AS "reservedTotal",
            released_total::int AS "releasedTotal", orders_total::int AS "ordersTotal", written_at AS "writtenAt"
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

/** Returns stock after write-back (payment timeouts, cancellations); PostgreSQL is the truth then. */
export async function returnStock(
  db: Queryable,
  activityId: string,
  skuId: string,
  quantity: number,
): Promise<void> {
  await db.query(
    `UPDATE activity_stock SET remaining = remaining + $3, updated_at = now()
      WHERE activity_id = $1 AND sku_id = $2`,
    [activityId, skuId, quantity],
  );
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
