/**
 * The one place that builds Redis clients, for the runtime roles, the operator and the tools. A
 * client reaches either one node (`REDIS_URL`) or the primary that Redis Sentinel names
 * (`REDIS_SENTINELS` + `REDIS_SENTINEL_MASTER`; credentials and database still come from
 * `REDIS_URL` when given). Through Sentinel, ioredis asks the sentinels for the primary on every
 * (re)connect, checks that the node it reached is a primary, and follows `+switch-master` at once
 * (failoverDetector), so after a failover every client writes to the promoted replica.
 *
 * A Redis Cluster (`REDIS_CLUSTER_NODES`, a few of its nodes as seeds) gets an ioredis `Cluster`:
 * it routes every command by its keys' slot, follows MOVED/ASK and re-reads the slot map after a
 * failover. Scripts defined with `defineCommand` run as EVALSHA on the node of their keys and
 * fall back to EVAL on NOSCRIPT per node, so nothing is preloaded. What a cluster changes for the
 * callers: a pipeline or MULTI must keep to one slot (one scope of keys.ts), SCAN runs per
 * primary (`redis.nodes('master')`), and pub/sub works unchanged (PUBLISH reaches every node).
 */
import { Cluster, Redis } from 'ioredis';
import type { ClusterOptions, RedisOptions } from 'ioredis';
import type { Logger } from './logger.js';
import { keyCountFirstCommands } from './scripts.js';
import type { RedisClient } from './scripts.js';
import { z } from 'zod';

export interface SentinelAddress {
  host: string;
  port: number;
}

export interface RedisConnection {
  /** redis://[user:password@]host:port[/db]; with sentinels only user, password and db are used. */
  url?: string | undefined;
  sentinels?: SentinelAddress[] | undefined;
  /** The master name the sentinels monitor. */
  sentinelMaster?: string | undefined;
  sentinelPassword?: string | undefined;
  /** Seed nodes of a Redis Cluster; with them only user, password and TLS come from `url`. */
  clusterNodes?: SentinelAddress[] | undefined;
}

/** `host:port,host:port` -> addresses; throws on a malformed entry. */
export function parseSentinels(list: readonly string[]): SentinelAddress[] {
  return list.map((entry) => {
    const m = /^\[?([^\]\s]+?)\]?:(\d{1,5})$/.exec(entry.trim());
    if (!m || Number(m[2]) < 1 || Number(m[2]) > 65535) {
      throw new Error(`"${entry}" is not host:port`);
    }
    return { host: m[1]!, port: Number(m[2]) };
  });
}

/**
 * The Redis variables every program reads (zod shape, merged into the program's schema):
 * REDIS_URL, REDIS_SENTINELS, REDIS_SENTINEL_MASTER, REDIS_SENTINEL_PASSWORD, REDIS_CLUSTER_NODES.
 */
const addressList = () =>
  z
    .string()
    .default('')
    .transform((v, ctx) => {
      const list = v
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
      try {
        return parseSentinels(list);
      } catch (err) {
        ctx.addIssue({ code: z.ZodIssueCode.custom, message: (err as Error).message });
        return z.NEVER;
      }
    });

export const redisEnvShape = {
  REDIS_URL: z.string().url().optional(),
  REDIS_SENTINELS: addressList(),
  REDIS_CLUSTER_NODES: addressList(),
  REDIS_SENTINEL_MASTER: z.string().min(1).optional(),
  REDIS_SENTINEL_PASSWORD: z.string().min(1).optional(),
};

interface RedisEnv {
  REDIS_URL?: string | undefined;
  REDIS_SENTINELS: SentinelAddress[];
  REDIS_CLUSTER_NODES?: SentinelAddress[] | undefined;
  REDIS_SENTINEL_MASTER?: string | undefined;
  REDIS_SENTINEL_PASSWORD?: string | undefined;
}

