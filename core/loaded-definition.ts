/**
 * Reads back the activity definition that loadActivity() put into the cache (the fields written
 * by lua/loadItems-var.lua), so a later spec generation can be compared with what is live.
 */
import { activityKeys } from './keys.js';
import type { CatalogItem, GateState } from './model.js';
import type { RedisClient } from './scripts.js';

export interface LoadedDefinition {
  /** The gate as it is now: what buyers meet, whatever the resource's status says. */
  gate: GateState;
  generation: number;
  loads: number;
  startMs: number;
  endMs: number;
  requireOrderCode: boolean;
  reopenOnRelease: boolean;
  /** Items as loaded; `stock` is the initial stock (not what remains). */
  items: CatalogItem[];
}

export async function readLoadedDefinition(
  redis: RedisClient,
  activityId: string,
): Promise<LoadedDefinition | undefined> {
  const k = activityKeys(activityId);
  const meta = await redis.hgetall(k.meta);
  if (!meta.gate) return undefined;
  const skuIds = (await redis.smembers(k.skuIndex)).sort();
  const pipeline = redis.pipeline();
  for (const s of skuIds) pipeline.hmget(k.sku(s), 'initial', 'limit', 'price', 'name', 'buckets');
  const replies = (await pipeline.exec()) ?? [];
  const items: CatalogItem[] = [];
  for (const [i, skuId] of skuIds.entries()) {
    const [initial, limit, price, name, buckets] = (
      (replies[i]?.[1] as (string | null)[] | undefined) ?? []
    ).map((v) => v ?? '');
    const n = Number(buckets || 1);
    // A bucketed SKU's units were loaded into its buckets: its initial stock is their sum.
    let stock = Number(initial ?? 0);
    if (n > 1) {
      const shares = await Promise.all(
        Array.from({ length: n }, (_, b) => redis.hget(k.bucket(skuId, b, n).sku(skuId), 'initial')),
      );
      stock = shares.reduce((sum, v) => sum + Number(v ?? 0), 0);
    }
    items.push({
      skuId,
      name: name ?? '',
      price: price ?? '',
      stock,
      limitPerUser: Number(limit ?? 0),
      ...(n > 1 ? { buckets: n } : {}),
    });
  }
  return {
    gate: meta.gate as GateState,
    generation: Number(meta.gen ?? 0),
    loads: Number(meta.loads ?? 0),
    startMs: Number(meta.startMs ?? 0),
    endMs: Number(meta.endMs ?? 0),
    requireOrderCode: meta.requireCode === '1',
    reopenOnRelease: meta.reopen !== '0',
    items,
  };
}
