// kafkajs sends no heartbeat in the background: while a chunk is processed only the consumer's own
// heartbeat calls keep its group membership alive. A chunk whose failing orders take longer than
// the session timeout to retry and dead-letter one by one must not get the member evicted (its
// commit would fail and the chunk come back, again and again, each round adding its failures to the
// DLQ). The failing orders are ones the database refuses (a CHECK constraint standing in for a
// defect): those are retried with pauses, where text that is not an order goes to the DLQ at once.
import pg from 'pg';
import { createKafka, idempotentProducer, topicDepth } from '../../../core/kafka.js';
import type { OrderMessage } from '../../../core/model.js';
import { orderMessage } from '../../fixtures/order-message.js';
import { ORDER_BATCH_HEADER } from '../../../core/order-message.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { setUpActivity, startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess, TestActivity } from '../../../dev/roles.js';

// The broker's group.min.session.timeout.ms is 6 s (test/env/start-kafka.sh keeps the default).
const SESSION_TIMEOUT_MS = 6_000;
const MAX_ATTEMPTS = 4;
// Each refused order is retried MAX_ATTEMPTS times with sleeps of 50 ms x attempt (300 ms in all)
// before its dead letter: 30 of them keep one chunk busy for about 9 s, well over the session.
const FAILING = 30;

describe('consumer heartbeats during a long chunk', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let consumer: RoleProcess;
  let activity: TestActivity;
  const activityId = uniqueId('beat');

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    // A defect that makes exactly these orders fail for a non-transient reason (check violation).
    await sql.query(
      `ALTER TABLE orders ADD CONSTRAINT heartbeat_test_defect CHECK (user_id NOT LIKE 'defect-%')`,
    );
    activity = await setUpActivity(
      activityId,
      [{ skuId: 'duck', name: 'duck', price: '198.00', stock: 50, limitPerUser: 1 }],
      { databaseUrl: db.url },
    );
    consumer = await startRole('consumer', {
      activityId,
      databaseUrl: db.url,
      env: {
        JOBS_IN_CONSUMER: 'false',
        CONSUMER_MAX_ATTEMPTS: String(MAX_ATTEMPTS),
        CONSUMER_SESSION_TIMEOUT_MS: String(SESSION_TIMEOUT_MS),
        CONSUMER_HEARTBEAT_INTERVAL_MS: '1000',
        CONSUMER_REBALANCE_TIMEOUT_MS: String(SESSION_TIMEOUT_MS),
        // The batch message below is a chunk of its own; the message after it is the next chunk.
        CONSUMER_BATCH_SIZE: '10',
      },
    });
  });

  afterAll(async () => {
    await consumer?.stop();
    await sql.end();
    await db.drop();
  });

  const order = (userId: string, over: Partial<OrderMessage> = {}): OrderMessage =>
    orderMessage(activityId, userId, { itemName: 'duck', ...over });

  test('a chunk of failing orders longer than the session timeout: each dead-lettered once, the partition moves on', async () => {
    const refused = [order('cheap-1', { unitPrice: '0.01' }), order('cheap-2', { unitPrice: '0.01' })];
    const lines = [
      JSON.stringify(order('before')),
      ...Array.from({ length: FAILING }, (_, i) => JSON.stringify(order(`defect-${i}`))),
      // Not an order at all: dead-lettered at once, and the chunk goes on.
      'not json {',
      ...refused.map((o) => JSON.stringify(o)),
      JSON.stringify(order('after-1')),
      JSON.stringify(order('after-2')),
    ];
    const deadLetters = FAILING + 1 + refused.length;
    const kafka = createKafka(testEnv().kafkaBrokers, uniqueId('beat-writer'));
    const producer = idempotentProducer(kafka);
    await producer.connect();
    const t0 = Date.now();
    // One partition: the later message waits for the batch's offset to be committed.
    await producer.send({
      topic: activity.topics.orders,
      acks: -1,
      messages: [
        {
          partition: 0,
          key: null,
          value: lines.join('\n'),
          headers: { [ORDER_BATCH_HEADER]: String(lines.length) },
        },
      ],
    });
    await producer.send({
      topic: activity.topics.orders,
      acks: -1,
      messages: [{ partition: 0, key: 'later', value: JSON.stringify(order('later')) }],
    });
    await producer.disconnect();

    const users = ['before', 'after-1', 'after-2', 'later'];
    await waitFor(
      'the good orders, the later message included',
      async () =>
        (await sql.query('SELECT 1 FROM orders WHERE user_id = ANY($1)', [users])).rowCount === users.length,
      45_000,
    );
    // The premise: the chunk took longer than the session timeout.
    expect(Date.now() - t0).toBeGreaterThan(SESSION_TIMEOUT_MS);

    const admin = kafka.admin();
    await admin.connect();
    try {
      // The later message's offset committed: the partition is drained.
      const end = Number(
        (await admin.fetchTopicOffsets(activity.topics.orders)).find((p) => p.partition === 0)!.high,
      );
      await waitFor('the offsets committed', async () => {
        const [t] = await admin.fetchOffsets({
          groupId: activity.topics.consumerGroup,
          topics: [activity.topics.orders],
        });
        return Number(t!.partitions.find((p) => p.partition === 0)!.offset) === end;
      });
      // Each failing, unparseable and refused order dead-lettered exactly once: the chunk was not
      // processed twice.
      expect(await topicDepth(admin, activity.topics.dlq)).toBe(deadLetters);
    } finally {
      await admin.disconnect();
    }
    expect((await sql.query('SELECT 1 FROM orders WHERE user_id LIKE $1', ['cheap-%'])).rowCount).toBe(0);
    // The member was never evicted nor made to rejoin while it worked through the chunk.
    expect(consumer.output()).not.toMatch(/not aware of this member|group is rebalancing/);
  });
});
