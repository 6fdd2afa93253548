/**
 * Starts the floor servers of bench/floors/server.ts (a bare node:http server and a minimal
 * express route, each with the api's token check and reserve call) as their own processes, so
 * their CPU is read from /proc exactly like the api's.
 */
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { join } from 'node:path';
import { medianByCpu } from './http-load.js';
import type { LoadResult } from './http-load.js';
import { podEnv } from './runtime.js';
import { freePort, log, median, procStatusKb, waitFor } from './util.js';

export type FloorKind = 'node-http' | 'express';

export interface FloorProcess {
  kind: FloorKind;
  pid: number;
  port: number;
  child: ChildProcess;
  exited: Promise<unknown>;
}

/** The floors' figures of one run: order submissions on each, /healthz on the bare one. */
export interface FloorResults {
  nodeHttp?: LoadResult;
  express?: LoadResult;
  nodeHttpHealthz?: LoadResult;
  /** Submissions for a SKU whose stock is gone: what a sold-out answer costs without the api's work. */
  nodeHttpSoldOut?: LoadResult;
  expressSoldOut?: LoadResult;
  /** VmRSS once listening and VmHWM after the load, per floor (MB). */
  rss?: Partial<Record<FloorKind, { idleMb: number; peakMb: number }>>;
}

export interface FloorOptions {
  repo: string;
  distDir: string;
  luaDir: string;
  logDir: string;
  redisUrl: string;
  secret: string;
}

