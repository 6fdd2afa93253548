/**
 * Where the api's old generation fills from: V8's sampling heap profiler, over the inspector, on one
 * api under the submission load. With `includeObjectsCollectedByMajorGC` and without the minor-GC
 * counterpart, a sample stays in the profile if its object is still alive or died in the old
 * generation, i.e. was promoted (or allocated there) and collected by a full GC: exactly what makes
 * the old generation grow between full collections. The second profile counts every allocation.
 *
 *   node --import tsx bench/heap-sample.ts [seconds] [submit|soldout]
 *
 * Servers as for bench/run.ts (own ones via env-up, or DATABASE_URL / REDIS_URL / KAFKA_BROKERS).
 */
import { readFileSync } from 'node:fs';
import { benchItem, migrateSchema, openActivity, openContext } from './lib/context.js';
import { loadCore, readConfig, serversDown, serversUp } from './lib/env.js';
import { Buyers, orderLoad } from './lib/http-load.js';
import { startRole, stopAllRoles } from './lib/runtime.js';
import { log, sleep } from './lib/util.js';

interface ProfileNode {
  id: number;
  selfSize: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children: ProfileNode[];
}

class Inspector {
  private next = 1;
  private readonly pending = new Map<number, (r: unknown) => void>();
  private constructor(private readonly ws: WebSocket) {
    ws.addEventListener('message', (ev) => {
      const msg = JSON.parse(String(ev.data)) as { id?: number; result?: unknown; error?: unknown };
      if (msg.id !== undefined) {
        this.pending.get(msg.id)?.(
          msg.error ? Promise.reject(new Error(JSON.stringify(msg.error))) : msg.result,
        );
        this.pending.delete(msg.id);
      }
    });
  }
  static async open(url: string): Promise<Inspector> {
    const ws = new WebSocket(url);
    await new Promise((resolve, reject) => {
      ws.addEventListener('open', resolve);
      ws.addEventListener('error', reject);
    });
    return new Inspector(ws);
  }
  send<T>(method: string, params: Record<string, unknown> = {}): Promise<T> {
    const id = this.next++;
    this.ws.send(JSON.stringify({ id, method, params }));
    return new Promise<T>((resolve) => this.pending.set(id, resolve as (r: unknown) => void));
  }
  close(): void {
    this.ws.close();
  }
}

function bySite(head: ProfileNode): Map<string, number> {
  const out = new Map<string, number>();
  const walk = (n: ProfileNode, stack: string[]): void => {
    const f = n.callFrame;
    const here = `${f.functionName || '(anonymous)'} ${f.url.replace(/^.*node_modules\//, '').replace(/^file:\/\/.*\/dist\//, 'dist/')}:${f.lineNumber + 1}`;
    const path = [...stack, here];
    if (n.selfSize > 0) {
      // The allocating frame and the two callers above it: enough to tell a site apart.
      const key = path.slice(-3).reverse().join(' < ');
      out.set(key, (out.get(key) ?? 0) + n.selfSize);
    }
    for (const c of n.children) walk(c, path);
  };
  walk(head, []);
  return out;
}

async function main(): Promise<void> {
  const seconds = Number(process.argv[2] ?? 10);
  const mode = process.argv[3] ?? 'submit';
  const cfg = readConfig();
  const core = await loadCore(cfg);
  const servers = await serversUp(cfg);
  const c = openContext(cfg, servers, core, 'heap');
  try {
    await migrateSchema(servers, cfg.distDir, cfg.luaDir);
    const sale = `bheap-${c.runId}`;
    await openActivity(c, sale, [benchItem('hot', 1_000_000_000), benchItem('gone', 1)]);
    const api = await startRole('api', {
      distDir: cfg.distDir,
      luaDir: cfg.luaDir,
      logDir: c.logDir,
      env: servers.env,
      activityId: sale,
      nodeArgs: [
        '--inspect=127.0.0.1:0',
        ...(process.env.HEAP_SAMPLE_NODE_ARGS ?? '').split(' ').filter(Boolean),
      ],
      extraEnv: { JWT_HS256_SECRET: c.secret },
    });
    const url = /ws:\/\/127\.0\.0\.1:\d+\/[0-9a-f-]+/.exec(readFileSync(api.logFile, 'utf8'))?.[0];
    if (!url) throw new Error('no inspector URL in the api log');
    const insp = await Inspector.open(url);
    await insp.send('HeapProfiler.enable');
    const buyers = new Buyers(c.secret, `hp${c.runId}-`, 20_000);
    const load = (s: number) =>
      orderLoad({
        baseUrl: `http://127.0.0.1:${api.port}`,
        activityId: sale,
        skuId: mode === 'soldout' ? 'gone' : 'hot',
        buyers,
        seconds: s,
        connections: cfg.connections,
      });
    await load(3);
    for (const minor of [false, true]) {
      await insp.send('HeapProfiler.startSampling', {
        samplingInterval: 4096,
        includeObjectsCollectedByMajorGC: true,
        includeObjectsCollectedByMinorGC: minor,
      });
      const res = await load(seconds);
      await sleep(200);
      const { profile } = await insp.send<{ profile: { head: ProfileNode } }>('HeapProfiler.stopSampling');
      const sites = [...bySite(profile.head)].sort((a, b) => b[1] - a[1]);
      const total = sites.reduce((s, [, v]) => s + v, 0);
      process.stdout.write(
        `\n## ${minor ? 'every allocation' : 'promoted or alive (collected by a full GC or not at all)'}: ` +
          `${(total / 1048576).toFixed(1)} MB over ${res.total} requests = ${(total / res.total).toFixed(0)} B/request\n`,
      );
      for (const [site, bytes] of sites.slice(0, 30)) {
        process.stdout.write(`${(bytes / res.total).toFixed(0).padStart(6)} B/req  ${site}\n`);
      }
    }
    insp.close();
  } finally {
    await stopAllRoles();
    c.redis.disconnect();
    await c.pool.end();
    await serversDown(cfg);
  }
}

main().catch(async (err: unknown) => {
  log(`heap-sample failed: ${(err as Error).stack ?? String(err)}`);
  await stopAllRoles();
  process.exit(1);
});
