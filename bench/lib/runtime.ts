/** Starts and stops runtime role processes (the compiled `runtime/main.js`) and reads their memory. */
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort, log, procStatusKb, sleep, waitFor } from './util.js';

export type RoleName = 'api' | 'relay' | 'consumer';

export interface RoleProcess {
  role: RoleName;
  label: string;
  pid: number;
  port: number;
  /** The role's metrics port (/metrics). */
  metricsPort: number;
  logFile: string;
  child: ChildProcess;
  exited: Promise<number | null>;
  /** VmRSS right after the role reported ready (kB). */
  idleRssKb: number | undefined;
}

export interface RoleOptions {
  distDir: string;
  luaDir: string;
  logDir: string;
  env: Record<string, string>;
  activityId: string;
  /** A label for log files and profiles (defaults to the role). */
  label?: string;
  nodeArgs?: string[];
  /** Tuning knobs for every role of the run (BENCH_ROLE_ENV). */
  roleEnv?: Record<string, string>;
  extraEnv?: Record<string, string>;
}

const live = new Set<RoleProcess>();

/**
 * The runtime image's settings that shape a role's memory (the Dockerfile's `ENV NODE_OPTIONS=`
 * and `ENV MALLOC_ARENA_MAX=` lines), so the roles and the floors run as they do in their pods.
 */
export function imageEnv(dockerfile = new URL('../../Dockerfile', import.meta.url)): Record<string, string> {
  let text = '';
  try {
    text = readFileSync(dockerfile, 'utf8');
  } catch {
    return {};
  }
  const out: Record<string, string> = {};
  for (const name of ['NODE_OPTIONS', 'MALLOC_ARENA_MAX']) {
    const m = new RegExp(`^ENV ${name}=(?:"([^"]*)"|(\\S*))`, 'm').exec(text);
    if (m) out[name] = m[1] ?? m[2] ?? '';
  }
  return out;
}

export async function startRole(role: RoleName, o: RoleOptions): Promise<RoleProcess> {
  const port = await freePort();
  const metricsPort = await freePort();
  const label = o.label ?? role;
  mkdirSync(o.logDir, { recursive: true });
  const logFile = join(o.logDir, `${label}.log`);
  const out = createWriteStream(logFile);
  const child = spawn(
    process.execPath,
    [...(o.nodeArgs ?? []), join(o.distDir, 'runtime', 'main.js'), role],
    {
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin',
        HOME: process.env.HOME ?? '/tmp',
        DATABASE_URL: o.env.DATABASE_URL!,
        REDIS_URL: o.env.REDIS_URL!,
        KAFKA_BROKERS: o.env.KAFKA_BROKERS!,
        ACTIVITY_ID: o.activityId,
        HTTP_PORT: String(port),
        METRICS_PORT: String(metricsPort),
        HTTP_HOST: '127.0.0.1',
        FLASHSALE_LUA_DIR: o.luaDir,
        LOG_LEVEL: 'info',
        NODE_ENV: 'production',
        ...imageEnv(),
        ...o.roleEnv,
        ...o.extraEnv,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let ready = false;
  let buffered = '';
  child.stdout?.on('data', (d: Buffer) => {
    out.write(d);
    if (!ready) {
      buffered += d.toString();
      if (/"msg":"ready"/.test(buffered)) ready = true;
      if (buffered.length > 1 << 20) buffered = buffered.slice(-4096);
    }
  });
  child.stderr?.on('data', (d: Buffer) => out.write(d));
  const exited = new Promise<number | null>((resolve) =>
    child.on('exit', (code) => {
      out.end();
      resolve(code);
    }),
  );
  const p: RoleProcess = {
    role,
    label,
    pid: child.pid ?? -1,
    port,
    metricsPort,
    logFile,
    child,
    exited,
    idleRssKb: undefined,
  };
  live.add(p);
  let dead = false;
  void exited.then(() => (dead = true));
  try {
    await waitFor(`${label} ready`, 90_000, async () => {
      if (dead) throw new Error(`${label} exited during start-up (log: ${logFile})`);
      if (!ready) return undefined;
      const res = await fetch(`http://127.0.0.1:${port}/readyz`);
      return res.status === 200 ? true : undefined;
    });
  } catch (err) {
    await stopRole(p);
    throw err;
  }
  await sleep(200);
  p.idleRssKb = procStatusKb(p.pid, 'VmRSS');
  log(`${label} ready (pid ${p.pid}, port ${port}, rss ${Math.round((p.idleRssKb ?? 0) / 1024)} MB)`);
  return p;
}

/** Where a role's memory sits (MB): V8's heap spaces as committed now, and external memory. */
export interface HeapBreakdown {
  rssMb: number;
  spacesMb: Record<string, number>;
  externalMb: number;
}

/** Reads a running role's heap from its /metrics (prom-client's default metrics). */
export async function heapBreakdown(p: RoleProcess): Promise<HeapBreakdown | undefined> {
  try {
    const text = await (await fetch(`http://127.0.0.1:${p.metricsPort}/metrics`)).text();
    // prom-client's default metrics, prefixed and labelled with the component (core/metrics.ts).
    const mb = (re: RegExp): number => Number(re.exec(text)?.[1] ?? NaN) / 2 ** 20;
    const spacesMb: Record<string, number> = {};
    for (const m of text.matchAll(
      /^flashsale_nodejs_heap_space_size_total_bytes\{[^}]*space="([^"]+)"[^}]*\} (\d+)/gm,
    )) {
      spacesMb[m[1]!] = Number(m[2]) / 2 ** 20;
    }
    return {
      rssMb: mb(/^flashsale_process_resident_memory_bytes(?:\{[^}]*\})? (\d+)/m),
      spacesMb,
      externalMb: mb(/^flashsale_nodejs_external_memory_bytes(?:\{[^}]*\})? (\d+)/m),
    };
  } catch {
    return undefined;
  }
}

/** Peak RSS (VmHWM) of a running role in MB. */
export function peakRssMb(p: RoleProcess): number | undefined {
  const kb = procStatusKb(p.pid, 'VmHWM');
  return kb === undefined ? undefined : kb / 1024;
}

/** SIGTERM (graceful: the CPU profile is written on exit), SIGKILL after `graceMs`. */
export async function stopRole(p: RoleProcess, graceMs = 25_000): Promise<void> {
  if (!live.has(p)) return;
  live.delete(p);
  p.child.kill('SIGTERM');
  const timer = setTimeout(() => p.child.kill('SIGKILL'), graceMs);
  await p.exited;
  clearTimeout(timer);
}

/** Kills every role still running (exit path of the benchmark). */
export async function stopAllRoles(): Promise<void> {
  await Promise.all([...live].map((p) => stopRole(p, 5_000)));
}
