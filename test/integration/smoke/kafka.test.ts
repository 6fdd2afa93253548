// Smoke: an idempotent producer and a consumer group through kafkajs.
import { Kafka, logLevel, type Admin } from 'kafkajs';
import { fixKafkajsIdleLoop } from '../../../core/kafkajs-idle-loop.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';

// jest's per-project testTimeout is ignored by jest 29: each hook and test sets its own.
const TIMEOUT_MS = 120_000;

describe('kafka smoke', () => {
  let kafka: Kafka;
  let admin: Admin;

  beforeAll(async () => {
    // As core/kafka.ts does before any client: an idle connection then polls nothing (and Node
    // prints no TimeoutNegativeWarning for kafkajs' negative re-arm delay).
    expect(fixKafkajsIdleLoop()).toBe(true);
    kafka = new Kafka({
      clientId: uniqueId('smoke'),
      brokers: testEnv().kafkaBrokers,
      logLevel: logLevel.NOTHING,
    });
    admin = kafka.admin();
    await admin.connect();
  }, TIMEOUT_MS);
  afterAll(async () => {
    await admin.disconnect();
  }, TIMEOUT_MS);

  it(
    'delivers every message once, in key order, to a consumer group, and commits its offsets',
    async () => {
      const topic = uniqueId('smoke-orders');
      const groupId = uniqueId('smoke-group');
      await expect(
        admin.createTopics({
          topics: [{ topic, numPartitions: 3, replicationFactor: 1 }],
          waitForLeaders: true,
        }),
      ).resolves.toBe(true);
      expect(await admin.listTopics()).toContain(topic);

      const producer = kafka.producer({
        idempotent: true,
        maxInFlightRequests: 1,
        allowAutoTopicCreation: false,
      });
      await producer.connect();
      const keys = ['a', 'b', 'c', 'd'];
      const sent = Array.from({ length: 20 }, (_, i) => ({
        key: keys[i % keys.length] ?? 'a',
        value: `order-${i}`,
      }));
      try {
        const records = await producer.send({ topic, acks: -1, messages: sent });
        expect(records.every((r) => r.errorCode === 0)).toBe(true);
      } finally {
        await producer.disconnect();
      }

      const consumer = kafka.consumer({ groupId, allowAutoTopicCreation: false });
      const received: { key: string; value: string; partition: number }[] = [];
      await consumer.connect();
      try {
        await consumer.subscribe({ topics: [topic], fromBeginning: true });
        await new Promise<void>((resolve, reject) => {
          const timer = setTimeout(
            () => reject(new Error(`received ${received.length}/20 messages`)),
            60_000,
          );
          consumer
            .run({
              eachMessage: async ({ partition, message }) => {
                received.push({ key: String(message.key), value: String(message.value), partition });
                if (received.length >= sent.length) {
                  clearTimeout(timer);
                  resolve();
                }
              },
            })
            .catch(reject);
        });
      } finally {
        await consumer.disconnect(); // commits the consumed offsets
      }

      expect(received.map((m) => m.value).sort()).toEqual(sent.map((m) => m.value).sort());
      for (const key of keys) {
        const ofKey = received.filter((m) => m.key === key);
        expect(new Set(ofKey.map((m) => m.partition)).size).toBe(1); // one key, one partition
        expect(ofKey.map((m) => m.value)).toEqual(sent.filter((m) => m.key === key).map((m) => m.value));
      }
      const [offsets] = await admin.fetchOffsets({ groupId, topics: [topic] });
      const committed = (offsets?.partitions ?? []).reduce(
        (sum, p) => sum + Math.max(0, Number(p.offset)),
        0,
      );
      expect(committed).toBe(sent.length);

      await admin.deleteTopics({ topics: [topic] });
    },
    TIMEOUT_MS,
  );
});
