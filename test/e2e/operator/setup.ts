// What the operator's e2e files share before their first test: the CRD, a fresh database (and a
// pool on it), Redis, a namespace with the operator's RBAC, a Recorder of its phases and replicas,
// and the Kafka topics of the activities whose runtime starts before the operator (a consumer
// subscribes at start; the operator's warm-up finds the topics there). Each file starts its own
// processes and stops them before `close()`.
import { Redis } from 'ioredis';
import { createPool } from '../../../core/db/pool.js';
import type { Pool } from '../../../core/db/pool.js';
import { createKafka, ensureTopics, topicsFor } from '../../../core/kafka.js';
import { Recorder, activityBody, installCrd, prepareNamespace } from '../../../dev/operator-harness.js';
import type { Admin, OperatorNamespace } from '../../../dev/operator-harness.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

export interface OperatorWorld {
  db: FreshDatabase;
  pg: Pool;
  redis: Redis;
  ns: OperatorNamespace;
  /** Started unless `record: false`. */
  recorder: Recorder;
  /** Stops the recorder, closes the connections and drops the database. */
  close(): Promise<void>;
}

export interface OperatorWorldOptions {
  /** Prefix of the namespace's unique name. */
  namespace: string;
  /** Activities whose topics are created now (2 partitions). */
  topicsOf?: string[];
  /** Watch the namespace's activities and Deployments (default true). */
  record?: boolean;
}

export async function operatorWorld(a: Admin, o: OperatorWorldOptions): Promise<OperatorWorld> {
  await installCrd(a);
  const db = await freshDatabase();
  const pg = createPool(db.url, 2);
  const redis = new Redis(testEnv().redisUrl);
  const ns = await prepareNamespace(uniqueId(o.namespace), a);
  const recorder = new Recorder(a, ns.namespace);
  if (o.record !== false) await recorder.start();
  if (o.topicsOf && o.topicsOf.length > 0) {
    const kafka = createKafka(testEnv().kafkaBrokers, `${ns.namespace}-setup`).admin();
    await kafka.connect();
    try {
      for (const id of o.topicsOf) await ensureTopics(kafka, topicsFor(id), 2, 1);
    } finally {
      await kafka.disconnect();
    }
  }
  return {
    db,
    pg,
    redis,
    ns,
    recorder,
    close: async () => {
      recorder.stop();
      redis.disconnect();
      await pg.end();
      await db.drop();
    },
  };
}

/**
 * A sale of 3 teas under `activityId`, warming up now and opening in `startInMs`, whose Active phase
 * asks for 3 consumer replicas (one of each other role in every phase): more consumers than the
 * 2 partitions an operator with KAFKA_TOPIC_PARTITIONS=2 creates.
 */
export function saleWithThreeActiveConsumers(
  namespace: string,
  name: string,
  activityId: string,
  startInMs: number,
): Record<string, unknown> {
  const t0 = Date.now();
  return activityBody(namespace, name, {
    warmUpAt: new Date(t0),
    startAt: new Date(t0 + startInMs),
    endAt: new Date(t0 + 60 * 60_000),
    items: [{ skuId: 'tea', name: '茶', price: '5.00', stock: 3 }],
    extraSpec: { activityId },
    replicas: {
      warmUp: { api: 1, relay: 1, consumer: 1 },
      active: { api: 1, relay: 1, consumer: 3 },
      draining: { api: 1, relay: 1, consumer: 1 },
    },
  });
}
