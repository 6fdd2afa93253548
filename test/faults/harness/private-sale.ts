// A describe block's own servers for a sale that breaks them: a single Redis, a Sentinel set, a Redis
// Cluster or a three-broker Kafka cluster started on loopback by test/env/start-*.sh, a fresh database, and the
// Servers the roles use (the suite's shared servers for the rest). The block's sale (set `sale`
// once started) is stopped after the block, then the private servers.
import type { Admin } from 'kafkajs';
import pg from 'pg';
import { createKafka, topicsFor } from '../../../core/kafka.js';
import type { TopicNames } from '../../../core/kafka.js';
import type { CatalogItem } from '../../../core/model.js';
import { parseSentinels } from '../../../core/redis.js';
import { freshDatabase, testEnv } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { clusterServers, prepareActivity, sentinelServers } from './sale.js';
import type { Sale, Servers } from './sale.js';
import { startPrivateServers, stopPrivateServers } from './servers.js';
import type { PrivateServers, ServerName } from './servers.js';

export interface PrivateSale {
  /** The private servers (their variables: `priv.env`, their state directory: `priv.state`). */
  readonly priv: PrivateServers;
  readonly db: FreshDatabase;
  readonly servers: Servers;
  /** The block's running sale, stopped after the block if a failed test left it running. */
  sale: Sale | undefined;
}

/** An activity on the private Kafka cluster, with the clients a test watches it through. */
export interface KafkaClusterActivity {
  readonly topics: TopicNames;
  /** Connected to the private cluster. */
  readonly admin: Admin;
  /** The block's database. */
  readonly sql: pg.Pool;
  /** Disconnects both; safe to call after a broker died. */
  close(): Promise<void>;
}

export interface PrivateKafkaSale extends PrivateSale {
  /** Prepares an activity whose topics have `partitions` partitions at replication factor 3. */
  activity(activityId: string, items: CatalogItem[], partitions: number): Promise<KafkaClusterActivity>;
}

function privateSale(
  kind: ServerName,
  serversFor: (priv: PrivateServers, db: FreshDatabase) => Servers,
): PrivateSale {
  const f: { priv?: PrivateServers; db?: FreshDatabase; servers?: Servers; sale: Sale | undefined } = {
    sale: undefined,
  };
  beforeAll(async () => {
    f.priv = await startPrivateServers([kind]);
    f.db = await freshDatabase();
    f.servers = serversFor(f.priv, f.db);
  }, 240_000);
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

/** A private single Redis, Sentinel set or Redis Cluster; the suite's Kafka. */
export function privateRedisSale(kind: 'redis' | 'redis-sentinel' | 'redis-cluster'): PrivateSale {
  return privateSale(kind, (priv, db) => {
    const kafkaBrokers = testEnv().kafkaBrokers;
    if (kind === 'redis') return { databaseUrl: db.url, redisUrl: priv.env.REDIS_URL!, kafkaBrokers };
    return kind === 'redis-cluster'
      ? clusterServers(parseSentinels(priv.env.REDIS_CLUSTER_NODES!.split(',')), db.url, kafkaBrokers)
      : sentinelServers(priv.env, db.url, kafkaBrokers);
  });
}

/** A private three-broker KRaft cluster; the suite's Redis. */
export function privateKafkaSale(): PrivateKafkaSale {
  const f = privateSale('kafka-cluster', (priv, db) => ({
    databaseUrl: db.url,
    redisUrl: testEnv().redisUrl,
    kafkaBrokers: priv.env.KAFKA_CLUSTER_BROKERS!.split(','),
  }));
  return Object.assign(f, {
    async activity(
      activityId: string,
      items: CatalogItem[],
      partitions: number,
    ): Promise<KafkaClusterActivity> {
      await prepareActivity(f.servers, activityId, items, { partitions, replicationFactor: 3 });
      const admin = createKafka(f.servers.kafkaBrokers, `faults-${activityId}-admin`).admin();
      await admin.connect();
      const sql = new pg.Pool({ connectionString: f.db.url, max: 2 });
      return {
        topics: topicsFor(activityId),
        admin,
        sql,
        close: async () => {
          await admin.disconnect().catch(() => undefined);
          await sql.end();
        },
      };
    },
  });
}
