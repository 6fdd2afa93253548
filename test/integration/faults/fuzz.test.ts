// docs/faults.md: property-based fuzzing (fast-check) of the buyer HTTP API (the real api process) and of
// the FlashSaleActivity CRD's validation (the real API server). Hostile input gets a 4xx (or a
// validation error), never a 5xx, and changes no state. FAULT_FUZZ_RUNS scales the run counts.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import fc from 'fast-check';
import { ApiextensionsV1Api, CoreV1Api, CustomObjectsApi } from '@kubernetes/client-node';
import type { V1CustomResourceDefinition } from '@kubernetes/client-node';
import { Redis } from 'ioredis';
import pg from 'pg';
import { parse } from 'yaml';
import { registerActivity } from '../../../core/db/activity-registry-store.js';
import { activityKeys } from '../../../core/keys.js';
import { DEFAULT_TRAFFIC_POLICY, writeTrafficPolicy } from '../../../core/traffic-policy.js';
import { signNotification } from '../../../runtime/payments/hmac-provider.js';
import { prepareActivity } from '../../faults/harness/sale.js';
import { freshDatabase, isApiError, kubeConfigFor, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { ROOT, httpClient, startRole, tokenFor, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

const SCALE = Number(process.env.FAULT_FUZZ_RUNS ?? '1');

/**
 * Every key of the activity with its full content, for a before/after comparison; except the rate
 * limiters' counters, which count requests (refused ones too) and are not state of the sale.
 */
async function snapshot(redis: Redis, activityId: string): Promise<string> {
  const k = activityKeys(activityId);
  const limiters = k.rateLimitPrefix('buyer').replace(/buyer$/, '');
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', k.scanPattern, 'COUNT', 500);
    cursor = next;
    keys.push(...batch.filter((key) => !key.startsWith(limiters)));
  } while (cursor !== '0');
  const out: Record<string, unknown> = {};
  for (const key of keys.sort()) {
    const type = await redis.type(key);
    if (type === 'hash') out[key] = await redis.hgetall(key);
    else if (type === 'set') out[key] = (await redis.smembers(key)).sort();
    else if (type === 'zset') out[key] = await redis.zrange(key, 0, -1, 'WITHSCORES');
    else if (type === 'stream') out[key] = await redis.xrange(key, '-', '+');
    else if (type === 'string') out[key] = await redis.get(key);
    else out[key] = type;
  }
  return JSON.stringify(out);
}

describe('fuzzing the buyer HTTP API (real api process)', () => {
  let db: FreshDatabase;
  let api: RoleProcess;
  let redis: Redis;
  let sql: pg.Pool;
  const http = httpClient(4);
  const activityId = uniqueId('fz');
  let token = '';

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl);
    await prepareActivity(
      { databaseUrl: db.url, redisUrl: testEnv().redisUrl, kafkaBrokers: testEnv().kafkaBrokers },
      activityId,
      [{ skuId: 'rice', name: '米', price: '89.90', stock: 5, limitPerUser: 1 }],
    );
    api = await startRole('api', {
      activityId,
      databaseUrl: db.url,
      env: {
        // X-Forwarded-For is believed (one hop), so hostile values of it reach the address limiter.
        API_TRUST_PROXY: '1',
        // The traffic policy the last test writes is read again on every request (no 1 s cache).
        API_POLICY_REFRESH_MS: '0',
        PAYMENT_HMAC_SECRET: 'fuzz-payment-secret-0123456789abcdef',
        PAYMENT_HMAC_APP_ID: 'fuzz-app',
        PAYMENT_HMAC_MERCHANT_ID: 'fuzz-merchant',
      },
    });
    token = await tokenFor('fuzz-buyer');
  });

  afterAll(async () => {
    await api?.stop();
    await http.close();
    redis?.disconnect();
    await sql?.end();
    await db?.drop();
  });

  const orders = (): string => `${api.url}/v1/activities/${activityId}/orders`;

  /** A submit body that could be accepted: excluded, every generated body must be refused. */
  const acceptable = (b: unknown): boolean => {
    if (typeof b !== 'object' || b === null || Array.isArray(b)) return false;
    const o = b as Record<string, unknown>;
    return (
      o.skuId === 'rice' &&
      typeof o.quantity === 'number' &&
      Number.isInteger(o.quantity) &&
      o.quantity >= 1 &&
      typeof o.requestId === 'string' &&
      /^[A-Za-z0-9._:-]{1,64}$/.test(o.requestId)
    );
  };
  const hostileBody = fc
    .oneof(
      fc.anything(),
      fc.record(
        {
          skuId: fc.oneof(
            fc.string(),
            fc.constant('rice'),
            fc.integer(),
            fc.constant('../../etc'),
            fc.constant('*'),
          ),
          quantity: fc.oneof(
            fc.integer({ min: -1000, max: 0 }),
            fc.integer({ min: 101, max: 2 ** 31 }),
            fc.double(),
            fc.string(),
            fc.constant(null),
            fc.constant(1),
          ),
          requestId: fc.oneof(
            fc.string(),
            fc.string({ minLength: 65, maxLength: 300 }),
            fc.constant('a b'),
            fc.integer(),
          ),
          orderCode: fc.oneof(fc.string(), fc.constant(undefined)),
          unitPrice: fc.oneof(fc.constant('0.01'), fc.double()),
          amount: fc.constant('0.00'),
          userId: fc.constant('someone-else'),
        },
        { requiredKeys: [] },
      ),
    )
    .filter((b) => !acceptable(b));

  test('hostile order submissions: 4xx, never 5xx, nothing reserved', async () => {
    const before = await snapshot(redis, activityId);
    const seen = new Map<number, number>();
    // A buyer per run: one buyer's thousand submissions would mostly meet the per-buyer rate limit
    // (429, also a 4xx) instead of the validation this property is about.
    let run = 0;
    await fc.assert(
      fc.asyncProperty(hostileBody, fc.boolean(), async (body, asText) => {
        const r = await http.raw(orders(), {
          method: 'POST',
          body: asText ? String(JSON.stringify(body) ?? '') : JSON.stringify({ wrapped: body }),
          headers: {
            'content-type': 'application/json',
            authorization: `Bearer ${await tokenFor(`fuzz-buyer-${(run += 1)}`)}`,
          },
        });
        seen.set(r.status, (seen.get(r.status) ?? 0) + 1);
        return r.status >= 400 && r.status < 500;
      }),
      { numRuns: 1500 * SCALE },
    );
    expect(await snapshot(redis, activityId)).toBe(before);
    expect([...seen.keys()].every((s) => s >= 400 && s < 500)).toBe(true);
  });

  test('hostile tokens, content types, raw bodies, paths and methods: 4xx, never 5xx, no state change', async () => {
    const before = await snapshot(redis, activityId);
    const forged = await tokenFor('forged', 'another-secret-another-secret-0123456789');
    const pathPart = fc.oneof(
      fc.string(),
      fc.constant('..'),
      fc.constant('%00'),
      fc.constant('fs:{x}:*'),
      fc.constant(activityId),
      fc.stringMatching(/^[A-Za-z0-9_-]{1,80}$/),
    );
    const badToken = fc.oneof(
      fc.constant(''),
      fc.string(),
      fc.constant('Bearer '),
      fc.constant('Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.'),
      fc.constant(`Bearer ${forged}`),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom('GET', 'POST', 'PUT', 'PATCH', 'DELETE'),
        pathPart,
        pathPart,
        fc.oneof(
          badToken.map((t) => ({ bad: true, t })),
          fc.constant({ bad: false, t: `Bearer ${token}` }),
        ),
        fc.constantFrom('application/json', 'text/plain', 'application/x-www-form-urlencoded', ''),
        fc.oneof(fc.uint8Array({ maxLength: 512 }), fc.string({ maxLength: 512 }), fc.constant('{"skuId":')),
        async (method, a, b, auth, ctype, body) => {
          const headers: Record<string, string> = {};
          if (ctype) headers['content-type'] = ctype;
          if (auth.t) headers.authorization = auth.t;
          // A valid buyer's DELETE of a made-up id is refused too and writes nothing (cancel markers
          // exist only under ids derived from the buyer's own requestId).
          const m = method;
          const url = `${api.url}/v1/activities/${encodeURIComponent(a)}/orders/${encodeURIComponent(b)}`;
          const r = await http.raw(url, {
            method: m,
            ...(m === 'GET' ? {} : { body: Buffer.from(body) }),
            headers,
          });
          return r.status >= 400 && r.status < 500;
        },
      ),
      { numRuns: 1000 * SCALE },
    );
    // Oversized bodies and garbage payment notifications.
    const big = await http.raw(orders(), {
      method: 'POST',
      body: JSON.stringify({ skuId: 'rice', quantity: 1, requestId: 'x', pad: 'x'.repeat(2_000_000) }),
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    });
    expect(big.status).toBe(413);
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.uint8Array({ maxLength: 1024 }),
          fc.json().map((j) => Buffer.from(j)),
        ),
        fc.dictionary(fc.constantFrom('x-fs-signature', 'content-type', 'x-fs-timestamp'), fc.string()),
        async (body, headers) => {
          const r = await http.raw(`${api.url}/v1/payments/hmac/notifications`, {
            method: 'POST',
            body: Buffer.from(body),
            headers,
          });
          return r.status >= 400 && r.status < 500;
        },
      ),
      { numRuns: 300 * SCALE },
    );
    expect(await snapshot(redis, activityId)).toBe(before);
    const n = await sql.query<{ n: number }>('SELECT count(*)::int AS n FROM payments');
    expect(n.rows[0]!.n).toBe(0);
  });

  test('hostile refund requests and refund notifications: 4xx, never 5xx, no state change', async () => {
    // The buyer's own UNPAID order and someone else's PAID one: the only orders a request can name.
    await sql.query(
      `INSERT INTO orders (reservation_id, activity_id, user_id, sku_id, slot, quantity, unit_price, amount,
                           item_name, status, reserved_at, expires_at)
       VALUES ('fuzz-own', $1, 'fuzz-buyer', 'rice', 1, 1, 89.90, 89.90, '米', 'UNPAID', now(), now() + interval '1 hour'),
              ('fuzz-other', $1, 'someone-else', 'rice', 1, 1, 89.90, 89.90, '米', 'PAID', now(), now() + interval '1 hour')`,
      [activityId],
    );
    const state = async (): Promise<string> =>
      JSON.stringify(
        (
          await sql.query(
            `SELECT (SELECT json_agg(json_build_object('r', reservation_id, 's', status, 'e', event_seq) ORDER BY id) FROM orders) AS o,
                    (SELECT count(*) FROM refunds) AS refunds, (SELECT count(*) FROM payments) AS payments,
                    (SELECT count(*) FROM order_events) AS events, (SELECT count(*) FROM order_journal) AS journal`,
          )
        ).rows[0],
      );
    const before = await state();
    const redisBefore = await snapshot(redis, activityId);
    const forged = await tokenFor('fuzz-buyer', 'another-secret-another-secret-0123456789');
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.constantFrom('fuzz-own', 'fuzz-other', 'missing', '..', '%00'),
          fc.string({ maxLength: 80 }),
        ),
        fc.oneof(
          fc.constant(undefined),
          fc.anything(),
          fc.record(
            {
              reason: fc.oneof(fc.string({ maxLength: 300 }), fc.integer(), fc.constant(null)),
              amount: fc.constant('0.01'),
              orderId: fc.string(),
            },
            { requiredKeys: [] },
          ),
        ),
        fc.constantFrom(`Bearer ${token}`, `Bearer ${forged}`, '', 'Bearer x'),
        fc.constantFrom('application/json', 'text/plain', ''),
        async (rid, body, auth, ctype) => {
          const headers: Record<string, string> = {};
          if (auth) headers.authorization = auth;
          if (ctype) headers['content-type'] = ctype;
          const r = await http.raw(
            `${api.url}/v1/activities/${activityId}/orders/${encodeURIComponent(rid)}/refund`,
            {
              method: 'POST',
              headers,
              ...(body === undefined ? {} : { body: JSON.stringify(body) ?? 'null' }),
            },
          );
          return r.status >= 400 && r.status < 500 && r.contentType.startsWith('application/problem+json');
        },
      ),
      { numRuns: 500 * SCALE },
    );
    const wellFormed = fc.record({
      app_id: fc.constantFrom('fuzz-app', 'other'),
      merchant_id: fc.constantFrom('fuzz-merchant', 'other'),
      out_refund_no: fc.oneof(fc.stringMatching(/^rf-[0-9a-f]{32}$/), fc.string()),
      out_trade_no: fc.oneof(fc.constant('1'), fc.string()),
      trade_no: fc.string(),
      refund_amount: fc.oneof(fc.constant('89.90'), fc.double(), fc.string()),
      refund_status: fc.constantFrom('REFUND_SUCCESS', 'REFUND_FAILED', 'X'),
    });
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.uint8Array({ maxLength: 1024 }).map((b) => Buffer.from(b)),
          fc.json().map((j) => Buffer.from(j)),
          wellFormed.map((o) => Buffer.from(JSON.stringify(o))),
        ),
        fc.dictionary(
          fc.constantFrom('x-fs-signature', 'content-type'),
          fc.oneof(
            fc.string(),
            fc.constant(`t=${Math.floor(Date.now() / 1000)},v1=${'a'.repeat(64)}`),
            fc.constant('t=1,v1=00'),
          ),
        ),
        async (body, headers) => {
          const r = await http.raw(`${api.url}/v1/payments/hmac/refund-notifications`, {
            method: 'POST',
            body,
            headers,
          });
          return r.status >= 400 && r.status < 500 && r.contentType.startsWith('application/problem+json');
        },
      ),
      { numRuns: 300 * SCALE },
    );
    expect(await state()).toBe(before);
    expect(await snapshot(redis, activityId)).toBe(redisBefore);
  });

  test('hostile client addresses, registrations and order-code requests: 4xx, never 5xx, no state change', async () => {
    // The per-address limit on, so every hostile X-Forwarded-For value becomes a limiter key.
    await writeTrafficPolicy(redis, activityId, {
      ...DEFAULT_TRAFFIC_POLICY,
      shaping: { ...DEFAULT_TRAFFIC_POLICY.shaping, perAddress: { requests: 5, perSeconds: 60 } },
    });
    const before = await snapshot(redis, activityId);
    const base = `${api.url}/v1/activities/${activityId}`;
    const forwarded = fc.oneof(
      fc.string({ maxLength: 200 }),
      fc.constant(''),
      fc.constant(','),
      fc.constant('fs:{x}:*'),
      fc.constant('1.2.3.4, {other}, ::1'),
      fc.ipV4(),
      fc.ipV6(),
      fc.array(fc.oneof(fc.ipV4(), fc.string({ maxLength: 20 })), { maxLength: 20 }).map((a) => a.join(', ')),
    );
    let run = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom('orders', 'order-codes', 'registrations', 'registrations/me'),
        fc.constantFrom('POST', 'GET', 'PUT'),
        forwarded,
        fc.oneof(fc.anything(), fc.record({ skuId: fc.oneof(fc.string(), fc.constant('rice')) })),
        fc.boolean(),
        async (route, method, xff, body, withToken) => {
          // A valid order-code request of a valid buyer is a state change (it issues a code): the
          // body is wrapped so it never is one.
          const headers: Record<string, string> = { 'content-type': 'application/json' };
          // Only what an HTTP client can send in a header value.
          if (xff) headers['x-forwarded-for'] = xff.replace(/[^\x20-\x7e]/g, ' ');
          if (withToken) headers.authorization = `Bearer ${await tokenFor(`fuzz-addr-${(run += 1)}`)}`;
          const r = await http.raw(`${base}/${route}`, {
            method,
            ...(method === 'GET' ? {} : { body: JSON.stringify({ wrapped: body }) }),
            headers,
          });
          // GET registrations/me of a real buyer is the one success this can produce.
          return (r.status >= 400 && r.status < 500) || (r.status === 200 && route === 'registrations/me');
        },
      ),
      { numRuns: 600 * SCALE },
    );
    expect(await snapshot(redis, activityId)).toBe(before);
    // The address limiter was really on: a sixth submission from one address within the window is
    // refused before authentication.
    const fromOne = [];
    for (let i = 0; i < 6; i += 1) {
      fromOne.push(
        await http.raw(`${base}/orders`, {
          method: 'POST',
          body: '{}',
          headers: { 'content-type': 'application/json', 'x-forwarded-for': '198.51.100.250' },
        }),
      );
    }
    expect(fromOne.map((r) => `${r.status} ${String(r.json.code)}`)).toEqual([
      ...Array<string>(5).fill('401 UNAUTHORIZED'),
      '429 RATE_LIMITED',
    ]);
  });
});

