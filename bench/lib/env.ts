/**
 * Benchmark configuration, the compiled runtime it measures, and the servers it runs on.
 *
 * Servers: `test/env/env-up.sh` into the benchmark's own state dir (PostgreSQL, Redis, Kafka on
 * loopback), stopped again by `env-down.sh`. A server given through DATABASE_URL / REDIS_URL /
 * KAFKA_BROKERS is used instead and never reconfigured, flushed or stopped.
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type * as ActivityCache from '../../core/activity-cache.js';
import type * as KafkaModule from '../../core/kafka.js';
import type * as Keys from '../../core/keys.js';
import type * as Reservations from '../../core/reservations.js';
import type * as Scripts from '../../core/scripts.js';
import type * as TrafficPolicy from '../../core/traffic-policy.js';
import { log, mustRun, runCmd } from './util.js';

export const PHASES = [
  'redis',
  'submit',
  'db',
  'soldout',
  'floors',
  'profile',
  'micro',
  'ceiling',
  'warmup',
  'pipeline',
  'backlog',
  'fairness',
  'capacity',
  'durability',
  'buckets',
  // Opt-in only (BENCH_ONLY): three more JVMs (bench/lib/kafka-replication.ts).
  'kafka-replication',
] as const;
export type Phase = (typeof PHASES)[number];

export interface BenchConfig {
  repo: string;
  stateDir: string;
  outFile: string;
  /** Directory holding the compiled `core/` and `runtime/` that are measured. */
  distDir: string;
  luaDir: string;
  build: boolean;
  /** Seconds of each measured load run. */
  durationS: number;
  /** Seconds of unmeasured load before each HTTP run (JIT, connection pools). */
  warmupS: number;
  connections: number;
  drainReservations: number;
  warmupSkus: number;
  /** Rounds of the warm-up comparison (medians are reported). */
  warmupRounds: number;
  /** Measured runs of the api's submissions and of each floor's (the median by CPU is reported). */
  cpuRounds: number;
  /** Rounds of the api and both floors measured in turn (bench/lib/floors.ts measurePaired). */
  pairedRounds: number;
  /** Alternating rounds of the bucketed vs not bucketed CPU comparison (medians are reported). */
  bucketsRounds: number;
  /** The whole run must end within this many seconds (the drain wait is cut to fit). */
  budgetS: number;
  /** appendfsync for a Redis the benchmark started itself ('keep' leaves env-up's setting). */
  redisAppendfsync: string;
  phases: Set<Phase>;
  /** Also profile the relay and consumer during the pipeline run (slows them down). */
  profileRoles: boolean;
  /** Extra environment for every runtime role (BENCH_ROLE_ENV="K=V,K=V"), for tuning experiments. */
  roleEnv: Record<string, string>;
  /** Copy the CPU profiles here (they are removed with the state dir otherwise). */
  keepProfilesDir: string | undefined;
}

