// Bad input gets a 4xx problem+json with a stable code, and writes nothing.
import { Redis } from 'ioredis';
import pg from 'pg';
import { readOutbox, readStock } from '../../../core/activity-cache.js';
import { activityKeys } from '../../../core/keys.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { JWT_SECRET, httpClient, setUpActivity, startRole, tokenFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

describe('bad input', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let redis: Redis;
  let api: RoleProcess;
  const activityId = uniqueId('bad');
  const http = httpClient(4);
  let token: string;

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl);
    await setUpActivity(
      activityId,
      [{ skuId: 'mooncake', name: '广式月饼 双黄白莲蓉', price: '128.00', stock: 10, limitPerUser: 1 }],
      { requireOrderCode: true },
    );
    api = await startRole('api', { activityId, databaseUrl: db.url, env: { ORDER_CODE_TTL_SECONDS: '1' } });
    token = await tokenFor('buyer-1');
  });

  afterAll(async () => {
    await api.stop();
    await http.close();
    await sql.end();
    redis.disconnect();
    await db.drop();
  });

  const snapshot = async (): Promise<string> => {
    const [stock, outbox, orders, rsvKeys] = await Promise.all([
      readStock(redis, activityId),
      readOutbox(redis, activityId),
      sql.query('SELECT count(*)::int AS n FROM orders'),
      redis.keys(`${activityKeys(activityId).prefix}rsv:*`),
    ]);
    return JSON.stringify({
      stock,
      outbox: outbox.halfMessages,
      orders: orders.rows[0].n,
      rsv: rsvKeys.length,
    });
  };

  test('every malformed or hostile request is refused with a problem and changes nothing', async () => {
    const url = `${api.url}/v1/activities/${activityId}/orders`;
    const json = { 'content-type': 'application/json', authorization: `Bearer ${token}` };
    const before = await snapshot();
    const expired = await http.post(
      `${api.url}/v1/activities/${activityId}/order-codes`,
      { skuId: 'mooncake' },
      token,
    );
    expect(expired.status).toBe(201);
    // Expire the code as its TTL would, without waiting on the clock.
    const codeKey = activityKeys(activityId).orderCode(String(expired.json.orderCode));
    expect(await redis.exists(codeKey)).toBe(1);
    await redis.del(codeKey);
    const wrongKey = await tokenFor('buyer-1', `${JWT_SECRET}-other`);

    const cases: [
      string,
      { method: string; body?: string | Buffer; headers?: Record<string, string> },
      number,
      string,
    ][] = [
      [
        'malformed JSON',
        { method: 'POST', body: '{"skuId": "mooncake",', headers: json },
        400,
        'VALIDATION_ERROR',
      ],
      [
        'wrong types',
        { method: 'POST', body: JSON.stringify({ skuId: 7, quantity: '1', requestId: true }), headers: json },
        400,
        'VALIDATION_ERROR',
      ],
      [
        '1 MB body',
        { method: 'POST', body: Buffer.alloc(1 << 20, 'a'), headers: json },
        413,
        'PAYLOAD_TOO_LARGE',
      ],
      [
        'unknown sku',
        {
          method: 'POST',
          body: JSON.stringify({ skuId: 'nope', quantity: 1, requestId: 'r1', orderCode: 'A'.repeat(22) }),
          headers: json,
        },
        404,
        'UNKNOWN_SKU',
      ],
      [
        'quantity 0',
        {
          method: 'POST',
          body: JSON.stringify({ skuId: 'mooncake', quantity: 0, requestId: 'r2' }),
          headers: json,
        },
        400,
        'VALIDATION_ERROR',
      ],
      [
        'negative quantity',
        {
          method: 'POST',
          body: JSON.stringify({ skuId: 'mooncake', quantity: -3, requestId: 'r3' }),
          headers: json,
        },
        400,
        'VALIDATION_ERROR',
      ],
      [
        'unknown field (price from the client)',
        {
          method: 'POST',
          body: JSON.stringify({ skuId: 'mooncake', quantity: 1, requestId: 'r4', price: '0.01' }),
          headers: json,
        },
        400,
        'VALIDATION_ERROR',
      ],
      [
        'missing order code',
        {
          method: 'POST',
          body: JSON.stringify({ skuId: 'mooncake', quantity: 1, requestId: 'r5' }),
          headers: json,
        },
        403,
        'INVALID_ORDER_CODE',
      ],
      [
        'expired order code',
        {
          method: 'POST',
          body: JSON.stringify({
            skuId: 'mooncake',
            quantity: 1,
            requestId: 'r6',
            orderCode: expired.json.orderCode,
          }),
          headers: json,
        },
        403,
        'INVALID_ORDER_CODE',
      ],
      [
        'missing token',
        {
          method: 'POST',
          body: JSON.stringify({ skuId: 'mooncake', quantity: 1, requestId: 'r7' }),
          headers: { 'content-type': 'application/json' },
        },
        401,
        'UNAUTHORIZED',
      ],
      [
        'token signed with another key',
        {
          method: 'POST',
          body: JSON.stringify({ skuId: 'mooncake', quantity: 1, requestId: 'r8' }),
          headers: { ...json, authorization: `Bearer ${wrongKey}` },
        },
        401,
        'UNAUTHORIZED',
      ],
      [
        'not JSON',
        {
          method: 'POST',
          body: 'skuId=mooncake',
          headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Bearer ${token}` },
        },
        415,
        'UNSUPPORTED_MEDIA_TYPE',
      ],
      [
        'another activity',
        {
          method: 'POST',
          body: JSON.stringify({ skuId: 'mooncake', quantity: 1, requestId: 'r9' }),
          headers: json,
        },
        404,
        'UNKNOWN_ACTIVITY',
      ],
      ['unsafe reservation id', { method: 'GET', headers: json }, 400, 'VALIDATION_ERROR'],
    ];
    for (const [name, init, status, code] of cases) {
      const target =
        name === 'another activity'
          ? `${api.url}/v1/activities/other-activity/orders`
          : name === 'unsafe reservation id'
            ? `${url}/${encodeURIComponent('x'.repeat(65))}`
            : url;
      const r = await http.raw(target, init);
      expect({ name, status: r.status, code: r.json.code, type: r.contentType }).toEqual({
        name,
        status,
        code,
        type: expect.stringMatching(/^application\/problem\+json/),
      });
    }
    expect(await snapshot()).toBe(before);

    // A code works once, and only for its buyer and sku.
    const code = (
      await http.post(`${api.url}/v1/activities/${activityId}/order-codes`, { skuId: 'mooncake' }, token)
    ).json.orderCode;
    const stolen = await http.post(
      url,
      { skuId: 'mooncake', quantity: 1, requestId: 's1', orderCode: code },
      await tokenFor('buyer-2'),
    );
    expect([stolen.status, stolen.json.code]).toEqual([403, 'INVALID_ORDER_CODE']);
    const used = await http.post(
      url,
      { skuId: 'mooncake', quantity: 1, requestId: 'u1', orderCode: code },
      token,
    );
    expect(used.status).toBe(202);
    const reused = await http.post(
      url,
      { skuId: 'mooncake', quantity: 1, requestId: 'u2', orderCode: code },
      await tokenFor('buyer-1'),
    );
    expect([reused.status, reused.json.code]).toEqual([403, 'INVALID_ORDER_CODE']);
  });
});
