/**
 * Each SKU's bucket count before it is loaded (docs/operator.md "Stock buckets"): a SKU already in
 * the cache keeps the count it was loaded with; a SKU the spec gives a count keeps that (the CRD
 * fixes it from warm-up on); any other SKU is split automatically above the stock threshold of
 * spec.bucketing, else of the operator's settings, else the default for this Redis. The choice is
 * recorded in Redis before the load (core/buckets.ts recordBucketPlan), so a resumed or
 * differently configured operator finishes a load with the count it began with, and a later change
 * of the threshold changes no SKU already chosen.
 */
import { chooseBuckets, defaultAutoBucketing, recordBucketPlan } from '../../core/buckets.js';
import type { AutoBucketing } from '../../core/buckets.js';
import { crashPoint } from '../../core/crash.js';
import type { LoadedDefinition } from '../../core/loaded-definition.js';
import type { CatalogItem } from '../../core/model.js';
import { primariesOf } from '../../core/redis.js';
import type { ReconcileContext } from './context.js';

/** The automatic bucketing in force for this activity: spec.bucketing, then the operator's settings. */
export function autoBucketingOf(ctx: ReconcileContext): AutoBucketing {
  const fallback = defaultAutoBucketing(primariesOf(ctx.deps.redis).length);
  const spec = ctx.fsa.spec.bucketing;
  const cfg = ctx.deps.config.autoBuckets;
  return {
    stockThreshold: spec?.stockThreshold ?? cfg.stockThreshold ?? fallback.stockThreshold,
    buckets: spec?.buckets ?? cfg.buckets ?? fallback.buckets,
  };
}

export async function planBuckets(
  ctx: ReconcileContext,
  items: readonly CatalogItem[],
  loaded: LoadedDefinition | undefined,
): Promise<CatalogItem[]> {
  const live = new Map((loaded?.items ?? []).map((i) => [i.skuId, i.buckets ?? 1]));
  const auto = autoBucketingOf(ctx);
  const chosen = new Map<string, number>();
  for (const i of items) {
    if (!live.has(i.skuId)) chosen.set(i.skuId, chooseBuckets(i.stock, i.buckets, auto));
  }
  const recorded = await recordBucketPlan(ctx.deps.redis, ctx.activityId, chosen);
  crashPoint('operator-after-bucket-plan');
  return items.map((i) => {
    // A live SKU's own spec count stays as written, so an edit of it reaches diffDefinition and
    // is refused there (behind the CRD's rule).
    const n = live.has(i.skuId) ? (i.buckets ?? live.get(i.skuId)!) : (recorded.get(i.skuId) ?? 1);
    const { buckets: _explicit, ...rest } = i;
    return n > 1 ? { ...rest, buckets: n } : rest;
  });
}