export async function startFloor(kind: FloorKind, o: FloorOptions): Promise<FloorProcess> {
  const port = await freePort();
  const out = createWriteStream(join(o.logDir, `floor-${kind}.log`));
  const child = spawn(process.execPath, ['--import', 'tsx', join(o.repo, 'bench', 'floors', 'server.ts')], {
    cwd: o.repo,
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: process.env.HOME ?? '/tmp',
      NODE_ENV: 'production',
      ...podEnv('api'),
      FLOOR_KIND: kind,
      FLOOR_DIST: o.distDir,
      FLASHSALE_LUA_DIR: o.luaDir,
      PORT: String(port),
      REDIS_URL: o.redisUrl,
      JWT_HS256_SECRET: o.secret,
      JWT_MAX_TOKEN_AGE_SECONDS: '21600',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let listening = false;
  child.stdout?.on('data', (d: Buffer) => {
    out.write(d);
    if (d.toString().includes('listening')) listening = true;
  });
  child.stderr?.on('data', (d: Buffer) => out.write(d));
  let dead = false;
  const exited = new Promise((resolve) =>
    child.on('exit', () => {
      dead = true;
      out.end();
      resolve(undefined);
    }),
  );
  const p: FloorProcess = { kind, pid: child.pid ?? -1, port, child, exited };
  try {
    await waitFor(`floor ${kind}`, 60_000, async () => {
      if (dead) throw new Error(`floor ${kind} exited during start-up (log in ${o.logDir})`);
      return listening ? true : undefined;
    });
  } catch (err) {
    await stopFloor(p);
    throw err;
  }
  log(`floor ${kind} ready (pid ${p.pid}, port ${port})`);
  return p;
}

export async function stopFloor(p: FloorProcess): Promise<void> {
  p.child.kill('SIGTERM');
  const timer = setTimeout(() => p.child.kill('SIGKILL'), 5_000);
  await p.exited;
  clearTimeout(timer);
}

/**
 * Submissions on each floor (the same activity, SKU, buyers and load as the api's submit run) and
 * /healthz on the bare one, each with a warm-up; `withCpu` adds the server's CPU per response.
 */
export async function measureFloors(
  o: FloorOptions,
  run: {
    warmupS: number;
    submit: (base: string, seconds: number) => Promise<LoadResult>;
    healthz: (base: string, seconds: number) => Promise<LoadResult>;
    /** Submissions for a sold-out SKU (each floor's answer is the reserve script's SOLD_OUT). */
    soldOut?: (base: string, seconds: number) => Promise<LoadResult>;
    withCpu: (pid: number, f: () => Promise<LoadResult>) => Promise<LoadResult>;
    seconds: number;
    /** Measured submission runs per floor; the median by CPU is reported. */
    rounds?: number;
  },
): Promise<FloorResults> {
  const out: FloorResults = {};
  for (const kind of ['node-http', 'express'] as const) {
    const p = await startFloor(kind, o);
    const idleKb = procStatusKb(p.pid, 'VmRSS') ?? NaN;
    try {
      const base = `http://127.0.0.1:${p.port}`;
      await run.submit(base, run.warmupS);
      const r = await medianByCpu(run.rounds ?? 1, () =>
        run.withCpu(p.pid, () => run.submit(base, run.seconds)),
      );
      log(
        `floor ${kind} submit: ${Math.round(r.rps)} req/s, ${r.cpu?.api?.toFixed(0) ?? '?'} µs CPU/request ` +
          `(median of ${r.cpuRounds.length}: ${r.cpuRounds.map((x) => x.toFixed(0)).join(', ')} µs)`,
      );
      if (run.soldOut) {
        const soldOut = run.soldOut;
        await soldOut(base, run.warmupS);
        const so = await run.withCpu(p.pid, () => soldOut(base, run.seconds));
        log(
          `floor ${kind} sold-out: ${Math.round(so.rps)} req/s, ${so.cpu?.api?.toFixed(0) ?? '?'} µs CPU/request`,
        );
        if (kind === 'node-http') out.nodeHttpSoldOut = so;
        else out.expressSoldOut = so;
      }
      if (kind === 'node-http') {
        out.nodeHttp = r;
        await run.healthz(base, run.warmupS);
        out.nodeHttpHealthz = await run.withCpu(p.pid, () => run.healthz(base, run.seconds));
        log(`floor ${kind} /healthz: ${out.nodeHttpHealthz.cpu?.api?.toFixed(0) ?? '?'} µs CPU/request`);
      } else {
        out.express = r;
      }
      out.rss = {
        ...out.rss,
        [kind]: { idleMb: idleKb / 1024, peakMb: (procStatusKb(p.pid, 'VmHWM') ?? NaN) / 1024 },
      };
      log(
        `floor ${kind} RSS: ${Math.round(idleKb / 1024)} MB idle, ${Math.round(out.rss[kind]!.peakMb)} MB peak`,
      );
    } finally {
      await stopFloor(p);
    }
  }
  return out;
}

/** CPU µs per submission of one paired round: the api and each floor, measured in turn. */
export interface PairedRound {
  /** The order the three were measured in, this round. */
  order: ('api' | FloorKind)[];
  api: number;
  express: number;
  nodeHttp: number;
}

export interface PairedResults {
  rounds: PairedRound[];
  /** Medians of the per-round ratios (each round's api figure over the same round's floor's). */
  apiOverExpress: number;
  apiOverNodeHttp: number;
}

/**
 * The api and both floors under the same submission load in alternation: each round measures the
 * three in turn (the order rotating from round to round), so a drift of the machine's speed during
 * the run (seen here: the same tree 2-3x slower in the evening) weighs on all three of a round
 * alike. The ratios are those of each round, and their median is reported; the floors' separate
 * medians (measureFloors) come from other minutes of the run.
 */
export async function measurePaired(
  o: FloorOptions,
  run: {
    warmupS: number;
    seconds: number;
    rounds: number;
    /** Submissions on the api under measurement, with its CPU per response. */
    api: (seconds: number) => Promise<LoadResult>;
    submit: (base: string, seconds: number) => Promise<LoadResult>;
    withCpu: (pid: number, f: () => Promise<LoadResult>) => Promise<LoadResult>;
  },
): Promise<PairedResults> {
  const floors: FloorProcess[] = [];
  try {
    for (const kind of ['express', 'node-http'] as const) floors.push(await startFloor(kind, o));
    const onFloor =
      (f: FloorProcess) =>
      (seconds: number, cpu: boolean): Promise<LoadResult> => {
        const go = (): Promise<LoadResult> => run.submit(`http://127.0.0.1:${f.port}`, seconds);
        return cpu ? run.withCpu(f.pid, go) : go();
      };
    const measure: Record<'api' | FloorKind, (seconds: number, cpu: boolean) => Promise<LoadResult>> = {
      api: (s) => run.api(s),
      express: onFloor(floors[0]!),
      'node-http': onFloor(floors[1]!),
    };
    for (const kind of ['express', 'node-http'] as const) await measure[kind](run.warmupS, false);
    const kinds = ['api', 'express', 'node-http'] as const;
    const rounds: PairedRound[] = [];
    for (let i = 0; i < run.rounds; i += 1) {
      const order = kinds.map((_, j) => kinds[(i + j) % kinds.length]!);
      const us: Partial<Record<'api' | FloorKind, number>> = {};
      for (const kind of order) us[kind] = (await measure[kind](run.seconds, true)).cpu?.api ?? NaN;
      const round = {
        order,
        api: us.api ?? NaN,
        express: us.express ?? NaN,
        nodeHttp: us['node-http'] ?? NaN,
      };
      log(
        `paired round ${i + 1}/${run.rounds} (${order.join(', ')}): api ${round.api.toFixed(0)}, ` +
          `express ${round.express.toFixed(0)}, node:http ${round.nodeHttp.toFixed(0)} µs CPU/request ` +
          `(${(round.api / round.express).toFixed(2)}x, ${(round.api / round.nodeHttp).toFixed(2)}x)`,
      );
      rounds.push(round);
    }
    return {
      rounds,
      apiOverExpress: median(rounds.map((r) => r.api / r.express)),
      apiOverNodeHttp: median(rounds.map((r) => r.api / r.nodeHttp)),
    };
  } finally {
    for (const f of floors) await stopFloor(f);
  }
}
