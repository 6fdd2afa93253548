// A poison message ends in the DLQ with its retries counted, and /metrics
// shows the metric names of README's metrics list.
import pg from 'pg';
import { createKafka, idempotentProducer } from '../../../core/kafka.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { httpClient, setUpActivity, startRole, tokenFor, waitFor } from '../../../dev/roles.js';
import type { RoleProcess, TestActivity } from '../../../dev/roles.js';

describe('poison messages and metrics', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let all: RoleProcess;
  let activity: TestActivity;
  const activityId = uniqueId('dlq');
  const http = httpClient(4);

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    activity = await setUpActivity(
      activityId,
      [{ skuId: 'duck', name: '北京烤鸭 礼盒装', price: '198.00', stock: 5, limitPerUser: 1 }],
      { databaseUrl: db.url },
    );
    all = await startRole('all', {
      activityId,
      databaseUrl: db.url,
      env: { CONSUMER_MAX_ATTEMPTS: '3', JOBS_GAUGE_CRON: '*/1 * * * * *' },
    });
  });

  afterAll(async () => {
    await all.stop();
    await http.close();
    await sql.end();
    await db.drop();
  });

  // The sum over every series of `name` carrying `labels` (a counter is exported per reason from 0).
  const metric = (text: string, name: string, labels: string): number => {
    const lines = text
      .split('\n')
      .filter((l) => l.startsWith(`${name}{`) && labels.split(',').every((p) => l.includes(p)));
    return lines.length ? lines.reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0) : NaN;
  };

  test('a poison message goes to the DLQ after its attempts; good orders still flow', async () => {
    const kafka = createKafka(testEnv().kafkaBrokers, 'poison-writer');
    const producer = idempotentProducer(kafka);
    await producer.connect();
    const poison = JSON.stringify({
      reservationId: 'poison-1',
      activityId,
      userId: 'eve',
      skuId: 'duck',
      quantity: 1,
      slot: 1,
      unitPrice: 'free',
      itemName: 'x',
      reservedAt: 1,
      traceId: 't',
      requestId: 'r',
    });
    await producer.send({
      topic: activity.topics.orders,
      acks: -1,
      messages: [{ key: 'eve', value: poison, headers: { 'trace-id': 'poison-trace' } }],
    });
    await producer.disconnect();

    const token = await tokenFor('grace');
    const ok = await http.post(
      `${all.url}/v1/activities/${activityId}/orders`,
      { skuId: 'duck', quantity: 1, requestId: 'g1' },
      token,
    );
    expect(ok.status).toBe(202);
    await waitFor(
      'good order created',
      async () => (await sql.query('SELECT 1 FROM orders WHERE user_id = $1', ['grace'])).rowCount === 1,
    );

    // The DLQ holds the poison message, with the error and attempts in its headers.
    const consumer = kafka.consumer({ groupId: uniqueId('dlq-reader') });
    await consumer.connect();
    await consumer.subscribe({ topic: activity.topics.dlq, fromBeginning: true });
    const seen: { value: string; headers: Record<string, string> }[] = [];
    await consumer.run({
      eachMessage: async ({ message }) => {
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(message.headers ?? {})) headers[k] = String(v);
        seen.push({ value: message.value?.toString('utf8') ?? '', headers });
      },
    });
    await waitFor('poison message in the DLQ', async () => seen.length > 0, 60_000);
    await consumer.disconnect();
    expect(seen).toHaveLength(1);
    expect(seen[0]!.value).toBe(poison);
    expect(seen[0]!.headers['dlq-attempts']).toBe('3');
    expect(seen[0]!.headers['dlq-error']).toMatch(/invalid order message/);
    expect(seen[0]!.headers['trace-id']).toBe('poison-trace');
    expect((await sql.query('SELECT 1 FROM orders WHERE reservation_id = $1', ['poison-1'])).rowCount).toBe(
      0,
    );

    const text = await waitFor(
      'metrics settle',
      async () => {
        const r = await http.raw(`${all.metricsUrl}/metrics`, { method: 'GET' });
        const body = String(r.json.raw ?? '');
        // Lag 0: offsets are committed after the DB commit (and after the DLQ send).
        const settled =
          metric(body, 'flashsale_dlq_depth', `topic="${activity.topics.dlq}"`) === 1 &&
          metric(body, 'flashsale_consumer_lag', `activity="${activityId}"`) === 0;
        return settled ? body : undefined;
      },
      30_000,
      500,
    );
    expect(metric(text, 'flashsale_consumer_retries_total', `reason="poison",activity="${activityId}"`)).toBe(
      3,
    );
    expect(metric(text, 'flashsale_dlq_messages_total', `activity="${activityId}"`)).toBe(1);
    expect(metric(text, 'flashsale_reservations_total', `result="ok"`)).toBe(1);
    expect(metric(text, 'flashsale_relay_published_total', `activity="${activityId}"`)).toBe(1);
    expect(metric(text, 'flashsale_outbox_half_messages', `activity="${activityId}"`)).toBe(0);
    expect(metric(text, 'flashsale_order_gap', `activity="${activityId}"`)).toBe(0);
    expect(metric(text, 'flashsale_stock_remaining', `sku="duck"`)).toBe(4);
    expect(metric(text, 'flashsale_orders_total', `status="UNPAID"`)).toBe(1);
    for (const name of [
      'flashsale_outbox_oldest_age_seconds',
      'flashsale_consumer_lag',
      'flashsale_http_request_duration_seconds_bucket',
    ]) {
      expect(text).toContain(`${name}{`);
    }
  });
});
