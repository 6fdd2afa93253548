// What the operator's e2e files share before their first test: the CRD, a fresh database (and a
// pool on it), Redis, a namespace with the operator's RBAC, a Recorder of its phases and replicas,
// and the Kafka topics of the activities whose runtime starts before the operator (a consumer
// subscribes at start; the operator's warm-up finds the topics there). Each file starts its own
// processes and stops them before `close()`.
import { Redis } from 'ioredis';
import { createPool } from '../../../core/db/pool.js';
import type { Pool } from '../../../core/db/pool.js';
import { createKafka, ensureTopics, topicsFor } from '../../../core/kafka.js';
import { Recorder, installCrd, prepareNamespace } from '../../../dev/operator-harness.js';
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
