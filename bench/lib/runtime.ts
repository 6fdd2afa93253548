/** Starts and stops runtime role processes (the compiled `runtime/main.js`) and reads their memory. */
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { roleSemiSpaceArgs, semiSpaceArgs } from '../../core/young-generation.js';
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

/** A Kubernetes memory quantity (`512Mi`, `1Gi`, `600M`, bytes) in MiB. */
export function quantityMib(q: string): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(q.trim());
  if (!m) throw new Error(`not a memory quantity: ${q}`);
  const scale: Record<string, number> = {
    Ki: 1 / 1024,
    Mi: 1,
    Gi: 1024,
    Ti: 1024 * 1024,
    k: 1e3 / 1048576,
    M: 1e6 / 1048576,
    G: 1e9 / 1048576,
    T: 1e12 / 1048576,
  };
  return Number(m[1]) * (m[2] ? scale[m[2]]! : 1 / 1048576);
}

/**
 * The old-generation limit (MiB) that Node gives V8 in a container with this memory limit: Node
 * sizes the heap from the cgroup's limit (uv_get_constrained_memory), V8 takes half of it on a
 * 64-bit build without pointer compression (a quarter, times 2), at least 256 and at most 4096.
 * Checked on this machine: `heap_size_limit` is 280 MiB both in a 512Mi memory cgroup and with
 * `--max-old-space-size=256`, next to the image's 8 MiB semi-spaces (24 MiB of young generation).
 * It matters beyond the crash limit: V8 grows the old generation by at most 1.3× its live size
 * between full collections at 256 MiB, and by up to 4× at the 4 GiB a large host gives.
 */
export function podOldSpaceMib(limitMib: number): number {
  return Math.round(Math.min(4096, Math.max(256, limitMib / 2)));
}

interface ChartRoleValues {
  resources?: { limits?: { memory?: string } };
  semiSpaceMiB?: number;
}

interface ChartRuntimeValues {
  resources?: ChartRoleValues['resources'];
  roles?: Partial<Record<RoleName, ChartRoleValues>>;
}

/** The chart's `runtime` values the roles' pods are started from. */
function chartRuntime(values: URL): ChartRuntimeValues | undefined {
  return (parseYaml(readFileSync(values, 'utf8')) as { runtime?: ChartRuntimeValues }).runtime;
}

/**
 * The memory limit of a runtime role's pod in the chart's defaults (`runtime.roles.<role>.resources`,
 * else `runtime.resources`), or BENCH_POD_MEMORY (a quantity, or `none`: the host's heap limit).
 */
export function podMemoryMib(
  role: RoleName,
  values = new URL('../../charts/flashsale/values.yaml', import.meta.url),
): number | undefined {
  const override = process.env.BENCH_POD_MEMORY;
  if (override === 'none') return undefined;
  if (override) return quantityMib(override);
  const runtime = chartRuntime(values);
  const limit = runtime?.roles?.[role]?.resources?.limits?.memory ?? runtime?.resources?.limits?.memory;
  return limit ? quantityMib(limit) : undefined;
}

/**
 * The node arguments the operator puts on a role's command line (operator/reconcile/runtime-objects.ts):
 * the semi-space of the chart's `runtime.roles.<role>.semiSpaceMiB`, else the role's default
 * (core/young-generation.ts); BENCH_SEMI_SPACE_MIB (`relay=8,consumer=8`) overrides it for an A/B.
 */
export function podNodeArgs(
  role: RoleName,
  values = new URL('../../charts/flashsale/values.yaml', import.meta.url),
): string[] {
  const override = (process.env.BENCH_SEMI_SPACE_MIB ?? '')
    .split(',')
    .map((kv) => kv.split('='))
    .find(([r]) => r === role)?.[1];
  if (override !== undefined) return semiSpaceArgs(Number(override));
  return roleSemiSpaceArgs(role, chartRuntime(values)?.roles?.[role]?.semiSpaceMiB);
}

/**
 * What a role (or a floor, with the api's pod) runs with in its pod: the image's environment and
 * the heap limit Node derives from the pod's memory limit (in NODE_OPTIONS, which accepts it).
 */
export function podEnv(role: RoleName): Record<string, string> {
  const env = imageEnv();
  const mib = podMemoryMib(role);
  if (mib !== undefined) {
    env.NODE_OPTIONS = [env.NODE_OPTIONS, `--max-old-space-size=${podOldSpaceMib(mib)}`]
      .filter(Boolean)
      .join(' ');
  }
  return env;
}

/** A role that exited before it was ready, with the output it left. */
class ExitedDuringStartUp extends Error {
  constructor(
    label: string,
    readonly logFile: string,
  ) {
    super(`${label} exited during start-up (log: ${logFile})`);
  }
}

/**
 * Starts a role on free loopback ports. freePort() closes the port it found before the role binds
 * it, so another socket can take it in between: a role that exits with EADDRINUSE before it was
 * ready is started again on other ports, up to three times.
 */
export async function startRole(role: RoleName, o: RoleOptions): Promise<RoleProcess> {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await launchRole(role, o, await freePort(), await freePort());
    } catch (err) {
      if (!(err instanceof ExitedDuringStartUp) || attempt >= 3) throw err;
      if (!readFileSync(err.logFile, 'utf8').includes('EADDRINUSE')) throw err;
      log(`${o.label ?? role}: a port was taken before it listened; starting it again on other ports`);
    }
  }
}

async function launchRole(
  role: RoleName,
  o: RoleOptions,
  port: number,
  metricsPort: number,
): Promise<RoleProcess> {
  const label = o.label ?? role;
  mkdirSync(o.logDir, { recursive: true });
  const logFile = join(o.logDir, `${label}.log`);
  const out = createWriteStream(logFile);
  const child = spawn(
    process.execPath,
    [...podNodeArgs(role), ...(o.nodeArgs ?? []), join(o.distDir, 'runtime', 'main.js'), role],
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
        ...podEnv(role),
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
  // Resolved once the log file holds everything the process wrote.
  const logged = new Promise<void>((resolve) => out.once('close', () => resolve()));
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
  let started: 'ready' | 'exited';
  try {
    started = await waitFor(`${label} ready`, 90_000, async () => {
      if (dead) return 'exited';
      if (!ready) return undefined;
      const res = await fetch(`http://127.0.0.1:${port}/readyz`);
      return res.status === 200 ? 'ready' : undefined;
    });
  } catch (err) {
    await stopRole(p);
    throw err;
  }
  if (started === 'exited') {
    await stopRole(p);
    await logged;
    throw new ExitedDuringStartUp(label, logFile);
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
