// Jest global setup of the integration project: provides PostgreSQL, Redis, Kafka and a Kubernetes
// API server. When DATABASE_URL, REDIS_URL, KAFKA_BROKERS and KUBECONFIG are all set (test/run.sh
// sets them, or a developer's own servers), nothing is started. Otherwise test/env/env-up.sh starts
// the missing ones into a fresh state dir, whose variables are exported into process.env so that the
// jest workers inherit them. See docs/test-environment.md.
//
// Jest loads this file outside its module system: it must not import other .ts files (their
// imports would not be transformed). Shared state with global-teardown.ts goes through process.env.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';

interface ProjectConfig {
  rootDir: string;
}

/** The state dir this process started; global teardown stops exactly that one. */
const OWNED_STATE_VAR = 'FLASHSALE_OWNED_STATE';
const SERVER_VARS = ['DATABASE_URL', 'REDIS_URL', 'KAFKA_BROKERS', 'KUBECONFIG'] as const;
const SIGNALS = { SIGINT: 2, SIGTERM: 15, SIGHUP: 1 } as const;

let starting: ChildProcess | undefined;

function script(rootDir: string, name: string): string {
  return path.join(rootDir, 'test', 'env', name);
}

/** env-down.sh, synchronously (usable in 'exit' and signal handlers). Idempotent. */
function stopEnvironmentSync(rootDir: string, state: string): void {
  if (starting?.pid !== undefined) {
    try {
      process.kill(-starting.pid, 'SIGKILL'); // env-up.sh and all it has started so far
    } catch {
      // already gone
    }
  }
  if (existsSync(state)) {
    spawnSync('bash', [script(rootDir, 'env-down.sh'), state], { stdio: 'ignore', timeout: 60_000 });
  }
}

/** Tears `state` down when jest's parent process exits or is interrupted before global teardown. */
function guard(rootDir: string, state: string): void {
  process.once('exit', () => stopEnvironmentSync(rootDir, state));
  for (const [signal, number] of Object.entries(SIGNALS)) {
    process.once(signal, () => {
      process.stderr.write(`\n[env] ${signal}: stopping the test environment in ${state}\n`);
      stopEnvironmentSync(rootDir, state);
      process.exit(128 + number);
    });
  }
}

/**
 * Runs env-up.sh into `state` (servers whose variable is already set are used, not started) and
 * returns the variables it wrote to env.json. env-up.sh leads its own process group, so that an
 * interrupt stops it and every server it has started so far as a whole.
 */
async function startEnvironment(rootDir: string, state: string): Promise<Record<string, string>> {
  const child = spawn('bash', [script(rootDir, 'env-up.sh'), state], {
    detached: true,
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  starting = child;
  const code = await new Promise<number | null>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (c) => resolve(c));
  });
  starting = undefined;
  if (code !== 0) throw new Error(`test/env/env-up.sh ${state} failed with status ${String(code)}`);
  const parsed: unknown = JSON.parse(readFileSync(path.join(state, 'env.json'), 'utf8'));
  const vars: Record<string, string> = {};
  if (typeof parsed === 'object' && parsed !== null) {
    for (const [k, v] of Object.entries(parsed)) if (typeof v === 'string') vars[k] = v;
  }
  return vars;
}

/** Where build-kube.sh keeps kube-apiserver, etcd and kubectl (also when nothing was started). */
function kubeBinDir(rootDir: string): string | undefined {
  if (process.env.KUBEBUILDER_ASSETS) return process.env.KUBEBUILDER_ASSETS;
  const out = spawnSync('bash', [script(rootDir, 'build-kube.sh'), 'path'], { encoding: 'utf8' });
  const dir = out.status === 0 ? out.stdout.trim() : '';
  return dir !== '' && existsSync(dir) ? dir : undefined;
}

export default async function globalSetup(
  _globalConfig: unknown,
  projectConfig: ProjectConfig,
): Promise<void> {
  const rootDir = projectConfig.rootDir;
  const missing = SERVER_VARS.filter((name) => !process.env[name]);
  if (missing.length > 0 && !process.env[OWNED_STATE_VAR]) {
    const state = path.join('/tmp', `flashsale-test-${process.pid}`);
    stopEnvironmentSync(rootDir, state); // a leftover of a crashed run whose pid was recycled
    guard(rootDir, state);
    process.env[OWNED_STATE_VAR] = state;
    process.stderr.write(`\n[env] starting servers for ${missing.join(', ')} in ${state}\n`);
    const vars = await startEnvironment(rootDir, state);
    for (const [name, value] of Object.entries(vars)) process.env[name] = value;
  }
  if (!process.env.KUBE_BIN || !process.env.KUBECTL) {
    const bin = kubeBinDir(rootDir);
    if (bin) {
      process.env.KUBE_BIN ||= bin;
      if (!process.env.KUBECTL && existsSync(path.join(bin, 'kubectl'))) {
        process.env.KUBECTL = path.join(bin, 'kubectl');
      }
    }
  }
  // dev/servers.ts freshDatabase() re-creates its migrated template once per run.
  process.env.FLASHSALE_TEST_RUN ||= randomBytes(6).toString('hex');
}
