/**
 * A/B comparison of two runtime builds on the api's hot paths, for before/after figures of an
 * optimisation on a shared, noisy machine: both api processes run side by side against the same
 * servers, and their runs alternate (A B B A ...), so drifting background load hits both alike.
 * The CPU time per request (from /proc/<pid>/stat) is the steadier figure; req/s is reported too.
 *
 *   node --import tsx bench/ab.ts <distA> <distB> [submit|soldout|healthz] [rounds] [seconds]
 *
 * AB_ENV_A / AB_ENV_B ("K=V,K=V") add environment variables to the A / B process (feature toggles
 * of an experiment build); AB_NODE_ARGS_A / AB_NODE_ARGS_B (space separated) add node options that
 * NODE_OPTIONS does not accept (most V8 flags). AB_AGE_A_S (seconds, default 0) puts the mode's
 * load on A alone before the rounds, so that an aged process compares with a fresh one (two copies
 * of the same dist: does the api get slower as it serves more requests?). Each dist is a compiled tree with core/ and runtime/ (e.g. a copy of the repo built with
 * `tsc -p tsconfig.build.json`); lua/ is taken from beside it, else from this repo. Servers as for
 * bench/run.ts (own ones via env-up, or DATABASE_URL / REDIS_URL / KAFKA_BROKERS).
 */
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { benchItem, migrateSchema, openActivity, openContext, redisCpuS } from './lib/context.js';
import { loadCore, readConfig, serversDown, serversUp } from './lib/env.js';
import { Buyers, getLoad, orderLoad } from './lib/http-load.js';
import type { LoadResult } from './lib/http-load.js';
import { peakRssMb, startRole, stopAllRoles, stopRole } from './lib/runtime.js';
import type { RoleProcess } from './lib/runtime.js';
import { log, median, procCpuS } from './lib/util.js';

type Mode = 'submit' | 'soldout' | 'healthz';

interface Sample {
  rps: number;
  p50: number;
  p99: number;
  apiCpuUs: number;
  redisCpuUs: number;
}

