/**
 * Every query on `activity_skus`: each SKU's stock, buyer limit and price as PostgreSQL knows them,
 * and `sold`, the quantity of the SKU's live (not CLOSED) orders. `sold` is kept by the
 * statement-level triggers of migration 7 on `orders`, so every path that inserts, closes or takes
 * back an order keeps it right without calling this store; the stock guard (core/stock-guard.ts)
 * reads it under a row lock in the consumer's insert transaction.
 */
import type { CatalogItem } from '../model.js';
import type { Queryable } from './pool.js';

export type SkuRowSource = 'spec' | 'cache';

export interface ActivitySkuRow {
  skuId: string;
  stock: number;
  limitPerUser: number;
  unitPrice: string;
  itemName: string;
  sold: number;
  seededFrom: SkuRowSource;
}

const COLUMNS = `sku_id AS "skuId", stock, limit_per_user AS "limitPerUser", unit_price::text AS "unitPrice",
  item_name AS "itemName", sold, seeded_from AS "seededFrom"`;

/**
 * Records an activity's SKUs. From the spec (the operator, before each cache load) a row is created
 * or updated, and stock only grows, as in the cache; from the cache (an activity the operator did
 * not record) a row is only created. A new row starts with `sold` = the live quantity already in
 * `orders` (`liveBySku`), so recording late, mid-sale, stays exact.
 */
export async function recordActivitySkus(
  db: Queryable,
  activityId: string,
  items: readonly CatalogItem[],
  from: SkuRowSource,
  liveBySku: ReadonlyMap<string, number> = new Map(),
): Promise<void> {
  if (items.length === 0) return;
  const onConflict =
    from === 'spec'
      ? `DO UPDATE SET stock = GREATEST(activity_skus.stock, excluded.stock),
           limit_per_user = excluded.limit_per_user, unit_price = excluded.unit_price,
           item_name = excluded.item_name, seeded_from = 'spec', updated_at = now()`
      : 'DO NOTHING';
  await db.query(
    `INSERT INTO activity_skus (activity_id, sku_id, stock, limit_per_user, unit_price, item_name, sold, seeded_from)
     SELECT $1, s, st, l, p, n, so, $8
       FROM unnest($2::text[], $3::int[], $4::int[], $5::numeric[], $6::text[], $7::int[]) AS x(s, st, l, p, n, so)
     ON CONFLICT (activity_id, sku_id) ${onConflict}`,
    [
      activityId,
      items.map((i) => i.skuId),
      items.map((i) => i.stock),
      items.map((i) => i.limitPerUser),
      items.map((i) => i.price),
      items.map((i) => i.name),
      items.map((i) => liveBySku.get(i.skuId) ?? 0),
      from,
    ],
  );
}

/** The SKU ids among `skuIds` that have no row yet. */
export async function missingSkus(db: Queryable, activityId: string, skuIds: string[]): Promise<string[]> {
  if (skuIds.length === 0) return [];
  const res = await db.query<{ sku_id: string }>(
    `SELECT sku_id FROM activity_skus WHERE activity_id = $1 AND sku_id = ANY($2::text[])`,
    [activityId, skuIds],
  );
  const found = new Set(res.rows.map((r) => r.sku_id));
  return skuIds.filter((s) => !found.has(s));
}

/**
 * Locks the rows of these SKUs for the rest of the transaction, in sku order (the same order the
 * triggers lock them in), and returns them with `sold` as of now.
 */
export async function lockActivitySkus(
  db: Queryable,
  activityId: string,
  skuIds: string[],
): Promise<ActivitySkuRow[]> {
  if (skuIds.length === 0) return [];
  const res = await db.query<ActivitySkuRow>(
    `SELECT ${COLUMNS} FROM activity_skus WHERE activity_id = $1 AND sku_id = ANY($2::text[])
      ORDER BY sku_id FOR UPDATE`,
    [activityId, skuIds],
  );
  return res.rows;
}

export async function readActivitySkus(db: Queryable, activityId: string): Promise<ActivitySkuRow[]> {
  const res = await db.query<ActivitySkuRow>(
    `SELECT ${COLUMNS} FROM activity_skus WHERE activity_id = $1 ORDER BY sku_id`,
    [activityId],
  );
  return res.rows;
}
