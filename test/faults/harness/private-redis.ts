// A describe block's own Redis topology for a sale that breaks it: a Sentinel set or a Redis
// Cluster started on loopback by test/env/start-redis-*.sh, a fresh database, and the Servers the
// roles use. The block's sale (set `sale` once started) is stopped after the block, then the rest.
import { parseSentinels } from '../../../core/redis.js';
import { freshDatabase, testEnv } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { clusterServers, sentinelServers } from './sale.js';
import type { Sale, Servers } from './sale.js';
import { startPrivateServers, stopPrivateServers } from './servers.js';
import type { PrivateServers } from './servers.js';

export interface PrivateRedisSale {
  /** The private servers (their variables: `priv.env`, their state directory: `priv.state`). */
  readonly priv: PrivateServers;
  readonly db: FreshDatabase;
  readonly servers: Servers;
  /** The block's running sale, stopped after the block if a failed test left it running. */
  sale: Sale | undefined;
}

export function privateRedisSale(kind: 'redis-sentinel' | 'redis-cluster'): PrivateRedisSale {
  const f: { priv?: PrivateServers; db?: FreshDatabase; servers?: Servers; sale: Sale | undefined } = {
    sale: undefined,
  };
  beforeAll(async () => {
    f.priv = await startPrivateServers([kind]);
    f.db = await freshDatabase();
    const kafkaBrokers = testEnv().kafkaBrokers;
    f.servers =
      kind === 'redis-cluster'
        ? clusterServers(parseSentinels(f.priv.env.REDIS_CLUSTER_NODES!.split(',')), f.db.url, kafkaBrokers)
        : sentinelServers(f.priv.env, f.db.url, kafkaBrokers);
  }, 180_000);
  afterAll(async () => {
    await f.sale?.stop();
    await f.db?.drop();
    if (f.priv) await stopPrivateServers(f.priv);
  }, 180_000);
  const ready = <T>(value: T | undefined, what: string): T => {
    if (value === undefined)
      throw new Error(`the private ${kind}'s ${what} is not set up (beforeAll failed?)`);
    return value;
  };
  return {
    get priv() {
      return ready(f.priv, 'servers');
    },
    get db() {
      return ready(f.db, 'database');
    },
    get servers() {
      return ready(f.servers, 'connection settings');
    },
    get sale() {
      return f.sale;
    },
    set sale(s: Sale | undefined) {
      f.sale = s;
    },
  };
}