describe('fuzzing the platform after-sale role (real after-sale process, no cache)', () => {
  let db: FreshDatabase;
  let role: RoleProcess;
  let sql: pg.Pool;
  const http = httpClient(4);
  const activityId = uniqueId('fz-after');
  const secret = 'fuzz-after-sale-secret-0123456789abcdef';
  let token = '';

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    // An activity whose sale is over and whose cache is gone: only PostgreSQL knows it.
    await registerActivity(sql, {
      activityId,
      owner: 'fuzz/after',
      ownerUid: 'fuzz-uid',
      startAt: new Date(Date.now() - 7_200_000),
      endAt: new Date(Date.now() - 3_600_000),
      requireOrderCode: false,
      reopenOnRelease: false,
    });
    role = await startRole('after-sale', {
      databaseUrl: db.url,
      env: {
        PAYMENT_HMAC_SECRET: secret,
        PAYMENT_HMAC_APP_ID: 'fuzz-app',
        PAYMENT_HMAC_MERCHANT_ID: 'fuzz-merchant',
      },
    });
    token = await tokenFor('fuzz-buyer');
  });

  afterAll(async () => {
    await role?.stop();
    await http.close();
    await sql?.end();
    await db?.drop();
  });

  const rows = async (): Promise<string> => {
    const r = await sql.query<{ o: number; p: number; j: number }>(
      `SELECT (SELECT count(*) FROM orders)::int AS o, (SELECT count(*) FROM payments)::int AS p,
              (SELECT count(*) FROM order_journal)::int AS j`,
    );
    return JSON.stringify(r.rows[0]);
  };

  test('submissions, lookups and cancellations after the sale: 4xx, never 5xx, nothing written', async () => {
    const before = await rows();
    const id = fc.oneof(fc.string(), fc.stringMatching(/^[A-Za-z0-9._:-]{1,64}$/), fc.constant('..'));
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom('GET', 'POST', 'DELETE'),
        fc.oneof(
          fc.constant(activityId),
          fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/),
          fc.string(),
        ),
        id,
        fc.oneof(
          fc.anything(),
          fc.record({
            skuId: fc.constantFrom('rice', 'x'),
            quantity: fc.integer({ min: -2, max: 102 }),
            requestId: id,
          }),
        ),
        async (method, activity, requestId, body) => {
          const base = `${role.url}/v1/activities/${encodeURIComponent(activity)}/orders`;
          const url = method === 'POST' ? base : `${base}?requestId=${encodeURIComponent(String(requestId))}`;
          const r = await http.raw(url, {
            method,
            ...(method === 'POST' ? { body: JSON.stringify(body) ?? '' } : {}),
            headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
          });
          // A cancellation by requestId before anything exists may record a tombstone in Redis
          // only while a cache exists; here there is none, so every answer is a refusal.
          return r.status >= 400 && r.status < 500;
        },
      ),
      { numRuns: 600 * SCALE },
    );
    expect(await rows()).toBe(before);
  });

  test('signed notifications with hostile payment times, amounts and order ids: 4xx, never 5xx, nothing written', async () => {
    const before = await rows();
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.string(),
          fc
            .date({ min: new Date(0), max: new Date(4_102_444_800_000), noInvalidDate: true })
            .map((d) => d.toISOString()),
          fc.constant('2026-13-45T99:99:99Z'),
          fc.integer().map(String),
          fc.constant(undefined),
        ),
        fc.oneof(fc.constant('19.90'), fc.string(), fc.double().map(String)),
        fc.oneof(fc.constant('987654321'), fc.string(), fc.constant('0'), fc.constant('9999999999999999999')),
        async (gmtPayment, amount, orderId) => {
          const body = JSON.stringify({
            app_id: 'fuzz-app',
            merchant_id: 'fuzz-merchant',
            out_trade_no: orderId,
            trade_no: 'fuzz-trade',
            total_amount: amount,
            trade_status: 'TRADE_SUCCESS',
            ...(gmtPayment === undefined ? {} : { gmt_payment: gmtPayment }),
          });
          const r = await http.raw(`${role.url}/v1/payments/hmac/notifications`, {
            method: 'POST',
            body,
            headers: {
              'content-type': 'application/json',
              'x-fs-signature': signNotification(secret, body, Math.floor(Date.now() / 1000)),
            },
          });
          return r.status >= 400 && r.status < 500 && r.contentType.startsWith('application/problem+json');
        },
      ),
      { numRuns: 300 * SCALE },
    );
    expect(await rows()).toBe(before);
  });
});

