// SIGKILL and restart of the real servers (brief window 11). The fault suite starts its own
// private servers with the project's start scripts (test/env/start-*.sh) in a throwaway state
// dir, so that killing them never disturbs other test files sharing the suite's servers; the
// restart commands are the ones those scripts use, reading the same state dir files
// (redis.conf, postgres data dir, server.properties, pid files).
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { ROOT, waitFor } from '../../../dev/roles.js';

const run = promisify(execFile);

export type ServerName =
  'postgres' | 'redis' | 'kafka' | 'redis-sentinel' | 'kafka-cluster' | 'redis-cluster';

export interface PrivateServers {
  state: string;
  /** Variables of STATE/<server>.env merged: DATABASE_URL, REDIS_URL, KAFKA_BROKERS, PG_BIN, ... */
  env: Record<string, string>;
}

function readEnvFile(path: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    const m = /^([A-Z_][A-Z0-9_]*)=(.*)$/.exec(line.trim());
    if (m) out[m[1]!] = m[2]!;
  }
  return out;
}

/**
 * Starts the named servers with test/env/start-<name>.sh in a new state dir; `scriptEnv` reaches
 * the scripts (KAFKA_EXTRA_PROPERTIES: lines added to Kafka's server.properties).
 */
export async function startPrivateServers(
  names: ServerName[],
  scriptEnv: Record<string, string> = {},
): Promise<PrivateServers> {
  const state = mkdtempSync(join(tmpdir(), 'fs-faults-srv-'));
  // Sequential: the machine is small, and the scripts pick free ports independently.
  for (const n of names) {
    await run('bash', [join(ROOT, 'test', 'env', `start-${n}.sh`), state], {
      cwd: ROOT,
      env: { ...process.env, ...scriptEnv },
      maxBuffer: 1 << 24,
      timeout: 240_000,
    });
  }
  const env: Record<string, string> = {};
  for (const n of names) Object.assign(env, readEnvFile(join(state, `${n}.env`)));
  return { state, env };
}

/** Stops everything started in the private state dir (test/env/env-down.sh). */
export async function stopPrivateServers(s: PrivateServers): Promise<void> {
  await run('bash', [join(ROOT, 'test', 'env', 'env-down.sh'), s.state], { cwd: ROOT, timeout: 120_000 });
}

/** The server's pid (its start script's pid file in the private state dir). */
export function pidOf(s: PrivateServers, name: ServerName): number {
  return Number(readFileSync(join(s.state, `${name}.pid`), 'utf8').split('\n')[0]);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** SIGKILLs the server (no shutdown, no flush beyond what it already fsynced) and waits. */
export async function killServer(s: PrivateServers, name: ServerName): Promise<void> {
  const pid = pidOf(s, name);
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    return;
  }
  await waitFor(`${name} (${pid}) to die`, async () => !alive(pid), 30_000, 50);
  if (name === 'postgres') {
    // The postmaster's backends notice its death and exit; a restart needs them gone.
    await waitFor(
      'postgres backends to exit',
      async () => {
        const r = await run('pgrep', ['-u', 'postgres', '-f', s.env.PG_DATA ?? '']).catch(() => ({
          stdout: '',
        }));
        return r.stdout.trim() === '';
      },
      30_000,
      100,
    );
  }
}

function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const c = createConnection({ host: '127.0.0.1', port });
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
}

/** Restarts the server with the command its start script used, on the same port and data. */
export async function restartServer(s: PrivateServers, name: ServerName): Promise<void> {
  const e = s.env;
  if (name === 'redis') {
    // daemonize yes + pidfile in the config: the pid file is rewritten by the server.
    await run('redis-server', [e.REDIS_CONF!]);
    await waitFor('redis to answer', async () => {
      const r = await run('redis-cli', ['-p', e.REDIS_PORT!, 'ping']).catch(() => ({ stdout: '' }));
      return r.stdout.trim() === 'PONG';
    });
    return;
  }
  if (name === 'postgres') {
    const pgCtl = [
      join(e.PG_BIN!, 'pg_ctl'),
      '-D',
      e.PG_DATA!,
      '-l',
      join(s.state, 'postgres.log'),
      '-w',
      '-t',
      '60',
      'start',
    ];
    await waitFor(
      'postgres to restart (crash recovery)',
      async () => {
        const r = await run('runuser', ['-u', 'postgres', '--', ...pgCtl]).then(
          () => true,
          () => false,
        );
        return r;
      },
      120_000,
      500,
    );
    const pid = readFileSync(join(e.PG_DATA!, 'postmaster.pid'), 'utf8').split('\n')[0]!;
    writeFileSync(join(s.state, 'postgres.pid'), `${pid}\n`);
    return;
  }
  await startKafkaNode(s, dirname(e.KAFKA_CONFIG!), join(s.state, 'kafka'), e.KAFKA_BROKERS!);
}

