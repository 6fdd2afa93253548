/**
 * Every query on `catalog_items`: the items an activity loads through `spec.catalogRef`. Catalogs
 * belong to a namespace: an activity reads only its own namespace's catalogs, so one tenant
 * cannot sell another's (docs/install.md, "Security").
 */
import type { CatalogItem } from '../model.js';
import type { Queryable } from './pool.js';

/** The items of one catalog of `namespace`, ordered by sku id; an unknown catalog gives an empty list. */
export async function readCatalog(db: Queryable, namespace: string, catalog: string): Promise<CatalogItem[]> {
  const res = await db.query<{
    skuId: string;
    name: string;
    price: string;
    stock: number;
    limitPerUser: number;
  }>(
    `SELECT sku_id AS "skuId", name, price::text AS price, stock, limit_per_user AS "limitPerUser"
       FROM catalog_items WHERE namespace = $1 AND catalog = $2 ORDER BY sku_id`,
    [namespace, catalog],
  );
  return res.rows.map((r) => ({ ...r, stock: Number(r.stock), limitPerUser: Number(r.limitPerUser) }));
}

export interface CatalogRow extends CatalogItem {
  /** The Kubernetes namespace whose activities may load this catalog. */
  namespace: string;
  catalog: string;
}

/** Inserts or replaces catalog rows (tools and tests; the operator only reads). */
export async function upsertCatalogItems(db: Queryable, rows: CatalogRow[]): Promise<void> {
  if (rows.length === 0) return;
  await db.query(
    `INSERT INTO catalog_items (namespace, catalog, sku_id, name, price, stock, limit_per_user)
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::numeric[], $6::int[], $7::int[])
     ON CONFLICT (namespace, catalog, sku_id) DO UPDATE
       SET name = excluded.name, price = excluded.price, stock = excluded.stock,
           limit_per_user = excluded.limit_per_user`,
    [
      rows.map((r) => r.namespace),
      rows.map((r) => r.catalog),
      rows.map((r) => r.skuId),
      rows.map((r) => r.name),
      rows.map((r) => r.price),
      rows.map((r) => r.stock),
      rows.map((r) => r.limitPerUser),
    ],
  );
}
