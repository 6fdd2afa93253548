// A poison message ends in the DLQ at once (it will not parse any better on a retry), junk batch
// messages hold no order behind them, and /metrics shows the metric names of README's metrics list.
import pg from 'pg';
import { readDeadLetters, sendToTopic } from '../../fixtures/kafka-topics.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
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

  test('the counters the dashboards read with increase() and rate() are exported from 0 before their first event', async () => {
    // Prometheus takes a series' first sample as its baseline: a series born with its first event
    // (the consumer's first chunk of orders, the relay's first batch) would never be counted.
    const r = await http.raw(`${all.metricsUrl}/metrics`, { method: 'GET' });
    const text = String(r.json.raw ?? '');
    const a = `activity="${activityId}"`;
    expect({
      unpaid: metric(text, 'flashsale_orders_total', `${a},status="UNPAID"`),
      closed: metric(text, 'flashsale_orders_total', `${a},status="CLOSED"`),
      published: metric(text, 'flashsale_relay_published_total', a),
      reclaimed: metric(text, 'flashsale_relay_reclaimed_total', a),
      unresolved: metric(text, 'flashsale_stock_returns_total', `${a},via="unresolved"`),
      returned: metric(text, 'flashsale_stock_returns_total', `${a},via="redis"`),
    }).toEqual({ unpaid: 0, closed: 0, published: 0, reclaimed: 0, unresolved: 0, returned: 0 });
  });

  test('a poison message goes to the DLQ at once; good orders still flow', async () => {
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
    await sendToTopic(activity.topics.orders, [
      { key: 'eve', value: poison, headers: { 'trace-id': 'poison-trace' } },
    ]);

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

    // The DLQ holds the poison message, with the error and its one attempt in its headers.
    const seen = await readDeadLetters(activity.topics.dlq, 1);
    expect(seen).toHaveLength(1);
    expect(seen[0]!.value).toBe(poison);
    expect(seen[0]!.headers['dlq-attempts']).toBe('1');
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
    // Not retried: no attempt, no pause.
    // (no series at all: the counter has never moved for this activity)
    expect(
      metric(text, 'flashsale_consumer_retries_total', `reason="poison",activity="${activityId}"`) || 0,
    ).toBe(0);
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
  test('junk batch messages are dead-lettered at once, a malformed batch whole: orders behind them flow', async () => {
    await sendToTopic(activity.topics.orders, [
      // 2,000 lines under a header that says 5: not a batch the relay writes.
      { key: 'junk', value: '\n'.repeat(1999), headers: { orders: '5', 'trace-id': 'junk-whole' } },
      // A batch of three lines, none of them an order.
      { key: 'junk', value: 'x\n\n{"y":1}', headers: { orders: '3', 'trace-id': 'junk-lines' } },
      // 600 KiB, with 300 KiB of headers: copied whole, with the dlq-* headers, such dead letters
      // could pass the DLQ topic's message size, and a refused send is retried for ever.
      {
        key: 'junk',
        value: 'z'.repeat(600 * 1024),
        headers: { 'trace-id': 'junk-large', pad: 'p'.repeat(300 * 1024) },
      },
    ]);
    const ok = await http.post(
      `${all.url}/v1/activities/${activityId}/orders`,
      { skuId: 'duck', quantity: 1, requestId: 'h1' },
      await tokenFor('heidi'),
    );
    expect(ok.status).toBe(202);
    await waitFor(
      'the order behind the junk created',
      async () => (await sql.query('SELECT 1 FROM orders WHERE user_id = $1', ['heidi'])).rowCount === 1,
    );

    const seen = await readDeadLetters(
      activity.topics.dlq,
      5,
      ({ headers }) =>
        headers['dlq-original-index'] !== undefined ||
        headers['trace-id']?.startsWith('junk') === true ||
        headers['dlq-truncated'] !== undefined,
      1000,
    );
    // One dead letter for the malformed batch (its whole value), one per line of the other.
    const whole = seen.filter((m) => m.headers['trace-id'] === 'junk-whole');
    expect(whole).toHaveLength(1);
    expect(whole[0]!.value).toBe('\n'.repeat(1999));
    expect(whole[0]!.headers['dlq-error']).toBe('not a batch of orders: its orders header is 5');
    const lines = seen.filter((m) => m.headers['dlq-original-index'] !== undefined);
    expect(lines.map((m) => [m.headers['dlq-original-index'], m.value]).sort()).toEqual([
      ['0', 'x'],
      ['1', ''],
      ['2', '{"y":1}'],
    ]);
    // The large one keeps the first 64 KiB of its value and the dlq-* headers, and says its size.
    const large = seen.filter((m) => m.headers['dlq-truncated'] !== undefined);
    expect(large).toHaveLength(1);
    expect(large[0]!.value).toBe('z'.repeat(64 * 1024));
    expect(Number(large[0]!.headers['dlq-truncated'])).toBeGreaterThan(900 * 1024);
    expect(large[0]!.headers.pad).toBeUndefined();
    expect(seen.map((m) => m.headers['dlq-attempts'])).toEqual(['1', '1', '1', '1', '1']);
    const r = await http.raw(`${all.metricsUrl}/metrics`, { method: 'GET' });
    const text = String(r.json.raw ?? '');
    // (no series at all: the counter has never moved for this activity)
    expect(
      metric(text, 'flashsale_consumer_retries_total', `reason="poison",activity="${activityId}"`) || 0,
    ).toBe(0);
  });
});