/** Starts one Kafka node with the run.sh start-kafka.sh wrote into its dir; waits until it serves. */
async function startKafkaNode(
  s: PrivateServers,
  nodeDir: string,
  files: string,
  broker: string,
): Promise<void> {
  const out = openSync(`${files}.out`, 'a');
  const child = spawn('bash', [join(nodeDir, 'run.sh'), 'kafka.Kafka', join(nodeDir, 'server.properties')], {
    detached: true,
    stdio: ['ignore', out, out],
  });
  child.unref();
  // run.sh execs the JVM: the child's pid is the broker's.
  writeFileSync(`${files}.pid`, `${child.pid}\n`);
  const port = Number(/:(\d+)$/.exec(broker)?.[1]);
  await waitFor(`kafka ${broker} port after restart`, async () => portOpen(port), 120_000, 250);
  await run('node', [join(ROOT, 'test', 'env', 'kafka-ready.cjs'), broker], { timeout: 90_000 });
}

/** The nodes of a Kafka cluster from start-kafka-cluster.sh: node id (1-based) and bootstrap address. */
export function kafkaClusterNodes(s: PrivateServers): { node: number; broker: string; dir: string }[] {
  const brokers = s.env.KAFKA_CLUSTER_BROKERS!.split(',');
  const dirs = s.env.KAFKA_CLUSTER_NODE_DIRS!.split(',');
  return brokers.map((broker, i) => ({ node: i + 1, broker, dir: dirs[i]! }));
}

/** Signals node `node` (1-based, = its broker id) of the private Kafka cluster and waits for its exit. */
async function endKafkaNode(
  s: PrivateServers,
  node: number,
  signal: NodeJS.Signals,
  timeoutMs: number,
): Promise<void> {
  const pid = Number(readFileSync(join(s.state, `kafka-cluster-${node}.pid`), 'utf8').split('\n')[0]);
  try {
    process.kill(pid, signal);
  } catch {
    return;
  }
  await waitFor(`kafka node ${node} (${pid}) to exit on ${signal}`, async () => !alive(pid), timeoutMs, 50);
}

/** SIGKILLs node `node` of the private Kafka cluster and waits for its death. */
export function killKafkaNode(s: PrivateServers, node: number): Promise<void> {
  return endKafkaNode(s, node, 'SIGKILL', 30_000);
}

/**
 * Stops node `node` of the private Kafka cluster as a rolling restart does (SIGTERM: the broker's
 * controlled shutdown hands its partitions' leadership to the others first) and waits for its exit.
 */
export function stopKafkaNode(s: PrivateServers, node: number): Promise<void> {
  return endKafkaNode(s, node, 'SIGTERM', 120_000);
}

/** Restarts a stopped or killed node of the private Kafka cluster on its port and data, as its pod would. */
export async function restartKafkaNode(s: PrivateServers, node: number): Promise<void> {
  const n = kafkaClusterNodes(s).find((x) => x.node === node);
  if (!n) throw new Error(`no kafka cluster node ${node}`);
  await startKafkaNode(s, n.dir, join(s.state, `kafka-cluster-${node}`), n.broker);
}

/** True when the state dir still has the server's pid file (for guards in callers). */
export function hasServer(s: PrivateServers, name: ServerName): boolean {
  return existsSync(join(s.state, `${name}.pid`));
}

/**
 * Restarts a killed Redis node (Sentinel or cluster data node) from its config, as its pod would,
 * and waits until it serves as a replica. A failure names the cause: the node's log since the
 * restart (a port taken meanwhile, a refused config) and, on a cluster, its view of the nodes.
 */
export async function restartRedisAsReplica(conf: string, port: string, timeoutMs = 60_000): Promise<void> {
  const logFile = /^logfile\s+(\S+)/m.exec(readFileSync(conf, 'utf8'))?.[1];
  const logText = (): string => (logFile && existsSync(logFile) ? readFileSync(logFile, 'utf8') : '');
  const before = logText().length;
  const cli = async (...args: string[]): Promise<string> =>
    (await run('redis-cli', ['-p', port, ...args], { timeout: 5_000 }).catch(() => ({ stdout: '' }))).stdout;
  try {
    await run('redis-server', [conf], { timeout: 30_000 });
    await waitFor(
      `the old primary (port ${port}) to rejoin as a replica`,
      async () => /^role:slave/m.test(await cli('info', 'replication')),
      timeoutMs,
      200,
    );
  } catch (e) {
    const since = logText().slice(before).trimEnd().split('\n').slice(-60).join('\n');
    const nodes = /^cluster-enabled\s+yes/m.test(readFileSync(conf, 'utf8'))
      ? await cli('cluster', 'nodes')
      : '';
    throw new Error(
      `${e instanceof Error ? e.message : String(e)}; the node's log since the restart:\n${since}` +
        (nodes ? `\nits CLUSTER NODES:\n${nodes}` : ''),
      { cause: e },
    );
  }
}
