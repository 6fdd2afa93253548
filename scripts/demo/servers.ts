// The demo's servers and the processes it starts, and how it stops them: PostgreSQL, Redis, Kafka
// and kube-apiserver from test/env/env-up.sh unless all four are given through the environment;
// everything started is stopped in reverse order whatever happens (end, failure, a signal).
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { OperatorProcess } from '../../dev/operator-harness.js';
import { ROOT } from '../../dev/roles.js';
import type { RoleProcess } from '../../dev/roles.js';
import { clearLive, say } from './display.js';

export const ENV_DIR = join(ROOT, 'test', 'env');
const SERVER_VARS = ['DATABASE_URL', 'REDIS_URL', 'KAFKA_BROKERS', 'KUBECONFIG'] as const;

/** What the demo started, for stopAll. */
export const started: {
  roles: RoleProcess[];
  operator: OperatorProcess | undefined;
  /** Anything else to close, called last first. */
  closers: (() => Promise<void> | void)[];
} = { roles: [], operator: undefined, closers: [] };

let ownedState: string | undefined;
let envUp: ChildProcess | undefined;
let stopping = false;

export const isStopping = (): boolean => stopping;

function stopServersSync(): void {
  if (envUp?.pid !== undefined && envUp.exitCode === null) {
    try {
      process.kill(-envUp.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  if (ownedState && existsSync(ownedState)) {
    spawnSync('bash', [join(ENV_DIR, 'env-down.sh'), ownedState], { stdio: 'ignore', timeout: 90_000 });
  }
  ownedState = undefined;
}

/** Stops everything the demo started: closers, the roles, the operator, then its own servers. */
export async function stopAll(): Promise<void> {
  if (stopping) return;
  stopping = true;
  clearLive();
  const withTimeout = async (p: Promise<unknown>, ms: number): Promise<void> => {
    await Promise.race([p.catch(() => undefined), new Promise((r) => setTimeout(r, ms))]);
  };
  for (const c of started.closers.reverse()) await withTimeout(Promise.resolve().then(c), 5_000);
  await withTimeout(Promise.all(started.roles.map((r) => r.stop())), 25_000);
  await Promise.all(started.roles.map((r) => r.kill()));
  if (started.operator) {
    const op = started.operator;
    await withTimeout(op.kill('SIGTERM'), 15_000);
    await op.kill('SIGKILL');
  }
  if (ownedState) say(`stopping the servers in ${ownedState}`);
  stopServersSync();
}

/** SIGINT, SIGTERM and SIGHUP stop everything and exit 130, 143, 129; so does any exit (servers). */
export function stopOnSignals(): void {
  for (const [signal, code] of [
    ['SIGINT', 130],
    ['SIGTERM', 143],
    ['SIGHUP', 129],
  ] as const) {
    process.on(signal, () => {
      if (stopping) return;
      say(`${signal}: stopping everything the demo started`);
      void stopAll().finally(() => process.exit(code));
    });
  }
  process.on('exit', () => stopServersSync());
}

/** Starts the servers into `stateDir` unless the four variables are all set; sets them. */
export async function startServers(stateDir: string): Promise<void> {
  const missing = SERVER_VARS.filter((n) => !process.env[n]);
  if (missing.length === 0) {
    say('using the servers given by DATABASE_URL, REDIS_URL, KAFKA_BROKERS and KUBECONFIG');
    return;
  }
  ownedState = stateDir;
  spawnSync('bash', [join(ENV_DIR, 'env-down.sh'), stateDir], { stdio: 'ignore' }); // a leftover
  say(`starting PostgreSQL, Redis, Kafka and kube-apiserver in ${stateDir} (missing: ${missing.join(', ')})`);
  const child = spawn('bash', [join(ENV_DIR, 'env-up.sh'), stateDir], {
    detached: true,
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  envUp = child;
  let err = '';
  child.stderr?.on('data', (b: Buffer) => {
    err += b.toString('utf8');
    for (const l of b.toString('utf8').split('\n')) if (l.trim()) say(`  ${l.trim()}`);
  });
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  envUp = undefined;
  if (code !== 0) throw new Error(`test/env/env-up.sh failed (${String(code)}):\n${err.slice(-2000)}`);
  const vars = JSON.parse(readFileSync(join(stateDir, 'env.json'), 'utf8')) as Record<string, unknown>;
  for (const [k, v] of Object.entries(vars)) if (typeof v === 'string') process.env[k] = v;
}
