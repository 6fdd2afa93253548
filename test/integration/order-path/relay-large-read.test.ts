// A relay read larger than Kafka takes in one request for one partition. The relay reads up to
// RELAY_BATCH_SIZE (2,000) half messages at a time and puts each partition's in order batches of
// at most ORDER_BATCH_MAX_BYTES; the producer sent a partition's batches in one request, which
// Kafka writes as one record batch, refused above the topic's `max.message.bytes` (1 MB by
// default) as MESSAGE_TOO_LARGE, an error kafkajs does not retry. The relay then read the same
// entries again and sent them the same way, for ever: the outbox never drained, the drain ran to
// its timeout and cleanup stayed blocked. Met with one partition and long item names (product
// titles of 100 CJK characters: about 630 bytes per half message, 1.2 MB for a read of 2,000).
import { reserve } from '../../../core/reservations.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import { Sale, countOrders, prepareActivity, recoverAndCheck, redisOf } from '../../faults/harness/sale.js';
import type { Servers } from '../../faults/harness/sale.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import pg from 'pg';

const ORDERS = 2_400;

describe('a relay read larger than one Kafka request of one partition', () => {
  let sale: Sale | undefined;
  let db: FreshDatabase | undefined;

  afterAll(async () => {
    await sale?.stop();
    await db?.drop();
  }, 120_000);

  test('is sent in requests Kafka accepts: every half message becomes an order', async () => {
    const env = testEnv();
    db = await freshDatabase();
    const servers: Servers = { databaseUrl: db.url, redisUrl: env.redisUrl, kafkaBrokers: env.kafkaBrokers };
    const activityId = uniqueId('relay-large');
    const title = '限量款手工刺绣真丝长卷轴'.repeat(9).slice(0, 100);
    await prepareActivity(
      servers,
      activityId,
      [{ skuId: 'scroll', name: title, price: '1288.00', stock: ORDERS, limitPerUser: 1 }],
      { partitions: 1 },
    );
    // The half messages wait in the outbox before the relay starts: its first read is a full one.
    const redis = redisOf(servers);
    try {
      for (let i = 0; i < ORDERS; i += 400) {
        await Promise.all(
          Array.from({ length: Math.min(400, ORDERS - i) }, (_, j) =>
            reserve(redis, {
              activityId,
              userId: `${activityId}-buyer-${i + j}`,
              skuId: 'scroll',
              quantity: 1,
              requestId: `req-${i + j}`,
              traceId: `trace-${i + j}`,
            }),
          ),
        );
      }
    } finally {
      redis.disconnect();
    }
    sale = new Sale({ servers, activityId, env: { RELAY_BATCH_SIZE: '2000', CONSUMER_BATCH_SIZE: '500' } });
    await sale.start();
    const recovery = await recoverAndCheck(servers, activityId, 60_000);
    if (!recovery.drained) throw new Error(`the outbox did not drain\n${sale.output()}`);
    expect(formatViolations(recovery.violations)).toBe('');
    const sql = new pg.Pool({ connectionString: db.url, max: 1 });
    try {
      expect(await countOrders(sql, activityId)).toBe(ORDERS);
    } finally {
      await sql.end();
    }
  }, 180_000);
});