function num(name: string, def: number): number {
  const v = process.env[name];
  if (v === undefined || v === '') return def;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${name} must be a positive number, got "${v}"`);
  return n;
}

export function readConfig(): BenchConfig {
  const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
  const givenDist = process.env.BENCH_DIST ? resolve(process.env.BENCH_DIST) : undefined;
  const distDir = givenDist ?? join(repo, 'node_modules', '.cache', 'flashsale-bench', 'dist');
  const nextToDist = join(distDir, '..', 'lua');
  const luaDir = process.env.BENCH_LUA_DIR
    ? resolve(process.env.BENCH_LUA_DIR)
    : existsSync(join(nextToDist, 'setGate-1.lua'))
      ? nextToDist
      : join(repo, 'lua');
  const only = (process.env.BENCH_ONLY ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const p of only) {
    if (!(PHASES as readonly string[]).includes(p)) throw new Error(`BENCH_ONLY: unknown phase ${p}`);
  }
  return {
    repo,
    stateDir: resolve(process.env.BENCH_STATE_DIR ?? `/tmp/flashsale-bench-${process.pid}`),
    outFile: resolve(process.env.BENCH_OUT ?? join(repo, 'docs', 'benchmarks.md')),
    distDir,
    luaDir,
    build: givenDist === undefined,
    durationS: num('BENCH_DURATION', 10),
    warmupS: num('BENCH_WARMUP', 3),
    connections: num('BENCH_CONNECTIONS', 50),
    drainReservations: num('BENCH_DRAIN_N', 100_000),
    warmupSkus: num('BENCH_WARMUP_SKUS', 100_000),
    warmupRounds: Math.round(num('BENCH_WARMUP_ROUNDS', 7)),
    bucketsRounds: Math.max(1, Math.round(num('BENCH_BUCKETS_ROUNDS', 3))),
    cpuRounds: Math.max(1, Math.round(num('BENCH_CPU_ROUNDS', 3))),
    pairedRounds: Math.max(1, Math.round(num('BENCH_PAIRED_ROUNDS', 3))),
    budgetS: num('BENCH_BUDGET', 570),
    redisAppendfsync: process.env.BENCH_REDIS_APPENDFSYNC ?? 'everysec',
    phases: new Set<Phase>(
      only.length > 0 ? (only as Phase[]) : PHASES.filter((p) => p !== 'kafka-replication'),
    ),
    profileRoles: process.env.BENCH_PROFILE_ROLES === '1',
    roleEnv: Object.fromEntries(
      (process.env.BENCH_ROLE_ENV ?? '')
        .split(',')
        .filter((kv) => kv.includes('='))
        .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
    ),
    keepProfilesDir: process.env.BENCH_KEEP_PROFILES ? resolve(process.env.BENCH_KEEP_PROFILES) : undefined,
  };
}

/** Compiles core/ and runtime/ (not the operator) into the benchmark's own output directory. */
export async function buildRuntime(cfg: BenchConfig): Promise<void> {
  if (!cfg.build) {
    log(`using the prebuilt runtime in ${cfg.distDir}`);
    return;
  }
  const cache = dirname(cfg.distDir);
  const buildInfo = join(cache, 'tsbuildinfo');
  const tsc = join(cfg.repo, 'node_modules', 'typescript', 'bin', 'tsc');
  const args = [tsc, '-p', join(cfg.repo, 'bench', 'tsconfig.runtime.json'), '--outDir', cfg.distDir];
  log('compiling core/ and runtime/ (tsc)');
  let r = await runCmd(process.execPath, [...args, '--tsBuildInfoFile', buildInfo], { cwd: cfg.repo });
  if (!existsSync(join(cfg.distDir, 'runtime', 'main.js'))) {
    // A stale build-info file with deleted outputs emits nothing: build from scratch.
    r = await runCmd(process.execPath, [...args, '--incremental', 'false'], { cwd: cfg.repo });
  }
  if (!existsSync(join(cfg.distDir, 'runtime', 'main.js'))) {
    throw new Error(`the runtime did not compile:\n${r.stdout.slice(-3000)}`);
  }
  if (r.code !== 0) log(`tsc reported errors (output emitted anyway):\n${r.stdout.slice(-1500)}`);
}

export interface CoreModules {
  cache: typeof ActivityCache;
  keys: typeof Keys;
  scripts: typeof Scripts;
  reservations: typeof Reservations;
  kafka: typeof KafkaModule;
  policy: typeof TrafficPolicy;
}

/** The measured build's core modules (not the TypeScript sources), loaded once. */
export async function loadCore(cfg: BenchConfig): Promise<CoreModules> {
  process.env.FLASHSALE_LUA_DIR = cfg.luaDir;
  const load = async <T>(rel: string): Promise<T> =>
    (await import(pathToFileURL(join(cfg.distDir, rel)).href)) as T;
  return {
    cache: await load<typeof ActivityCache>('core/activity-cache.js'),
    keys: await load<typeof Keys>('core/keys.js'),
    scripts: await load<typeof Scripts>('core/scripts.js'),
    reservations: await load<typeof Reservations>('core/reservations.js'),
    kafka: await load<typeof KafkaModule>('core/kafka.js'),
    policy: await load<typeof TrafficPolicy>('core/traffic-policy.js'),
  };
}

export interface Servers {
  env: Record<string, string>;
  /** Servers this run started (and may therefore reconfigure and flush). */
  owned: { postgres: boolean; redis: boolean; kafka: boolean };
  pgBin: string;
  redisHost: string;
  redisPort: number;
  redisPassword: string | undefined;
}

function findPgBin(env: Record<string, string>): string {
  if (env.PG_BIN && existsSync(join(env.PG_BIN, 'pgbench'))) return env.PG_BIN;
  const root = '/usr/lib/postgresql';
  if (existsSync(root)) {
    for (const v of readdirSync(root).sort().reverse()) {
      if (existsSync(join(root, v, 'bin', 'pgbench'))) return join(root, v, 'bin');
    }
  }
  throw new Error('pgbench not found: apt-get install -y postgresql-contrib (or set PG_BIN)');
}

export async function serversUp(cfg: BenchConfig): Promise<Servers> {
  const owned = {
    postgres: !process.env.DATABASE_URL,
    redis: !process.env.REDIS_URL,
    kafka: !process.env.KAFKA_BROKERS,
  };
  log(`starting servers into ${cfg.stateDir} (own: ${JSON.stringify(owned)})`);
  await mustRun('bash', [join(cfg.repo, 'test', 'env', 'env-up.sh'), cfg.stateDir], {
    cwd: cfg.repo,
    env: { ...process.env, FLASHSALE_SERVICES: 'postgres redis kafka' },
    timeoutMs: 240_000,
  });
  const env = JSON.parse(readFileSync(join(cfg.stateDir, 'env.json'), 'utf8')) as Record<string, string>;
  for (const k of ['DATABASE_URL', 'REDIS_URL', 'KAFKA_BROKERS']) {
    if (!env[k]) throw new Error(`env-up did not provide ${k}`);
  }
  const u = new URL(env.REDIS_URL!);
  return {
    env,
    owned,
    pgBin: findPgBin(env),
    redisHost: u.hostname,
    redisPort: Number(u.port || 6379),
    redisPassword: u.password ? decodeURIComponent(u.password) : undefined,
  };
}

export async function serversDown(cfg: BenchConfig): Promise<void> {
  if (!existsSync(cfg.stateDir)) return;
  log(`stopping the servers of ${cfg.stateDir}`);
  await runCmd('bash', [join(cfg.repo, 'test', 'env', 'env-down.sh'), cfg.stateDir], {
    cwd: cfg.repo,
    timeoutMs: 60_000,
  });
}