/** The cross-field rule: a URL, sentinels or cluster nodes; a master name with the sentinels. */
export function redisEnvIssue(c: RedisEnv): { path: string; message: string } | undefined {
  if ((c.REDIS_CLUSTER_NODES?.length ?? 0) > 0) {
    if (c.REDIS_SENTINELS.length > 0) {
      return {
        path: 'REDIS_CLUSTER_NODES',
        message: 'REDIS_SENTINELS and REDIS_CLUSTER_NODES exclude each other',
      };
    }
    return undefined;
  }
  if (c.REDIS_SENTINELS.length > 0) {
    if (!c.REDIS_SENTINEL_MASTER) {
      return { path: 'REDIS_SENTINEL_MASTER', message: 'required with REDIS_SENTINELS' };
    }
    return undefined;
  }
  if (!c.REDIS_URL)
    return { path: 'REDIS_URL', message: 'required (or REDIS_SENTINELS or REDIS_CLUSTER_NODES)' };
  return undefined;
}

export function redisConnectionOf(c: RedisEnv): RedisConnection {
  return {
    url: c.REDIS_URL,
    sentinels: c.REDIS_SENTINELS,
    sentinelMaster: c.REDIS_SENTINEL_MASTER,
    sentinelPassword: c.REDIS_SENTINEL_PASSWORD,
    clusterNodes: c.REDIS_CLUSTER_NODES,
  };
}

export function usesCluster(conn: RedisConnection): boolean {
  return (conn.clusterNodes?.length ?? 0) > 0;
}

/** Whether a client is an ioredis Cluster (SCAN per node, pipelines per slot). */
export function isCluster(redis: RedisClient): redis is Cluster {
  return redis instanceof Cluster;
}

/** The primaries to run a keyless per-node command on (SCAN): every primary of a cluster. */
export function primariesOf(redis: RedisClient): Redis[] {
  return isCluster(redis) ? redis.nodes('master') : [redis];
}

export function usesSentinel(conn: RedisConnection): boolean {
  return (conn.sentinels?.length ?? 0) > 0;
}

/** What to log about a connection (never a password). */
export function describeRedis(conn: RedisConnection): string {
  if (usesCluster(conn)) return `cluster ${conn.clusterNodes!.map((s) => `${s.host}:${s.port}`).join(',')}`;
  if (usesSentinel(conn)) {
    return `sentinel ${conn.sentinelMaster ?? ''}@${conn.sentinels!.map((s) => `${s.host}:${s.port}`).join(',')}`;
  }
  try {
    const u = new URL(conn.url ?? '');
    return `${u.protocol}//${u.host}${u.pathname === '/' ? '' : u.pathname}`;
  } catch {
    return '(invalid url)';
  }
}

/**
 * A new client for the connection, with the caller's options (pipelining, retries, ...): a
 * `Redis` for one node or Sentinel, a `Cluster` for a Redis Cluster.
 */
export function createRedis(conn: RedisConnection, options: RedisOptions = {}): RedisClient {
  if (usesCluster(conn)) return createCluster(conn, options);
  return createNodeRedis(conn, options);
}

/**
 * What a process does when one of its Redis connections ends for good while it is not stopping
 * (whenEndedForGood): `ended` is told which connection; `stopping` says whether the process is
 * shutting down, when its own closers' `quit()`s end every connection.
 */
export interface RedisEndPolicy {
  stopping: () => boolean;
  ended: (connection: string) => void;
}

/**
 * Tells `policy` once if the client (named `connection`) ends for good (ioredis' `end`: no
 * reconnection will be made) while the process is not stopping. Every client here reconnects for
 * ever (ioredis' retry strategies never give up), so a client ends only when it is closed on
 * purpose, at shutdown, or through a client bug: ioredis 5.11.1's Sentinel race
 * (patches/ioredis+5.11.1.patch) ended the api's client after a failover, and the api then
 * answered `503` to every buyer while its liveness probe passed. Such a process cannot recover by
 * itself; the policy exits, and Kubernetes starts it afresh.
 */
export function whenEndedForGood(client: RedisClient, policy: RedisEndPolicy, connection: string): void {
  client.once('end', () => {
    if (!policy.stopping()) policy.ended(connection);
  });
}

