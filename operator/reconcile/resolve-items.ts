/**
 * The items the spec asks for: inline, or read from PostgreSQL through spec.catalogRef, from the
 * catalogs of the resource's own namespace only.
 */
import { readCatalog } from '../../core/db/catalog-store.js';
import type { CatalogItem } from '../../core/model.js';
import type { ReconcileContext } from './context.js';
import { itemsFromSpec } from './definition.js';

/** An item's sku id as the CRD admits it inline (crds/: spec.items[].skuId): safe in Redis keys. */
const SKU_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
/** The CRD's bound on an item's name (spec.items[].name). */
const NAME_MAX = 200;

/**
 * What the CRD would refuse in catalog rows, which nothing validated on their way into
 * `catalog_items` (the table checks price, stock and limit only): an unsafe sku id (a Redis key
 * part), an empty or too long name (every order of the SKU would be refused by the consumer and
 * dead-lettered). Pure; at most a few problems, each naming its row.
 */
export function catalogProblems(items: readonly CatalogItem[]): string[] {
  const problems: string[] = [];
  for (const i of items) {
    if (!SKU_ID.test(i.skuId))
      problems.push(`sku id ${JSON.stringify(i.skuId)} does not match ${SKU_ID.source}`);
    else {
      // Characters as the CRD's maxLength counts them (code points, not UTF-16 units).
      const length = [...i.name].length;
      if (length === 0 || length > NAME_MAX)
        problems.push(`sku ${i.skuId}: name must be 1 to ${NAME_MAX} characters (has ${length})`);
    }
  }
  return problems;
}

export async function resolveItems(ctx: ReconcileContext): Promise<CatalogItem[]> {
  const { spec } = ctx.fsa;
  if (spec.items) return itemsFromSpec(spec.items);
  if (spec.catalogRef) return readCatalog(ctx.deps.pool, ctx.fsa.metadata.namespace, spec.catalogRef.name);
  return [];
}
