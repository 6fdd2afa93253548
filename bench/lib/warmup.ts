/**
 * Warm-up: loading N SKUs into Redis with the core's `loadActivity` (chunked, generation-fenced
 * script calls), against the raw cost of the same writes: one pipelined HSET per SKU plus the
 * SADD to the SKU index, with no script and no fencing.
 *
 * Each is run `rounds` times, alternating which goes first (the second writer of a round finds a
 * bigger keyspace and the other's pages in the allocator), each into a fresh activity whose keys
 * are deleted outside the timing; the figures are the medians. Redis CPU seconds of each run come
 * from INFO cpu, so the report tells the server's work from the client's.
 */
import type { CatalogItem } from '../../core/model.js';
import { dropActivityKeys, redisCpuS } from './context.js';
import type { Ctx } from './context.js';
import { log, median } from './util.js';

export interface WarmupRun {
  wallS: number;
  redisCpuS: number;
  clientCpuS: number;
}

export interface WarmupResult {
  skus: number;
  /** Medians over the rounds. */
  loadS: number;
  rawS: number;
  created: number;
  rounds: number;
  load: WarmupRun[];
  raw: WarmupRun[];
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

async function timed(ctx: Ctx, fn: () => Promise<void>): Promise<WarmupRun> {
  const r0 = await redisCpuS(ctx);
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await fn();
  const wallS = (performance.now() - t0) / 1000;
  const c = process.cpuUsage(c0);
  return { wallS, redisCpuS: (await redisCpuS(ctx)) - r0, clientCpuS: (c.user + c.system) / 1e6 };
}

export async function warmup(ctx: Ctx, n: number, rounds = 3): Promise<WarmupResult> {
  const list = items(n);
  let created = n;
  const load: WarmupRun[] = [];
  const raw: WarmupRun[] = [];

  const ours = async (round: number): Promise<void> => {
    const id = `bwarm${round}-${ctx.runId}`;
    ctx.activities.add(id);
    load.push(
      await timed(ctx, async () => {
        const out = await ctx.core.cache.loadActivity(ctx.redis, {
          id,
          generation: 1,
          startAt: new Date(Date.now() + 3600_000),
          endAt: new Date(Date.now() + 7200_000),
          requireOrderCode: false,
          reopenOnRelease: false,
          items: list,
        });
        created = Math.min(created, out.created);
      }),
    );
    await dropActivityKeys(ctx, id);
  };

  const plain = async (round: number): Promise<void> => {
    const id = `bwraw${round}-${ctx.runId}`;
    ctx.activities.add(id);
    const k = ctx.core.keys.activityKeys(id);
    raw.push(
      await timed(ctx, async () => {
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
      }),
    );
    await dropActivityKeys(ctx, id);
  };

  for (let r = 0; r < rounds; r += 1) {
    if (r % 2 === 0) {
      await ours(r);
      await plain(r);
    } else {
      await plain(r);
      await ours(r);
    }
  }
  if (created !== n) throw new Error(`loadActivity created ${created} of ${n} SKUs`);
  const loadS = median(load.map((x) => x.wallS));
  const rawS = median(raw.map((x) => x.wallS));
  const show = (xs: WarmupRun[]): string => xs.map((x) => x.wallS.toFixed(2)).join(' / ');
  log(
    `warm-up of ${n} SKUs, ${rounds} rounds: loadActivity ${show(load)} s (median ${loadS.toFixed(2)}), ` +
      `raw pipelined HSET ${show(raw)} s (median ${rawS.toFixed(2)})`,
  );
  return { skus: n, loadS, rawS, created, rounds, load, raw };
}