/**
 * The policy of every process (runtime roles, operator): log which connection ended, then exit
 * with 1 so that Kubernetes restarts it, rather than answering every request with an error while
 * alive. No closer runs: each would wait on the dead connection, and every state change is safe
 * to resume after a crash. `exit` is the tests' seam.
 */
export function exitWhenRedisEnds(
  stopping: () => boolean,
  logger: Logger,
  exit: (code: number) => void = (code) => process.exit(code),
): RedisEndPolicy {
  return {
    stopping,
    ended: (connection) => {
      logger.error(
        { connection },
        'redis connection ended for good (the client will not reconnect); exiting to be restarted',
      );
      exit(1);
    },
  };
}

/** A client of one node (or of the primary Sentinel names); never a cluster. */
export function createNodeRedis(conn: RedisConnection, options: RedisOptions = {}): Redis {
  if (usesCluster(conn)) throw new Error('a Redis Cluster connection needs createRedis()');
  if (usesSentinel(conn)) {
    const u = conn.url ? new URL(conn.url) : undefined;
    return new Redis({
      sentinels: conn.sentinels!,
      name: conn.sentinelMaster!,
      ...(conn.sentinelPassword ? { sentinelPassword: conn.sentinelPassword } : {}),
      ...(u?.username ? { username: decodeURIComponent(u.username) } : {}),
      ...(u?.password ? { password: decodeURIComponent(u.password) } : {}),
      ...(u && u.pathname.length > 1 ? { db: Number(u.pathname.slice(1)) } : {}),
      // ioredis ignores `tls` for the data nodes a Sentinel names unless told to use it: without
      // the flag a rediss:// URL connected in plain text (refused by a TLS-only node).
      ...(u?.protocol === 'rediss:' ? { tls: {}, enableTLSForSentinelMode: true } : {}),
      failoverDetector: true,
      ...options,
    });
  }
  if (!conn.url) throw new Error('no Redis URL and no sentinels');
  return new Redis(conn.url, options);
}

/**
 * How often a cluster client reads the slot map again, so that it leaves a primary that stalls
 * once the cluster has promoted its replica (the stall a buyer sees is the cluster's failure
 * detection, `cluster-node-timeout`, plus at most this, plus ioredis' 2 s `disconnectTimeout`).
 * One CLUSTER SLOTS per client per interval.
 */
export const CLUSTER_TOPOLOGY_REFRESH_MS = 2000;

function createCluster(conn: RedisConnection, options: RedisOptions): Cluster {
  const u = conn.url ? new URL(conn.url) : undefined;
  const { enableAutoPipelining, lazyConnect, ...nodeOptions } = options;
  const clusterOptions: ClusterOptions = {
    // Writes and reads go to primaries: a replica's copy may lag behind a reservation.
    scaleReads: 'master',
    ...(enableAutoPipelining !== undefined ? { enableAutoPipelining } : {}),
    ...(enableAutoPipelining ? { autoPipeliningIgnoredCommands: keyCountFirstCommands() } : {}),
    ...(lazyConnect !== undefined ? { lazyConnect } : {}),
    // After a primary dies its slots are unserved until a replica is promoted (a few seconds):
    // commands wait and retry meanwhile instead of failing at once.
    retryDelayOnClusterDown: 200,
    retryDelayOnFailover: 200,
    retryDelayOnTryAgain: 100,
    slotsRefreshTimeout: 2000,
    // A primary that stalls (a paused VM, a hung disk, a partition) answers nothing and closes
    // nothing: no MOVED and no closed connection ever tells the client that its replica was
    // promoted, and commands sent to it wait forever. The slot map is read again periodically:
    // a node that no longer serves any slot is dropped, and the commands it held are sent again
    // where their slots now live.
    slotsRefreshInterval: CLUSTER_TOPOLOGY_REFRESH_MS,
    redisOptions: {
      ...(u?.username ? { username: decodeURIComponent(u.username) } : {}),
      ...(u?.password ? { password: decodeURIComponent(u.password) } : {}),
      ...(u?.protocol === 'rediss:' ? { tls: {} } : {}),
      ...nodeOptions,
    },
  };
  return new Cluster(
    conn.clusterNodes!.map((n) => ({ host: n.host, port: n.port })),
    clusterOptions,
  );
}

