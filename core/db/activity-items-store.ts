/**
 * Every query on `activity_items`: the items of each activity as the operator loads them into the
 * cache (price, limit per buyer, name), kept in PostgreSQL so that the consumer can check every
 * order message against the activity's own data instead of trusting the message.
 */
import type { CatalogItem } from '../model.js';
import type { Queryable } from './pool.js';

export interface ActivityItem {
  skuId: string;
  name: string;
  /** Decimal string with two places, as PostgreSQL prints numeric(14,2). */
  price: string;
  limitPerUser: number;
  generation: number;
}

/**
 * Records the items of one generation of an activity. Idempotent and ordered: a row is replaced
 * only by the same or a newer generation, so a repeat after a crash, or an older operator pass
 * racing a newer one, never rolls an item back. `replace` puts back exactly what the cache holds
 * after the cache refused a newer generation that was recorded first.
 */
export async function recordActivityItems(
  db: Queryable,
  activityId: string,
  generation: number,
  items: Pick<CatalogItem, 'skuId' | 'name' | 'price' | 'limitPerUser'>[],
  opts: { replace?: boolean } = {},
): Promise<void> {
  if (items.length === 0) return;
  if (opts.replace) {
    await db.query(`DELETE FROM activity_items WHERE activity_id = $1 AND NOT (sku_id = ANY($2::text[]))`, [
      activityId,
      items.map((i) => i.skuId),
    ]);
  }
  await db.query(
    `INSERT INTO activity_items (activity_id, sku_id, name, price, limit_per_user, generation)
     SELECT $1, s, n, p, l, $2 FROM unnest($3::text[], $4::text[], $5::numeric[], $6::int[]) AS x(s, n, p, l)
     ON CONFLICT (activity_id, sku_id) DO UPDATE
       SET name = excluded.name, price = excluded.price, limit_per_user = excluded.limit_per_user,
           generation = excluded.generation, updated_at = now()
     WHERE $7 OR activity_items.generation <= excluded.generation`,
    [
      activityId,
      generation,
      items.map((i) => i.skuId),
      items.map((i) => i.name),
      items.map((i) => i.price),
      items.map((i) => i.limitPerUser),
      opts.replace === true,
    ],
  );
}

/** The activity's items by sku id (empty when the operator has not recorded any). */
export async function readActivityItems(
  db: Queryable,
  activityId: string,
): Promise<Map<string, ActivityItem>> {
  const res = await db.query<{
    skuId: string;
    name: string;
    price: string;
    limitPerUser: number;
    generation: string;
  }>(
    `SELECT sku_id AS "skuId", name, price::text AS price, limit_per_user AS "limitPerUser", generation::text AS generation
       FROM activity_items WHERE activity_id = $1`,
    [activityId],
  );
  return new Map(
    res.rows.map((r) => [
      r.skuId,
      { ...r, limitPerUser: Number(r.limitPerUser), generation: Number(r.generation) },
    ]),
  );
}
