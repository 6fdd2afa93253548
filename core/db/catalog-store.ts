/** Every query on `catalog_items`: the items an activity loads through `spec.catalogRef`. */
import type { CatalogItem } from '../model.js';
import type { Queryable } from './pool.js';

/** The items of one catalog, ordered by sku id; an unknown catalog gives an empty list. */
export async function readCatalog(db: Queryable, catalog: string): Promise<CatalogItem[]> {
  const res = await db.query<{
    skuId: string;
    name: string;
    price: string;
    stock: number;
    limitPerUser: number;
  }>(
    `SELECT sku_id AS "skuId", name, price::text AS price, stock, limit_per_user AS "limitPerUser"
       FROM catalog_items WHERE catalog = $1 ORDER BY sku_id`,
    [catalog],
  );
  return res.rows.map((r) => ({ ...r, stock: Number(r.stock), limitPerUser: Number(r.limitPerUser) }));
}

export interface CatalogRow extends CatalogItem {
  catalog: string;
}

/** Inserts or replaces catalog rows (tools and tests; the operator only reads). */
export async function upsertCatalogItems(db: Queryable, rows: CatalogRow[]): Promise<void> {
  if (rows.length === 0) return;
  await db.query(
    `INSERT INTO catalog_items (catalog, sku_id, name, price, stock, limit_per_user)
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::numeric[], $5::int[], $6::int[])
     ON CONFLICT (catalog, sku_id) DO UPDATE
       SET name = excluded.name, price = excluded.price, stock = excluded.stock,
           limit_per_user = excluded.limit_per_user`,
    [
      rows.map((r) => r.catalog),
      rows.map((r) => r.skuId),
      rows.map((r) => r.name),
      rows.map((r) => r.price),
      rows.map((r) => r.stock),
      rows.map((r) => r.limitPerUser),
    ],
  );
}