describe('fuzzing the FlashSaleActivity CRD validation (real API server)', () => {
  const kc = kubeConfigFor();
  const ext = kc.makeApiClient(ApiextensionsV1Api);
  const custom = kc.makeApiClient(CustomObjectsApi);
  const core = kc.makeApiClient(CoreV1Api);
  const namespace = uniqueId('fz-crd');
  const crd = parse(
    readFileSync(join(ROOT, 'crds', 'flashsale.io_flashsaleactivities.yaml'), 'utf8'),
  ) as V1CustomResourceDefinition;
  const group = crd.spec.group;
  const plural = crd.spec.names.plural;
  const version = crd.spec.versions[0]!.name;

  beforeAll(async () => {
    // kubectl sends the YAML as it is; the typed client's serializer would drop the
    // x-kubernetes-* extensions (list-type map, CEL rules) that the schema depends on.
    const kubectl = testEnv().kubectl ?? 'kubectl';
    execFileSync(
      kubectl,
      [
        '--kubeconfig',
        testEnv().kubeconfig,
        'apply',
        '--server-side',
        '--force-conflicts',
        '--field-manager=flashsale-tests',
        '-f',
        join(ROOT, 'crds', 'flashsale.io_flashsaleactivities.yaml'),
      ],
      {
        stdio: 'pipe',
      },
    );
    await waitFor('CRD established', async () => {
      const c = await ext.readCustomResourceDefinition({ name: crd.metadata!.name! });
      return c.status?.conditions?.some((x) => x.type === 'Established' && x.status === 'True');
    });
    await core.createNamespace({ body: { metadata: { name: namespace } } });
  });

  afterAll(async () => {
    await core.deleteNamespace({ name: namespace }).catch(() => undefined);
  });

  const valid = (): Record<string, unknown> => ({
    schedule: { startAt: '2031-01-01T10:00:00Z', endAt: '2031-01-01T11:00:00Z' },
    items: [{ skuId: 'phone', name: '手机', price: '1999.00', stock: 10, limitPerUser: 1 }],
  });
  type Spec = Record<string, unknown>;
  const withItem = (patch: Record<string, unknown>): Spec => {
    const s = valid();
    s.items = [{ ...(s.items as Spec[])[0], ...patch }];
    return s;
  };
  const badPrice = fc
    .oneof(fc.string(), fc.constant('1.999'), fc.constant('-1'), fc.constant('01.5'), fc.constant('1e3'))
    .filter((p) => !/^(0|[1-9][0-9]{0,11})(\.[0-9]{1,2})?$/.test(p));
  const badSku = fc
    .oneof(fc.string(), fc.constant('-x'), fc.constant('a b'), fc.string({ minLength: 64, maxLength: 80 }))
    .filter((s) => !/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/.test(s));
  const invalidSpec: fc.Arbitrary<Spec> = fc.oneof(
    fc.integer({ max: 0 }).map((stock) => withItem({ stock })),
    fc.integer({ max: 0 }).map((limitPerUser) => withItem({ limitPerUser })),
    badPrice.map((price) => withItem({ price })),
    badSku.map((skuId) => withItem({ skuId })),
    fc.constant({ ...valid(), items: [] }),
    fc.constant({ schedule: valid().schedule }),
    fc
      .date({
        min: new Date('2031-01-01T11:00:00Z'),
        max: new Date('2040-01-01T00:00:00Z'),
        noInvalidDate: true,
      })
      .map((d) => ({
        ...valid(),
        schedule: { startAt: d.toISOString().replace(/\.\d{3}Z$/, 'Z'), endAt: '2031-01-01T11:00:00Z' },
      })),
    fc
      .anything()
      .map((x) => ({ ...valid(), items: x }))
      .filter((s) => !Array.isArray(s.items) || s.items.length === 0),
    // Traffic shaping and eligibility (docs/operator.md "Traffic shaping and eligibility").
    fc
      .record({
        requests: fc.oneof(
          fc.integer({ max: -1 }),
          fc.integer({ min: 1_000_001 }),
          fc.string(),
          fc.double({ noNaN: true, noDefaultInfinity: true }).filter((x) => !Number.isInteger(x)),
        ),
        perSeconds: fc.integer({ min: 1, max: 86_400 }),
      })
      .map((perBuyer) => ({ ...valid(), trafficShaping: { perBuyer } })),
    fc
      .oneof(fc.integer({ max: 0 }), fc.integer({ min: 86_401 }))
      .map((perSeconds) => ({ ...valid(), trafficShaping: { perAddress: { requests: 1, perSeconds } } })),
    fc.constant({ ...valid(), trafficShaping: { perBuyer: { requests: 5 } } }),
    fc
      .oneof(fc.integer({ max: -1 }), fc.integer({ min: 1001 }))
      .map((n) => ({ ...valid(), eligibility: { orderCodesPerBuyerPerSku: n } })),
    fc.constant({ ...valid(), eligibility: { denyListRef: { key: 'denied' } } }),
    fc.constant({ ...valid(), eligibility: { denyListRef: { name: '' } } }),
    fc.oneof(fc.string(), fc.integer()).map((x) => ({ ...valid(), eligibility: { preRegistration: x } })),
  );

  test('invalid specs are refused with a validation error (422), never stored', async () => {
    let i = 0;
    await fc.assert(
      fc.asyncProperty(invalidSpec, async (spec) => {
        const name = `bad-${(i += 1)}`;
        try {
          await custom.createNamespacedCustomObject({
            group,
            version,
            namespace,
            plural,
            body: { apiVersion: `${group}/${version}`, kind: crd.spec.names.kind, metadata: { name }, spec },
          });
          return false;
        } catch (err) {
          if (isApiError(err, 422)) return true;
          throw err;
        }
      }),
      { numRuns: 150 * SCALE },
    );
    const list = (await custom.listNamespacedCustomObject({ group, version, namespace, plural })) as {
      items: unknown[];
    };
    expect(list.items).toHaveLength(0);
    // The valid base is accepted: the refusals above are about the mutations.
    await custom.createNamespacedCustomObject({
      group,
      version,
      namespace,
      plural,
      body: {
        apiVersion: `${group}/${version}`,
        kind: crd.spec.names.kind,
        metadata: { name: 'ok' },
        spec: valid(),
      },
    });
  });
});