function envList(spec: string | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const kv of (spec ?? '').split(',').filter(Boolean)) {
    const i = kv.indexOf('=');
    if (i > 0) out[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return out;
}

async function main(): Promise<void> {
  const [distA, distB, modeArg = 'submit', roundsArg = '4', secondsArg = '5'] = process.argv.slice(2);
  if (!distA || !distB)
    throw new Error('usage: ab.ts <distA> <distB> [submit|soldout|healthz] [rounds] [seconds]');
  const mode = modeArg as Mode;
  if (!['submit', 'soldout', 'healthz'].includes(mode)) throw new Error(`unknown mode ${modeArg}`);
  const rounds = Number(roundsArg);
  const seconds = Number(secondsArg);
  const cfg = { ...readConfig(), build: false };
  const luaFor = (dist: string): string =>
    existsSync(join(dist, '..', 'lua', 'setGate-1.lua')) ? resolve(dist, '..', 'lua') : join(cfg.repo, 'lua');
  const core = await loadCore({ ...cfg, distDir: resolve(distA), luaDir: luaFor(resolve(distA)) });
  const servers = await serversUp(cfg);
  const c = openContext(cfg, servers, core, 'ab');
  const procs: RoleProcess[] = [];
  try {
    await migrateSchema(servers, resolve(distA), luaFor(resolve(distA)));
    const sale = `bab-${c.runId}`;
    await openActivity(c, sale, [benchItem('hot', 1_000_000_000), benchItem('gone', 1)]);
    for (const [label, dist] of [
      ['A', distA],
      ['B', distB],
    ] as const) {
      procs.push(
        await startRole('api', {
          distDir: resolve(dist),
          luaDir: luaFor(resolve(dist)),
          logDir: c.logDir,
          env: servers.env,
          activityId: sale,
          label: `api-${label}`,
          roleEnv: cfg.roleEnv,
          nodeArgs: (process.env[`AB_NODE_ARGS_${label}`] ?? '').split(' ').filter(Boolean),
          extraEnv: { ...envList(process.env[`AB_ENV_${label}`]), JWT_HS256_SECRET: c.secret },
        }),
      );
    }
    const buyers = new Buyers(c.secret, `ab${c.runId}-`, 20_000);
    const sku = mode === 'soldout' ? 'gone' : 'hot';
    const load = (p: RoleProcess, s: number): Promise<LoadResult> => {
      const base = `http://127.0.0.1:${p.port}`;
      return mode === 'healthz'
        ? getLoad(base, '/healthz', s, cfg.connections)
        : orderLoad({
            baseUrl: base,
            activityId: sale,
            skuId: sku,
            buyers,
            seconds: s,
            connections: cfg.connections,
          });
    };
    if (mode === 'soldout') {
      // Sell the single unit, then let each api learn SOLD_OUT from Redis once.
      for (const p of [procs[0]!, procs[0]!, procs[1]!]) {
        const b = buyers.take();
        await fetch(`http://127.0.0.1:${p.port}/v1/activities/${sale}/orders`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${b.token}` },
          body: JSON.stringify({ skuId: 'gone', quantity: 1, requestId: b.requestId }),
        });
      }
    }
    const ageS = Number(process.env.AB_AGE_A_S ?? 0);
    if (ageS > 0) {
      const aged = await load(procs[0]!, ageS);
      log(`A aged: ${aged.total} requests in ${ageS} s before the rounds`);
    }
    for (const p of procs) await load(p, 2); // warm-up
    const samples: Record<'A' | 'B', Sample[]> = { A: [], B: [] };
    for (let r = 0; r < rounds; r += 1) {
      const order = r % 2 === 0 ? [0, 1] : [1, 0];
      for (const i of order) {
        const p = procs[i]!;
        const a0 = procCpuS(p.pid)!;
        const r0 = await redisCpuS(c);
        const res = await load(p, seconds);
        const a1 = procCpuS(p.pid)!;
        const r1 = await redisCpuS(c);
        const n = Math.max(1, res.total);
        const s: Sample = {
          rps: res.rps,
          p50: res.p50Ms,
          p99: res.p99Ms,
          apiCpuUs: ((a1 - a0) * 1e6) / n,
          redisCpuUs: ((r1 - r0) * 1e6) / n,
        };
        const label = i === 0 ? 'A' : 'B';
        samples[label].push(s);
        log(
          `round ${r + 1} ${label}: ${Math.round(s.rps)} req/s, p50 ${s.p50} ms, api CPU ${Math.round(s.apiCpuUs)} µs/req ` +
            `${JSON.stringify(res.statusCounts)}`,
        );
      }
    }
    const sum = (xs: Sample[]): Record<string, number> => ({
      rps: median(xs.map((x) => x.rps)),
      p50: median(xs.map((x) => x.p50)),
      p99: median(xs.map((x) => x.p99)),
      apiCpuUs: median(xs.map((x) => x.apiCpuUs)),
      redisCpuUs: median(xs.map((x) => x.redisCpuUs)),
    });
    const a = sum(samples.A);
    const b = sum(samples.B);
    process.stdout.write(
      `${JSON.stringify({ mode, rounds, seconds, A: { dist: distA, ...a }, B: { dist: distB, ...b } }, null, 2)}\n` +
        `B/A: req/s ${(b.rps! / a.rps!).toFixed(2)}×, api CPU per request ${(b.apiCpuUs! / a.apiCpuUs!).toFixed(2)}×\n` +
        // Both processes took the same load, alternately: their peaks compare.
        `peak RSS: ${procs.map((p) => `${p.label} ${Math.round((p.idleRssKb ?? 0) / 1024)} → ${Math.round(peakRssMb(p) ?? NaN)} MB`).join(', ')}\n`,
    );
  } finally {
    for (const p of procs) await stopRole(p);
    await stopAllRoles();
    c.redis.disconnect();
    await c.pool.end();
    await serversDown(cfg);
  }
}

main().catch(async (err: unknown) => {
  log(`ab failed: ${(err as Error).stack ?? String(err)}`);
  await stopAllRoles();
  process.exit(1);
});
