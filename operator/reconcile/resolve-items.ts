/**
 * The items the spec asks for: inline, or read from PostgreSQL through spec.catalogRef, from the
 * catalogs of the resource's own namespace only.
 */
import { readCatalog } from '../../core/db/catalog-store.js';
import type { CatalogItem } from '../../core/model.js';
import type { ReconcileContext } from './context.js';
import { itemsFromSpec } from './definition.js';

export async function resolveItems(ctx: ReconcileContext): Promise<CatalogItem[]> {
  const { spec } = ctx.fsa;
  if (spec.items) return itemsFromSpec(spec.items);
  if (spec.catalogRef) return readCatalog(ctx.deps.pool, ctx.fsa.metadata.namespace, spec.catalogRef.name);
  return [];
}
