// Topics that exist before the operator creates them (by hand, by the brokers' auto-creation, or
// under other settings) are checked against the replication the operator is configured for:
// an orders topic on fewer brokers than configured would acknowledge orders that one broker's loss
// can take, so ensureTopics refuses it, names what falls short, and creates nothing.
import type { Admin } from 'kafkajs';
import { TopicReplicationError, createKafka, ensureTopics, topicsFor } from '../../../core/kafka.js';
import type { TopicNames } from '../../../core/kafka.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';

const TIMEOUT_MS = 60_000;

describe('ensureTopics on topics that exist already', () => {
  let admin: Admin;

  beforeAll(async () => {
    admin = createKafka(testEnv().kafkaBrokers, uniqueId('topic-replication')).admin();
    await admin.connect();
  }, TIMEOUT_MS);

  afterAll(async () => {
    await admin?.disconnect();
  });

  /** The orders topic alone, as the brokers' auto-creation would leave it: 1 replica, min.insync 1. */
  const ordersTopicOnly = async (): Promise<TopicNames> => {
    const topics = topicsFor(uniqueId('prexisting'));
    await admin.createTopics({
      waitForLeaders: true,
      topics: [{ topic: topics.orders, numPartitions: 2, replicationFactor: 1 }],
    });
    return topics;
  };

  const refusal = async (p: Promise<unknown>): Promise<TopicReplicationError> => {
    const err: unknown = await p.then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(TopicReplicationError);
    return err as TopicReplicationError;
  };

  it(
    'refuses fewer replicas and a lower min.insync.replicas than configured, before creating anything',
    async () => {
      const topics = await ordersTopicOnly();
      const err = await refusal(ensureTopics(admin, topics, 2, 3, 2));
      expect(err.shortfalls).toEqual([
        `${topics.orders} has 1 replica(s) per partition, configured 3`,
        `${topics.orders} has min.insync.replicas=1, configured 2`,
      ]);
      expect(err.message).toMatch(/delete them while they hold no orders/);
      // The missing DLQ was not created under the refused settings either.
      expect(await admin.listTopics()).not.toContain(topics.dlq);
    },
    TIMEOUT_MS,
  );

  it(
    'refuses a lower min.insync.replicas alone',
    async () => {
      const topics = await ordersTopicOnly();
      const err = await refusal(ensureTopics(admin, topics, 2, 1, 2));
      expect(err.shortfalls).toEqual([`${topics.orders} has min.insync.replicas=1, configured 2`]);
    },
    TIMEOUT_MS,
  );

  it(
    'accepts topics with the configured replication and creates only what is missing',
    async () => {
      const topics = await ordersTopicOnly();
      expect(await ensureTopics(admin, topics, 2, 1, 1)).toEqual([topics.dlq]);
      expect(await ensureTopics(admin, topics, 2, 1, 1)).toEqual([]);
    },
    TIMEOUT_MS,
  );

  it(
    "checks nothing when the replication is the brokers' default (-1)",
    async () => {
      const topics = await ordersTopicOnly();
      await expect(ensureTopics(admin, topics, 2, -1)).resolves.toEqual([topics.dlq]);
    },
    TIMEOUT_MS,
  );
});
