// kafkajs restarts its consumer only after a retriable crash. After a non-retriable one (fault
// window 11 met KafkaJSGroupCoordinatorNotFound while a restarted broker was still loading) it stays
// disconnected while the process looks healthy: window 11 stalled with every order unwritten. The
// consumer role restarts such a crash itself. Here the first kafkajs consumer fails with a
// non-retriable error, and the orders must still be written, exactly once.
import kafkajs from 'kafkajs';
import type { Admin, Consumer, ConsumerRunConfig, Kafka, Producer } from 'kafkajs';
import { createKafka, idempotentProducer } from '../../../core/kafka.js';
import type { OrderConsumer } from '../../../runtime/consumer/consumer.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import {
  countRows,
  openActivityWithTopics,
  orderConsumerFor,
  orderMessagesOf,
  reserveFor,
  setUp,
  TIMEOUT_MS,
  type Fixture,
  until,
} from './fixture.js';

describe('consumer restart after a crash kafkajs does not restart', () => {
  let f: Fixture;
  let kafka: Kafka;
  let admin: Admin;
  let producer: Producer;
  let consumer: OrderConsumer | undefined;
  const prefix = uniqueId('restart');

  beforeAll(async () => {
    f = await setUp();
    kafka = createKafka(testEnv().kafkaBrokers, uniqueId('restart-test'));
    admin = kafka.admin();
    await admin.connect();
    producer = idempotentProducer(kafka);
    await producer.connect();
  }, TIMEOUT_MS);

  afterAll(async () => {
    await consumer?.stop();
    await producer?.disconnect();
    await admin?.disconnect();
    await f?.close();
  }, TIMEOUT_MS);

  it(
    'a fresh kafkajs consumer takes over and every order is written once',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 5 });
      const rids = await reserveFor(f.redis, activityId, skuId, ['b1', 'b2', 'b3']);
      const messages = (await orderMessagesOf(f.redis, activityId, rids)).map((m) => ({
        key: m.userId,
        value: JSON.stringify(m),
      }));
      await producer.send({ topic: topics.orders, acks: -1, messages });

      const created: Consumer[] = [];
      const crashes: { restart: boolean; error: string }[] = [];
      const createConsumer = (): Consumer => {
        const c = kafka.consumer({ groupId: topics.consumerGroup, maxWaitTimeInMs: 200 });
        c.on(c.events.CRASH, (e) =>
          crashes.push({ restart: e.payload.restart, error: e.payload.error.name }),
        );
        created.push(c);
        if (created.length > 1) return c;
        // The first consumer fails in its batch handler, before touching anything.
        const run = c.run.bind(c);
        return Object.assign(Object.create(c) as Consumer, {
          run: (config?: ConsumerRunConfig) =>
            run({
              ...config,
              eachBatch: () =>
                Promise.reject(new kafkajs.KafkaJSNonRetriableError('injected: group coordinator not found')),
            }),
        });
      };
      consumer = orderConsumerFor(f, kafka, activityId, topics, createConsumer);
      await consumer.start();

      await until('three orders written', async () =>
        (await countRows(f.pool, 'SELECT count(*) AS n FROM orders WHERE activity_id = $1', [activityId])) ===
        3
          ? true
          : undefined,
      );
      // kafkajs itself gave up on the first consumer; ours replaced it.
      expect(crashes[0]).toEqual({ restart: false, error: 'KafkaJSNonRetriableError' });
      expect(created.length).toBeGreaterThanOrEqual(2);
      const restarts = (await f.metrics.consumerRetries.get()).values.find(
        (v) => v.labels.activity === activityId && v.labels.reason === 'consumer_restart',
      );
      expect(restarts?.value).toBeGreaterThanOrEqual(1);
      for (const rid of rids) {
        expect(
          await countRows(f.pool, 'SELECT count(*) AS n FROM orders WHERE reservation_id = $1', [rid]),
        ).toBe(1);
      }
    },
    TIMEOUT_MS,
  );
});
