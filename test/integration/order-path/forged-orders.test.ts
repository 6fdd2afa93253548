// Orders put on Kafka by someone other than the relay are not trusted: the real consumer process
// checks every message against the activity's items in PostgreSQL (activity_items). A wrong
// price, a huge quantity, a slot beyond the limit, an unknown sku or a reservation id that is not
// derived from its buyer never becomes an order: each lands in the DLQ with its reason, at once.
// A message that fits becomes an order with the price and name from PostgreSQL.
import pg from 'pg';
import { readDeadLetters, sendToTopic } from '../../fixtures/kafka-topics.js';
import type { OrderMessage } from '../../../core/model.js';
import { orderMessage } from '../../fixtures/order-message.js';
import { ORDER_BATCH_HEADER } from '../../../core/order-message.js';
import { reservationIdFor } from '../../../core/reservations.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { setUpActivity, startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess, TestActivity } from '../../../dev/roles.js';

describe('forged order messages', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let consumer: RoleProcess;
  let activity: TestActivity;
  const activityId = uniqueId('forged');

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    activity = await setUpActivity(
      activityId,
      [{ skuId: 'duck', name: '北京烤鸭 礼盒装', price: '198.00', stock: 5, limitPerUser: 2 }],
      { databaseUrl: db.url },
    );
    consumer = await startRole('consumer', {
      activityId,
      databaseUrl: db.url,
      env: { JOBS_IN_CONSUMER: 'false' },
    });
  });

  afterAll(async () => {
    await consumer?.stop();
    await sql.end();
    await db.drop();
  });

  const message = (userId: string, over: Partial<OrderMessage> = {}): OrderMessage =>
    orderMessage(activityId, userId, { itemName: 'anything the sender likes', ...over });

  test('a wrong price or a huge quantity never becomes an order and lands in the DLQ with the reason', async () => {
    const forged: [OrderMessage, string][] = [
      [message('cheapskate', { unitPrice: '0.01' }), 'price'],
      [message('hoarder', { quantity: 1_000_000 }), 'quantity'],
      [message('slotter', { slot: 9 }), 'slot'],
      [message('prowler', { skuId: 'caviar' }), 'unknown_sku'],
      [
        message('impostor', { reservationId: reservationIdFor(activityId, 'someone-else', 'req-impostor') }),
        'reservation_id',
      ],
    ];
    const honest = message('honest', { quantity: 2, slot: 2 });
    await sendToTopic(
      activity.topics.orders,
      [...forged.map(([m]) => m), honest].map((m) => ({ key: m.userId, value: JSON.stringify(m) })),
    );

    await waitFor(
      'the honest order',
      async () => (await sql.query('SELECT 1 FROM orders WHERE user_id = $1', ['honest'])).rowCount === 1,
    );
    const letters = await readDeadLetters(activity.topics.dlq, forged.length, () => true, 1000);
    expect(letters).toHaveLength(forged.length);
    const seen = new Map(letters.map((d) => [(JSON.parse(d.value) as OrderMessage).userId, d.headers]));

    for (const [m, reason] of forged) {
      expect({ user: m.userId, reason: seen.get(m.userId)?.['dlq-reason'] }).toEqual({
        user: m.userId,
        reason,
      });
      // Refused at once: a contradiction with the activity's data does not get better on a retry.
      expect(seen.get(m.userId)?.['dlq-attempts']).toBe('1');
      expect(seen.get(m.userId)?.['dlq-error']).toMatch(new RegExp(`^refused: ${reason}: `));
    }
    const users = forged.map(([m]) => m.userId);
    expect((await sql.query('SELECT 1 FROM orders WHERE user_id = ANY($1)', [users])).rowCount).toBe(0);
    // The honest order carries the price and name from PostgreSQL, not from the message.
    const row = await sql.query<{ unit_price: string; amount: string; item_name: string; quantity: number }>(
      `SELECT unit_price::text, amount::text, item_name, quantity FROM orders WHERE user_id = 'honest'`,
    );
    expect(row.rows[0]).toEqual({
      unit_price: '198.00',
      amount: '396.00',
      item_name: '北京烤鸭 礼盒装',
      quantity: 2,
    });
  });

  // The relay sends a partition's orders as one batch message (one order per line). Each order of a
  // batch is judged on its own: one that is refused or does not parse goes to the DLQ as a message
  // of its own, the order alone, with its line in the batch; the rest of the batch becomes orders.
  test('a batch message: each order judged alone, a bad one dead-lettered alone', async () => {
    const first = message('batch-a');
    const cheap = message('batch-cheap', { unitPrice: '0.01' });
    const second = message('batch-b');
    const lines = [JSON.stringify(first), JSON.stringify(cheap), 'not json {', JSON.stringify(second)];
    await sendToTopic(activity.topics.orders, [
      { key: null, value: lines.join('\n'), headers: { [ORDER_BATCH_HEADER]: String(lines.length) } },
    ]);

    await waitFor(
      'the batch orders',
      async () =>
        (await sql.query('SELECT 1 FROM orders WHERE user_id = ANY($1)', [['batch-a', 'batch-b']]))
          .rowCount === 2,
    );
    const fromBatch = await readDeadLetters(
      activity.topics.dlq,
      2,
      (d) => d.headers['dlq-original-index'] !== undefined,
      1000,
    );
    expect(fromBatch).toHaveLength(2);
    fromBatch.sort(
      (x, y) => Number(x.headers['dlq-original-index']) - Number(y.headers['dlq-original-index']),
    );

    const [refused, garbage] = fromBatch;
    expect(refused).toMatchObject({
      key: 'batch-cheap',
      value: JSON.stringify(cheap),
      headers: {
        'dlq-original-index': '1',
        'dlq-reason': 'price',
        'dlq-attempts': '1',
        'trace-id': 'trace-batch-cheap',
        'reservation-id': cheap.reservationId,
      },
    });
    expect(refused!.headers[ORDER_BATCH_HEADER]).toBeUndefined();
    expect(garbage).toMatchObject({ key: null, value: 'not json {', headers: { 'dlq-original-index': '2' } });
    expect(garbage!.headers['dlq-error']).toMatch(/^unparseable message/);
    expect((await sql.query('SELECT 1 FROM orders WHERE user_id = $1', ['batch-cheap'])).rowCount).toBe(0);
  });
});
