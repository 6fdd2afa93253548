/**
 * Warm-up: loading N SKUs into Redis with the core's `loadActivity` (chunked, generation-fenced
 * script calls), against the raw cost of the same writes: one pipelined HSET per SKU plus the
 * SADD to the SKU index, with no script and no fencing.
 */
import type { CatalogItem } from '../../core/model.js';
import type { Ctx } from './context.js';
import { log } from './util.js';

export interface WarmupResult {
  skus: number;
  loadS: number;
  rawS: number;
  created: number;
}

function items(n: number): CatalogItem[] {
  return Array.from({ length: n }, (_, i) => ({
    skuId: `s${String(i).padStart(6, '0')}`,
    name: `Bench item ${i}`,
    price: '19.99',
    stock: 100,
    limitPerUser: 1,
  }));
}

export async function warmup(ctx: Ctx, n: number): Promise<WarmupResult> {
  const ours = `bwarm-${ctx.runId}`;
  const raw = `bwraw-${ctx.runId}`;
  ctx.activities.add(ours);
  ctx.activities.add(raw);
  const list = items(n);

  const t0 = performance.now();
  const out = await ctx.core.cache.loadActivity(ctx.redis, {
    id: ours,
    generation: 1,
    startAt: new Date(Date.now() + 3600_000),
    endAt: new Date(Date.now() + 7200_000),
    requireOrderCode: false,
    reopenOnRelease: false,
    items: list,
  });
  const loadS = (performance.now() - t0) / 1000;
  if (out.created !== n) throw new Error(`loadActivity created ${out.created} of ${n} SKUs`);

  const k = ctx.core.keys.activityKeys(raw);
  const t1 = performance.now();
  for (let c = 0; c < n; c += 2000) {
    const chunk = list.slice(c, c + 2000);
    const p = ctx.redis.pipeline();
    for (const i of chunk) {
      p.hset(k.sku(i.skuId), {
        stock: i.stock,
        initial: i.stock,
        limit: i.limitPerUser,
        price: i.price,
        name: i.name,
        gen: 1,
      });
    }
    p.sadd(k.skuIndex, ...chunk.map((i) => i.skuId));
    await p.exec();
  }
  const rawS = (performance.now() - t1) / 1000;
  log(`warm-up of ${n} SKUs: loadActivity ${loadS.toFixed(2)} s, raw pipelined HSET ${rawS.toFixed(2)} s`);
  return { skus: n, loadS, rawS, created: out.created };
}