/**
 * XGROUP CREATE (BUSYGROUP ignored, and an OOM refusal when the group exists). ioredis does not
 * know XGROUP's key position, so on a cluster it would go to a random node (and an auto-pipelined
 * MOVED is not followed): it is sent in a pipeline behind a keyed command on the stream, which
 * routes the pipeline to the stream's node.
 */
export async function createStreamGroup(
  redis: RedisClient,
  stream: string,
  group: string,
  opts: { mkstream: boolean },
): Promise<void> {
  const args: string[] = ['CREATE', stream, group, '0', ...(opts.mkstream ? ['MKSTREAM'] : [])];
  const replies = await redis
    .pipeline()
    .exists(stream)
    .call('XGROUP', ...args)
    .exec();
  const err = replies?.[1]?.[0];
  if (!err || /BUSYGROUP/.test(err.message)) return;
  // A Redis at its maxmemory refuses XGROUP CREATE (a command that may grow memory) with OOM even
  // when the group exists, where BUSYGROUP was meant: a relay (re)started then would never run,
  // and draining the outbox is what frees that memory. So a refusal is checked against the
  // groups the stream has (XINFO only reads).
  if (await streamHasGroup(redis, stream, group)) return;
  throw err;
}

/** Whether `stream` exists and has the consumer group `group` (routed to the stream's node). */
async function streamHasGroup(redis: RedisClient, stream: string, group: string): Promise<boolean> {
  const replies = await redis.pipeline().exists(stream).call('XINFO', 'GROUPS', stream).exec();
  const groups = replies?.[1]?.[0] ? [] : replies?.[1]?.[1];
  if (!Array.isArray(groups)) return false;
  // RESP2: each group is a flat list of field, value pairs; its name follows 'name'.
  return groups.some((g) => {
    const at = Array.isArray(g) ? g.indexOf('name') : -1;
    return at >= 0 && (g as unknown[])[at + 1] === group;
  });
}

/** used_memory and maxmemory (0: no limit) of one Redis node, in bytes. */
export interface RedisMemory {
  usedBytes: number;
  maxBytes: number;
}

/** INFO memory's used_memory and maxmemory. */
export function parseRedisMemory(info: string): RedisMemory {
  const field = (name: string): number => {
    const m = new RegExp(`^${name}:(\\d+)\\s*$`, 'm').exec(info);
    if (!m) throw new Error(`INFO memory has no ${name}`);
    return Number(m[1]);
  };
  return { usedBytes: field('used_memory'), maxBytes: field('maxmemory') };
}

/** The fuller of two nodes: the higher share of its maxmemory; without limits, the more used. */
export function fullerRedis(a: RedisMemory, b: RedisMemory): RedisMemory {
  const share = (m: RedisMemory): number => (m.maxBytes > 0 ? m.usedBytes / m.maxBytes : 0);
  if (share(a) !== share(b)) return share(a) > share(b) ? a : b;
  return a.usedBytes >= b.usedBytes ? a : b;
}

/**
 * The memory of the fullest primary a client writes to (every primary of a Cluster: a sale's
 * buckets spread over them). A full primary (noeviction) refuses reservations; a Kafka outage fills
 * it with half messages (docs/capacity.md, "Redis memory").
 */
export async function redisMemory(redis: RedisClient): Promise<RedisMemory> {
  const nodes: Redis[] = redis instanceof Cluster ? redis.nodes('master') : [redis];
  const each = await Promise.all(nodes.map(async (n) => parseRedisMemory(await n.info('memory'))));
  if (each.length === 0) throw new Error('no Redis primary to read memory from');
  return each.reduce(fullerRedis);
}
