// A role's Redis connection that ends for good (ioredis' `end`: it will not reconnect) while the
// role is not stopping makes the process exit with 1, so that it is restarted (runtime/roles/
// process.ts redisFactory, core/redis.ts whenEndedForGood and exitWhenRedisEnds, which the
// operator's one connection uses too). Before, such a process kept
// answering every request with an error while its liveness probe passed: ioredis 5.11.1's Sentinel
// race ended the api's client that way after a failover (docs/faults.md window 12). Real clients
// of a real Redis and a real Redis Cluster (test/env/start-redis-cluster.sh, or the one
// REDIS_CLUSTER_NODES names); the client is ended by `disconnect()`, the call through which that
// race ended it, and only the process's exit is the test's seam.
import { once } from 'node:events';
import { createLogger } from '../../../core/logger.js';
import { exitWhenRedisEnds, parseSentinels } from '../../../core/redis.js';
import type { SentinelAddress } from '../../../core/redis.js';
import type { RedisClient } from '../../../core/scripts.js';
import { redisFactory } from '../../../runtime/roles/process.js';
import { testEnv } from '../../../dev/servers.js';
import { startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';

interface Process {
  exits: number[];
  stopping: boolean;
  connect: (name: string) => RedisClient;
}

/** A role process's Redis factory, as runtime/main.ts wires it, with exit() recorded. */
function roleProcess(redis: { REDIS_URL?: string; REDIS_CLUSTER_NODES?: SentinelAddress[] }): Process {
  const p: Process = { exits: [], stopping: false, connect: () => undefined as never };
  const { connectRedis } = redisFactory(
    { REDIS_SENTINELS: [], ...redis, REDIS_COMMAND_TIMEOUT_MS: 2_000 },
    createLogger('redis-client-ended-test', 'silent'),
    exitWhenRedisEnds(
      () => p.stopping,
      createLogger('redis-client-ended-test', 'silent'),
      (code) => p.exits.push(code),
    ),
  );
  p.connect = (name) => connectRedis(name, { maxRetriesPerRequest: 3 });
  return p;
}

describe('a role process whose Redis connection ends for good exits to be restarted', () => {
  let priv: PrivateServers | undefined;
  let clusterNodes: SentinelAddress[];

  beforeAll(async () => {
    if (process.env.REDIS_CLUSTER_NODES)
      clusterNodes = parseSentinels(process.env.REDIS_CLUSTER_NODES.split(','));
    else {
      priv = await startPrivateServers(['redis-cluster']);
      clusterNodes = parseSentinels(priv.env.REDIS_CLUSTER_NODES!.split(','));
    }
  }, 180_000);

  afterAll(async () => {
    if (priv) await stopPrivateServers(priv);
  });

  const cases: [string, () => Parameters<typeof roleProcess>[0]][] = [
    ['one Redis', () => ({ REDIS_URL: testEnv().redisUrl })],
    ['a Redis Cluster', () => ({ REDIS_CLUSTER_NODES: clusterNodes })],
  ];

  test.each(cases)('%s: ended while serving → exit(1); ended at shutdown → no exit', async (_, redis) => {
    const p = roleProcess(redis());
    const serving = p.connect('commands');
    const other = p.connect('restock-subscriber');
    try {
      expect(await serving.ping()).toBe('PONG');
      expect(await other.ping()).toBe('PONG');

      // Serving: the connection ends as the ioredis race ended it. The process exits with 1, once.
      const ended = once(serving, 'end');
      serving.disconnect();
      // The exit is recorded in the same `end` emit, before this test's own listener runs.
      await ended;
      expect(p.exits).toEqual([1]);
      // The other connection is untouched: only the one that ended decides.
      expect(await other.ping()).toBe('PONG');

      // Shutdown: the closers quit every connection; nothing exits on their account.
      p.stopping = true;
      const quit = once(other, 'end');
      await other.quit();
      await quit;
      await new Promise((resolve) => setImmediate(resolve));
      expect(p.exits).toEqual([1]);
    } finally {
      // A failed case must not leave clients reconnecting behind it.
      p.stopping = true;
      serving.disconnect();
      other.disconnect();
    }
  });
});
