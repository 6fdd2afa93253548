// Traffic shaping, admission control and eligibility through real api processes on real Redis
// (docs/operator.md "Traffic shaping and eligibility"): limits shared by two api processes, refusals
// that change no state, shedding that answers at once, deny list and pre-registration.
import { Redis } from 'ioredis';
import pg from 'pg';
import { request } from 'undici';
import { loadActivity, setGate } from '../../../core/activity-cache.js';
import { serverSide } from '../../../bench/lib/fairness.js';
import { activityKeys } from '../../../core/keys.js';
import { bucketLayout } from '../../../core/buckets.js';
import { syncDenyList, writeTrafficPolicy, DEFAULT_TRAFFIC_POLICY } from '../../../core/traffic-policy.js';
import type { TrafficPolicy } from '../../../core/traffic-policy.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { JWT_SECRET, pool, setUpActivity, startRole, tokenFor, waitFor } from '../../../dev/roles.js';
import { redisLimiter } from '../../../runtime/api/rate-limit.js';
import { runScript } from '../../../core/scripts.js';
import type { RoleProcess } from '../../../dev/roles.js';

/**
 * A MONITOR connection, and the errors it reports. ioredis' own `monitor()` enters its monitoring
 * state a tick after MONITOR's `OK`: a reported command read in the same chunk as that `OK` is
 * taken for the answer to a command never sent ("Command queue state error"), which rejects
 * `monitor()` and is raised again, unhandled, for the next line. The api's background commands
 * make that likely here. Those lines come before anything the test counts (its marker), so they
 * are let go; any other error is kept for the test to assert on.
 */
async function monitorOf(redis: Redis): Promise<{ monitor: Redis; errors: Error[] }> {
  const monitor = redis.duplicate({ monitor: true });
  const errors: Error[] = [];
  let monitoring = false;
  monitor.on('error', (error: Error) => {
    if (!monitoring && error.message.startsWith('Command queue state error')) return;
    errors.push(error);
  });
  await new Promise<void>((resolve, reject) => {
    monitor.once('monitoring', () => {
      monitoring = true;
      resolve();
    });
    monitor.once('end', () => reject(errors[0] ?? new Error('the MONITOR connection ended')));
  });
  return { monitor, errors };
}

interface Answer {
  status: number;
  code: string | undefined;
  retryAfter: string | undefined;
  contentType: string;
}

async function send(
  url: string,
  opts: { method?: 'GET' | 'POST'; token?: string; body?: unknown; headers?: Record<string, string> } = {},
): Promise<Answer> {
  const r = await request(url, {
    method: opts.method ?? 'POST',
    headers: {
      ...(opts.body !== undefined ? { 'content-type': 'application/json' } : {}),
      ...(opts.token ? { authorization: `Bearer ${opts.token}` } : {}),
      ...opts.headers,
    },
    ...(opts.body !== undefined ? { body: JSON.stringify(opts.body) } : {}),
  });
  const text = await r.body.text();
  let code: string | undefined;
  try {
    code = (JSON.parse(text) as { code?: string }).code;
  } catch {
    code = undefined;
  }
  const retry = r.headers['retry-after'];
  return {
    status: r.statusCode,
    code,
    retryAfter: typeof retry === 'string' ? retry : undefined,
    contentType: String(r.headers['content-type'] ?? ''),
  };
}

const policy = (p: Partial<TrafficPolicy['shaping']>, e: Partial<TrafficPolicy['eligibility']> = {}) => ({
  shaping: { ...DEFAULT_TRAFFIC_POLICY.shaping, ...p },
  eligibility: { ...DEFAULT_TRAFFIC_POLICY.eligibility, ...e },
});

const item = (stock: number) => ({
  skuId: 'tea',
  name: '西湖龙井 明前特级 250g',
  price: '398.00',
  stock,
  limitPerUser: 1,
});

describe('traffic shaping and eligibility', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let redis: Redis;
  const roles: RoleProcess[] = [];

  /**
   * Every key of the activity, byte for byte (DUMP), except the rate limiters' own counters, and
   * the orders and journal tables: what a refused request must leave unchanged.
   */
  const snapshot = async (activityId: string): Promise<string> => {
    const k = activityKeys(activityId);
    const keys: string[] = [];
    let cursor = '0';
    do {
      const [next, batch] = await redis.scan(cursor, 'MATCH', k.scanPattern, 'COUNT', 500);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
    const limiterPrefix = k.rateLimitPrefix('buyer').slice(0, -'buyer'.length);
    const state = keys.filter((key) => !key.startsWith(limiterPrefix)).sort();
    const dumps = await Promise.all(state.map(async (key) => (await redis.dumpBuffer(key))?.toString('hex')));
    const orders = await sql.query('SELECT * FROM orders ORDER BY reservation_id');
    const journal = await sql.query('SELECT count(*)::int AS n FROM order_journal');
    return JSON.stringify({ keys: state, dumps, orders: orders.rows, journal: journal.rows });
  };

  /**
   * Whether the api sheds: a request without a token is refused OVERLOADED at arrival when it does,
   * and 401 at once (before any Redis or PostgreSQL call) when it does not.
   */
  const shedding = async (apiUrl: string, path: string): Promise<boolean> =>
    (await send(`${apiUrl}${path}`, { method: 'GET' })).code === 'OVERLOADED';

  /**
   * Runs `whileHeld` while two orders take both admission slots of an api whose cap is 2: Redis
   * holds their reserve script (CLIENT PAUSE WRITE still answers reads and PING), so the slots
   * stay taken, deterministically. Both orders are accepted once the pause ends.
   */
  const holdingTwoOrders = async (apiUrl: string, path: string, whileHeld: () => Promise<void>) => {
    await redis.call('CLIENT', 'PAUSE', '60000', 'WRITE');
    let held: Promise<Answer>[] = [];
    try {
      held = [0, 1].map(async (i) =>
        send(`${apiUrl}${path}`, {
          token: await tokenFor(`held-${i}`),
          body: { skuId: 'tea', quantity: 1, requestId: `h${i}` },
        }),
      );
      await waitFor('both slots taken', () => shedding(apiUrl, path));
      await whileHeld();
    } finally {
      await redis.call('CLIENT', 'UNPAUSE');
    }
    expect((await Promise.all(held)).map((a) => a.status)).toEqual([202, 202]);
  };

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl);
  });

  afterAll(async () => {
    await Promise.all(roles.map((r) => r.stop()));
    await sql.end();
    redis.disconnect();
    await db.drop();
  });

  test('limits per buyer and per address hold across two api processes; a refusal changes nothing', async () => {
    const activityId = uniqueId('shape');
    await setUpActivity(activityId, [item(100)]);
    await writeTrafficPolicy(
      redis,
      activityId,
      policy({ perBuyer: { requests: 3, perSeconds: 600 }, perAddress: { requests: 5, perSeconds: 600 } }),
    );
    // Served by one api of all activities on one side, bound to the activity on the other; both
    // believe one proxy hop, so X-Forwarded-For names the client address.
    const env = { API_TRUST_PROXY: '1' };
    const a = await startRole('api', { databaseUrl: db.url, env });
    roles.push(a);
    const b = await startRole('api', { activityId, databaseUrl: db.url, env });
    roles.push(b);
    const path = `/v1/activities/${activityId}/orders`;
    const token = await tokenFor('bot-1');

    // Per buyer: 3 submissions in the window, whichever process takes them; each answered by the
    // reservation path (202, or 409 once the buyer's limit of one unit is held).
    const answers: Answer[] = [];
    for (let i = 0; i < 3; i += 1) {
      answers.push(
        await send(`${(i % 2 === 0 ? a : b).url}${path}`, {
          token,
          body: { skuId: 'tea', quantity: 1, requestId: `r${i}` },
          headers: { 'x-forwarded-for': `198.51.100.${i}` },
        }),
      );
    }
    expect(answers.map((x) => x.status)).toEqual([202, 409, 409]);
    const before = await snapshot(activityId);
    for (const api of [a, b, a, b]) {
      const refused = await send(`${api.url}${path}`, {
        token,
        body: { skuId: 'tea', quantity: 1, requestId: 'r9' },
        headers: { 'x-forwarded-for': '198.51.100.9' },
      });
      expect(refused).toEqual({
        status: 429,
        code: 'RATE_LIMITED',
        retryAfter: expect.stringMatching(/^[1-9]\d*$/),
        contentType: expect.stringMatching(/^application\/problem\+json/),
      });
      expect(Number(refused.retryAfter)).toBeLessThanOrEqual(600);
    }
    expect(await snapshot(activityId)).toBe(before);
    // Once refused, the buyer is refused before the token is verified: a token naming the buyer
    // with a wrong signature gets the same 429 (never a reservation), another buyer's forged token
    // a 401.
    const forged = await tokenFor('bot-1', `${JWT_SECRET}-forged`);
    const early = await send(`${b.url}${path}`, {
      token: forged,
      body: { skuId: 'tea', quantity: 1, requestId: 'r10' },
      headers: { 'x-forwarded-for': '198.51.100.10' },
    });
    expect([early.status, early.code]).toEqual([429, 'RATE_LIMITED']);
    const other = await send(`${b.url}${path}`, {
      token: await tokenFor('bot-2', `${JWT_SECRET}-forged`),
      body: { skuId: 'tea', quantity: 1, requestId: 'r10' },
      headers: { 'x-forwarded-for': '198.51.100.10' },
    });
    expect([other.status, other.code]).toEqual([401, 'UNAUTHORIZED']);
    expect(await snapshot(activityId)).toBe(before);

    // Per address: 5 submissions from one address however many buyers, on either process.
    const fromOne = await pool(
      1,
      Array.from(
        { length: 8 },
        (_, i) => async () =>
          send(`${(i % 2 === 0 ? a : b).url}${path}`, {
            token: await tokenFor(`nat-${i}`),
            body: { skuId: 'tea', quantity: 1, requestId: 'x' },
            headers: { 'x-forwarded-for': '203.0.113.7' },
          }),
      ),
    );
    expect(fromOne.map((x) => x.status)).toEqual([202, 202, 202, 202, 202, 429, 429, 429]);
    expect(new Set(fromOne.slice(5).map((x) => x.code))).toEqual(new Set(['RATE_LIMITED']));
    // Another address is not affected.
    const otherAddress = await send(`${b.url}${path}`, {
      token: await tokenFor('nat-9'),
      body: { skuId: 'tea', quantity: 1, requestId: 'x' },
      headers: { 'x-forwarded-for': '203.0.113.8' },
    });
    expect(otherAddress.status).toBe(202);

    // Polling is not limited: the limited buyer still reads their result.
    const poll = await send(`${a.url}${path}?requestId=r0`, { method: 'GET', token });
    expect(poll.status).toBe(200);

    // The counters live under the activity's hash tag (cleanup's scan removes them).
    const limiterKeys = await redis.keys(`${activityKeys(activityId).prefix}rl:*`);
    expect(limiterKeys.length).toBeGreaterThan(0);

    const metrics = await (await request(`${a.metricsUrl}/metrics`)).body.text();
    expect(metrics).toMatch(
      new RegExp(`flashsale_rate_limited_total\\{[^}]*activity="${activityId}"[^}]*reason="buyer"`),
    );
    expect(metrics).toMatch(
      new RegExp(`flashsale_rate_limited_total\\{[^}]*activity="${activityId}"[^}]*reason="address"`),
    );

    // Shaping off: the same buyer is no longer refused by the limiter (a new submission, answered
    // by the reservation path: the buyer holds their one unit).
    await writeTrafficPolicy(redis, activityId, policy({ enabled: false }));
    let n = 0;
    await waitFor(
      'the policy reaching both processes',
      async () => {
        n += 1;
        const r = await Promise.all(
          [a, b].map((api, i) =>
            send(`${api.url}${path}`, {
              token,
              body: { skuId: 'tea', quantity: 1, requestId: `off-${n}-${i}` },
              headers: { 'x-forwarded-for': `192.0.2.${i}` },
            }),
          ),
        );
        return r.every((x) => x.status === 409 && x.code === 'LIMIT_REACHED');
      },
      30_000,
      250,
    );
  }, 180_000);

  test('one Redis call per submission: the limit counted by the script, replays first and free, limit before sold-out', async () => {
    const activityId = uniqueId('onecall');
    await setUpActivity(activityId, [item(2), { ...item(100), skuId: 'pu' }]);
    await writeTrafficPolicy(redis, activityId, policy({ perBuyer: { requests: 3, perSeconds: 600 } }));
    const api = await startRole('api', { activityId, databaseUrl: db.url });
    roles.push(api);
    const base = `${api.url}/v1/activities/${activityId}`;
    const tokens = Object.fromEntries(
      await Promise.all(
        ['u1', 'u2', 'bot', 'mixed', 'warm', 'eager'].map(async (u) => [u, await tokenFor(u)] as const),
      ),
    );
    const submit = async (user: string, requestId: string, skuId = 'tea') => {
      const r = await request(`${base}/orders`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${tokens[user]}` },
        body: JSON.stringify({ skuId, quantity: 1, requestId }),
      });
      const answer = (await r.body.json()) as { code?: string; replayed?: boolean };
      const retry = r.headers['retry-after'];
      return `${r.statusCode} ${answer.code ?? (answer.replayed ? 'replayed' : 'new')}${
        typeof retry === 'string' && Number(retry) > 0 && Number(retry) <= 600 ? ' retry-after' : ''
      }`;
    };
    // Every command the api sends while answering (MONITOR; the commands scripts run inside are
    // reported with the source "lua" and left out), but the traffic policy's refresh, which runs
    // on a timer whatever the requests.
    const { monitor, errors: monitorErrors } = await monitorOf(redis);
    const sent: string[] = [];
    // MONITOR reports on its own connection, later than the answers: a command of ours after the
    // requests marks the end of theirs.
    const marker = activityKeys(activityId).none;
    let markers = 0;
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      if (source === 'lua' || !args.some((x) => x.includes(activityId))) return;
      if (args[1] === marker) {
        markers += 1;
        return;
      }
      if (args[0]?.toLowerCase() === 'get' && args[1] === activityKeys(activityId).policy) return;
      // ioredis sends a script whole (EVAL) the first time on a connection, by its sha after.
      const cmd = args[0]!.toLowerCase();
      sent.push(cmd === 'eval' || cmd === 'evalsha' ? 'script' : cmd);
    });
    // The bucket layout is read once per process: before counting.
    expect(await submit('warm', 'w1', 'other')).toBe('404 UNKNOWN_SKU');
    /** Every command sent so far has been reported. */
    const settled = async (): Promise<void> => {
      const seen = markers;
      await redis.exists(marker);
      await waitFor('the monitor reaching the marker', () => Promise.resolve(markers > seen), 10_000, 20);
    };
    await settled();
    sent.length = 0;
    const answers = [
      await submit('u1', 'r1'), // 1 call
      await submit('u2', 'r1'), // 1 call: the last unit
      await submit('bot', 'r1'), // 1 call: the script says SOLD_OUT, the process remembers it
      await submit('bot', 'r2'), // 1 call: the sold-out check counts the point
      await submit('u1', 'r1'), // 2 calls: the sold-out check finds the replay, the script replays it
      await submit('bot', 'r3'), // 1 call: the window's last point
      await submit('bot', 'r4'), // 1 call: past the limit, RATE_LIMITED (not SOLD_OUT)
      await submit('bot', 'r5'), // no call: blocked in this process until the window ends
      await submit('u1', 'r1'), // 2 calls: a replay again, still not counted
      // A SKU with stock: the reserve script itself counts and refuses.
      await submit('eager', 'e1', 'pu'), // 1 call
      await submit('eager', 'e2', 'pu'), // 1 call: the buyer's one unit is held
      await submit('eager', 'e3', 'pu'), // 1 call
      await submit('eager', 'e4', 'pu'), // 1 call: past the limit (not LIMIT_REACHED)
      await submit('eager', 'e1', 'pu'), // no call: blocked in this process, replay or not
    ];
    await settled();
    monitor.disconnect();
    expect(monitorErrors).toEqual([]);
    expect(answers).toEqual([
      '202 new',
      '202 new',
      '409 SOLD_OUT',
      '409 SOLD_OUT',
      '202 replayed',
      '409 SOLD_OUT',
      '429 RATE_LIMITED retry-after',
      '429 RATE_LIMITED retry-after',
      '202 replayed',
      '202 new',
      '409 LIMIT_REACHED',
      '409 LIMIT_REACHED',
      '429 RATE_LIMITED retry-after',
      '429 RATE_LIMITED retry-after',
    ]);
    expect(sent).toEqual(Array.from({ length: 14 }, () => 'script'));
    const counter = (u: string) => redis.get(activityKeys(activityId).rateLimitKey('buyer', u));
    expect(await counter('bot')).toBe('4');
    expect(await counter('u1')).toBe('1');
    expect(await counter('eager')).toBe('4');

    // One window across the limited routes: order codes (rate-limiter-flexible) count in it too.
    const code = await request(`${base}/order-codes`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${tokens.mixed}` },
      body: JSON.stringify({ skuId: 'tea' }),
    });
    await code.body.dump();
    expect(code.statusCode).toBe(409);
    expect(await submit('mixed', 'm1')).toBe('409 SOLD_OUT');
    expect(await submit('mixed', 'm2')).toBe('409 SOLD_OUT');
    expect(await submit('mixed', 'm3')).toBe('429 RATE_LIMITED retry-after');
    expect(await counter('mixed')).toBe('4');

    // The submit route's own series in the request histogram, as the fairness bench reads it
    // from the metrics port (bench/lib/fairness.ts serverSide).
    const inside = serverSide(await (await request(`${api.metricsUrl}/metrics`)).body.text());
    expect(Number.isFinite(inside.p50Ms) && Number.isFinite(inside.p99Ms)).toBe(true);
  }, 120_000);

  test("a 5xx of a bucketed SKU's sold-out check gives back the point counted before it", async () => {
    const activityId = uniqueId('giveback-bkt');
    await setUpActivity(activityId, [{ ...item(2), buckets: 2 }]);
    await writeTrafficPolicy(redis, activityId, policy({ perBuyer: { requests: 3, perSeconds: 600 } }));
    const api = await startRole('api', { activityId, databaseUrl: db.url });
    roles.push(api);
    const path = `/v1/activities/${activityId}/orders`;
    const buy = async (user: string) =>
      send(`${api.url}${path}`, {
        token: await tokenFor(user),
        body: { skuId: 'tea', quantity: 1, requestId: `${user}-1` },
      });
    expect((await buy('b1')).status).toBe(202);
    expect((await buy('b2')).status).toBe(202);
    // Sold out: the api flags the SKU and answers the next ones on the fast path.
    expect((await buy('b3')).code).toBe('SOLD_OUT');
    // The check in the buyer's home bucket fails (its node answers an error): a 500, after the
    // point was counted in the activity's scope.
    const layout = await bucketLayout(redis, activityId, { refresh: true });
    const home = layout.scopeFor('tea', 'unlucky');
    await redis.del(home.meta);
    await redis.set(home.meta, 'not a hash');
    const r = await buy('unlucky');
    expect(r.status).toBeGreaterThanOrEqual(500);
    const counter = activityKeys(activityId).rateLimitKey('buyer', 'unlucky');
    await waitFor('the point given back', async () => (await redis.get(counter)) === '0', 10_000, 50);
  }, 120_000);

  test('a 5xx after the script counted the submission gives its point back; its retry is a replay and counts nothing', async () => {
    const activityId = uniqueId('giveback');
    await setUpActivity(activityId, [item(10)]);
    await writeTrafficPolicy(redis, activityId, policy({ perBuyer: { requests: 3, perSeconds: 600 } }));
    // No replica behind this Redis: every reservation is refused 503 NOT_REPLICATED after the
    // script made it (core/durable-ack.ts).
    const api = await startRole('api', {
      activityId,
      databaseUrl: db.url,
      env: { RESERVE_ACK: 'replica', RESERVE_ACK_REPLICAS: '1', RESERVE_ACK_TIMEOUT_MS: '20' },
    });
    roles.push(api);
    const token = await tokenFor('unlucky');
    const counter = activityKeys(activityId).rateLimitKey('buyer', 'unlucky');
    for (let i = 0; i < 5; i += 1) {
      const r = await send(`${api.url}/v1/activities/${activityId}/orders`, {
        token,
        body: { skuId: 'tea', quantity: 1, requestId: 'r1' },
      });
      expect([r.status, r.code]).toEqual([503, 'NOT_REPLICATED']);
    }
    // The first call counted and gave back; the retries were replays: the window is untouched.
    await waitFor('the point given back', async () => (await redis.get(counter)) === '0', 10_000, 50);
    expect(await redis.hget(activityKeys(activityId).sku('tea'), 'stock')).toBe('9');
  }, 120_000);

  test('a point given back after a failure lifts the limit at once: the last point sets no block in memory', async () => {
    // The limiter of the other limited routes (registrations, order codes) and of addresses.
    const limiter = redisLimiter(redis, `${activityKeys(uniqueId('rl')).prefix}rl:buyer:`, {
      requests: 2,
      perSeconds: 600,
    })!;
    // Connected, as a role's client is before it serves (the limiter falls back to its in-memory
    // insurance while the client is not ready).
    expect(await redis.ping()).toBe('PONG');
    await limiter.consume('b');
    // The window's last point; this request then fails (5xx) and gives its point back.
    await limiter.consume('b');
    await limiter.reward('b', 1);
    await expect(limiter.consume('b')).resolves.toMatchObject({ consumedPoints: 2 });
    // Refused by Redis: from then on refused in this process without asking Redis.
    await expect(limiter.consume('b')).rejects.toMatchObject({ consumedPoints: 3 });
    await expect(limiter.consume('b')).rejects.toMatchObject({ consumedPoints: 0 });
  });

  test('a window shortened mid-sale applies at once to a buyer counting in the longer one', async () => {
    const key = `${activityKeys(uniqueId('rl-short')).prefix}rl:buyer:`;
    // The limiter of the other limited routes: refused under {2 per hour}, then eased to {2 per 2 s}.
    const hourly = redisLimiter(redis, key, { requests: 2, perSeconds: 3600 })!;
    await hourly.consume('b');
    await hourly.consume('b');
    const refused = await hourly.consume('b').catch((r: { msBeforeNext: number }) => r);
    expect(refused.msBeforeNext).toBeGreaterThan(3_000_000);
    const eased = redisLimiter(redis, key, { requests: 2, perSeconds: 2 })!;
    const still = await eased.consume('b').catch((r: { msBeforeNext: number }) => r);
    expect(still.msBeforeNext).toBeLessThanOrEqual(2_000);
    // The reserve path's counter (lua/includes/buyerWindow.lua, here through countWindow-1.lua).
    const counter = activityKeys(uniqueId('rl-short')).rateLimitKey('buyer', 'b');
    await runScript(redis, 'countWindow', [counter], [2, 3600]);
    const [, , ttl] = await runScript(redis, 'countWindow', [counter], [2, 2]);
    expect(Number(ttl)).toBeLessThanOrEqual(2_000);
    expect(await redis.pttl(counter)).toBeLessThanOrEqual(2_000);
  });

  test("a stock bucket's failed call gives back the point its claim counted: a buyer retrying through it is not rate-limited", async () => {
    const activityId = uniqueId('bucket-giveback');
    await setUpActivity(activityId, [{ ...item(10), buckets: 2 }]);
    await writeTrafficPolicy(redis, activityId, policy({ perBuyer: { requests: 3, perSeconds: 600 } }));
    const api = await startRole('api', { activityId, databaseUrl: db.url });
    roles.push(api);
    // Every bucket's node fails the reservation's call (here: its meta hash is not a hash), after
    // the claim in the activity's slot counted the submission.
    const layout = await bucketLayout(redis, activityId);
    const metas = layout.allBuckets().map((b) => b.meta);
    const saved = await Promise.all(metas.map((m) => redis.hgetall(m)));
    for (const m of metas) await redis.del(m).then(() => redis.set(m, 'broken'));
    const token = await tokenFor('bucket-retrier');
    const counter = activityKeys(activityId).rateLimitKey('buyer', 'bucket-retrier');
    for (let i = 0; i < 4; i += 1) {
      const r = await send(`${api.url}/v1/activities/${activityId}/orders`, {
        token,
        body: { skuId: 'tea', quantity: 1, requestId: 'r1' },
      });
      expect(r.status).toBeGreaterThanOrEqual(500);
    }
    await waitFor('every point given back', async () => (await redis.get(counter)) === '0', 10_000, 50);
    // The bucket's node is back: the same submission reserves, nothing limited.
    for (const [i, m] of metas.entries()) await redis.del(m).then(() => redis.hset(m, saved[i]!));
    const r = await send(`${api.url}/v1/activities/${activityId}/orders`, {
      token,
      body: { skuId: 'tea', quantity: 1, requestId: 'r1' },
    });
    expect(r.status).toBe(202);
  }, 120_000);

  test("a stock bucket whose keys are gone answers from the sale's window; a 5xx of that answer gives back the claim's one point, not two", async () => {
    const activityId = uniqueId('bucket-unloaded');
    await setUpActivity(activityId, [{ ...item(10), buckets: 2 }]);
    await writeTrafficPolicy(redis, activityId, policy({ perBuyer: { requests: 3, perSeconds: 600 } }));
    const api = await startRole('api', { activityId, databaseUrl: db.url });
    roles.push(api);
    // The buckets' node came back empty (NOT_LOADED after the claim counted), and the answer for
    // an unloaded sale fails (here: the results hash is not a hash).
    const layout = await bucketLayout(redis, activityId);
    for (const b of layout.allBuckets()) await redis.del(b.meta);
    const results = activityKeys(activityId).results;
    await redis.del(results).then(() => redis.set(results, 'broken'));
    const token = await tokenFor('unloaded-retrier');
    const counter = activityKeys(activityId).rateLimitKey('buyer', 'unloaded-retrier');
    const r = await send(`${api.url}/v1/activities/${activityId}/orders`, {
      token,
      body: { skuId: 'tea', quantity: 1, requestId: 'r1' },
    });
    expect(r.status).toBeGreaterThanOrEqual(500);
    await waitFor('the point given back', async () => (await redis.get(counter)) !== '1', 10_000, 50);
    // Given back once: the buyer's window holds what it held before, no point beyond the limit.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await redis.get(counter)).toBe('0');
  }, 120_000);

  test('a per-buyer limit relaxed during the sale frees the buyers it refused at once, not at the end of the old window', async () => {
    const activityId = uniqueId('relaxed');
    await setUpActivity(activityId, [item(10)]);
    await writeTrafficPolicy(redis, activityId, policy({ perBuyer: { requests: 2, perSeconds: 600 } }));
    const api = await startRole('api', { activityId, databaseUrl: db.url });
    roles.push(api);
    const token = await tokenFor('eager-buyer');
    const submit = (requestId: string) =>
      send(`${api.url}/v1/activities/${activityId}/orders`, {
        token,
        body: { skuId: 'tea', quantity: 1, requestId },
      });
    expect((await submit('first')).status).toBe(202);
    expect([(await submit('second')).code]).toEqual(['LIMIT_REACHED']);
    const refused = await submit('third');
    expect([refused.status, refused.code]).toEqual([429, 'RATE_LIMITED']);

    // The operator writes the edited policy (the per-buyer limit switched off): within
    // API_POLICY_REFRESH_MS the buyer is answered by the reservation path again.
    await writeTrafficPolicy(redis, activityId, policy({ perBuyer: { requests: 0, perSeconds: 10 } }));
    let n = 0;
    await waitFor(
      'the relaxed limit lets the buyer through',
      async () => {
        n += 1;
        const r = await submit(`after-${n}`);
        return r.status === 409 && r.code === 'LIMIT_REACHED';
      },
      15_000,
      250,
    );
  }, 120_000);

  test('deny list and pre-registration refuse with stable codes and change nothing', async () => {
    const activityId = uniqueId('elig');
    const activity = await setUpActivity(activityId, [item(10)], { open: false, startInMs: 3_600_000 });
    await writeTrafficPolicy(redis, activityId, policy({}, { preRegistration: true }));
    const api = await startRole('api', { activityId, databaseUrl: db.url });
    roles.push(api);
    const base = `${api.url}/v1/activities/${activityId}`;
    const tokens = Object.fromEntries(
      await Promise.all(['reg', 'late', 'denied'].map(async (u) => [u, await tokenFor(u)] as const)),
    );

    // Registration is open during warm-up (gate pending, before startAt).
    expect((await send(`${base}/registrations`, { token: tokens.reg })).status).toBe(201);
    expect((await send(`${base}/registrations`, { token: tokens.reg })).status).toBe(200);
    expect((await send(`${base}/registrations`, { token: tokens.denied })).status).toBe(201);
    const me = await request(`${base}/registrations/me`, {
      headers: { authorization: `Bearer ${tokens.reg}` },
    });
    expect(await me.body.json()).toEqual({ registered: true });

    // The sale opens: a later generation moves startAt into the past, then the gate opens.
    await loadActivity(redis, {
      ...activity.definition,
      generation: 2,
      startAt: new Date(Date.now() - 1000),
    });
    await setGate(redis, activityId, 'open');
    await syncDenyList(redis, activityId, ['denied']);

    const order = (requestId: string) => ({ skuId: 'tea', quantity: 1, requestId });
    const before = await snapshot(activityId);
    const late = await send(`${base}/orders`, { token: tokens.late, body: order('l1') });
    expect([late.status, late.code]).toEqual([403, 'NOT_REGISTERED']);
    const denied = await send(`${base}/orders`, { token: tokens.denied, body: order('d1') });
    expect([denied.status, denied.code]).toEqual([403, 'BUYER_DENIED']);
    const closed = await send(`${base}/registrations`, { token: tokens.late });
    expect([closed.status, closed.code]).toEqual([409, 'REGISTRATION_CLOSED']);
    expect(await snapshot(activityId)).toBe(before);

    expect((await send(`${base}/orders`, { token: tokens.reg, body: order('r1') })).status).toBe(202);
    // Lifting the deny list readmits the buyer (they registered in time).
    await syncDenyList(redis, activityId, []);
    expect((await send(`${base}/orders`, { token: tokens.denied, body: order('d2') })).status).toBe(202);
  }, 120_000);

  test('order codes only inside the sale window and at most N per buyer and sku', async () => {
    const activityId = uniqueId('codes');
    const activity = await setUpActivity(activityId, [item(10)], {
      open: false,
      startInMs: 3_600_000,
      requireOrderCode: true,
    });
    await writeTrafficPolicy(redis, activityId, policy({}, { orderCodesPerBuyerPerSku: 2 }));
    const api = await startRole('api', {
      activityId,
      databaseUrl: db.url,
      env: { API_POLICY_REFRESH_MS: '0' },
    });
    roles.push(api);
    const url = `${api.url}/v1/activities/${activityId}/order-codes`;
    const token = await tokenFor('coder');
    const early = await send(url, { token, body: { skuId: 'tea' } });
    expect([early.status, early.code]).toEqual([409, 'NOT_STARTED']);
    await loadActivity(redis, {
      ...activity.definition,
      generation: 2,
      startAt: new Date(Date.now() - 1000),
    });
    await setGate(redis, activityId, 'open');
    expect((await send(url, { token, body: { skuId: 'tea' } })).status).toBe(201);
    expect((await send(url, { token, body: { skuId: 'tea' } })).status).toBe(201);
    const third = await send(url, { token, body: { skuId: 'tea' } });
    expect([third.status, third.code]).toEqual([409, 'ORDER_CODE_LIMIT']);
    await setGate(redis, activityId, 'closed');
    const after = await send(url, { token: await tokenFor('coder-2'), body: { skuId: 'tea' } });
    expect([after.status, after.code]).toEqual([409, 'ENDED']);
  }, 120_000);

  test('shedding answers at once with 503 OVERLOADED; health stays answerable; no other 5xx', async () => {
    const activityId = uniqueId('shed');
    await setUpActivity(activityId, [item(50)]);
    await writeTrafficPolicy(redis, activityId, policy({ enabled: false }));
    // Redis' command timeout well above the pause below: the held orders wait, they do not fail.
    const api = await startRole('api', {
      activityId,
      databaseUrl: db.url,
      env: { API_MAX_IN_FLIGHT: '2', REDIS_COMMAND_TIMEOUT_MS: '60000' },
    });
    roles.push(api);
    const path = `/v1/activities/${activityId}/orders`;

    // Still ready while shedding: at a sale's opening every replica sheds at once, and a readiness
    // that failed with the load would empty the Service (connections refused instead of a fast
    // 503). The slots are held by two polls waiting on PostgreSQL, so Redis answers the probe.
    const locker = await sql.connect();
    try {
      await locker.query('BEGIN');
      await locker.query('LOCK TABLE orders IN ACCESS EXCLUSIVE MODE');
      const token = await tokenFor('poller');
      const polls = [0, 1].map((i) => send(`${api.url}${path}?requestId=p${i}`, { method: 'GET', token }));
      await waitFor('both slots taken by polls', () => shedding(api.url, path));
      const ready = await request(`${api.url}/readyz`);
      expect([ready.statusCode, await ready.body.json()]).toEqual([
        200,
        expect.objectContaining({ status: 'ready', shedding: 'in_flight' }),
      ]);
      await locker.query('COMMIT');
      expect((await Promise.all(polls)).map((p) => p.status)).toEqual([404, 404]);
    } finally {
      await locker.query('ROLLBACK').catch(() => undefined);
      locker.release();
    }

    await holdingTwoOrders(api.url, path, async () => {
      expect((await send(`${api.url}/healthz`, { method: 'GET' })).status).toBe(200);
      const shed = await send(`${api.url}${path}`, {
        token: await tokenFor('b0'),
        body: { skuId: 'tea', quantity: 1, requestId: 'x' },
      });
      expect(shed).toEqual({
        status: 503,
        code: 'OVERLOADED',
        retryAfter: '1',
        contentType: expect.stringMatching(/^application\/problem\+json/),
      });
    });
    await waitFor('slots released', async () => !(await shedding(api.url, path)));

    // A flood far above the cap: every answer is a reservation outcome or a fast OVERLOADED.
    const tokens = await Promise.all(Array.from({ length: 300 }, (_, i) => tokenFor(`flood-${i}`)));
    const flood = await pool(
      100,
      tokens.map(
        (token, i) => () =>
          send(`${api.url}${path}`, { token, body: { skuId: 'tea', quantity: 1, requestId: `f${i}` } }),
      ),
    );
    const kinds = new Set(flood.map((x) => `${x.status} ${x.code ?? ''}`.trim()));
    for (const k of kinds) expect(['202', '409 SOLD_OUT', '503 OVERLOADED']).toContain(k);
    expect(flood.filter((x) => x.status === 503).every((x) => x.retryAfter === '1')).toBe(true);
    const metrics = await (await request(`${api.metricsUrl}/metrics`)).body.text();
    expect(metrics).toMatch(/flashsale_shed_total\{[^}]*reason="in_flight"[^}]*\} [1-9]/);
    expect(metrics).toMatch(/flashsale_event_loop_delay_seconds_count/);
  }, 120_000);
  test('a body still on the wire holds no admission slot: slow clients do not get buyers refused', async () => {
    const activityId = uniqueId('slowbody');
    await setUpActivity(activityId, [item(50)]);
    await writeTrafficPolicy(redis, activityId, policy({ enabled: false }));
    const api = await startRole('api', {
      activityId,
      databaseUrl: db.url,
      env: { API_MAX_IN_FLIGHT: '2', REDIS_COMMAND_TIMEOUT_MS: '60000' },
    });
    roles.push(api);
    const path = `/v1/activities/${activityId}/orders`;

    // Five clients (more than the cap) send their headers and part of a body, then nothing.
    const { connect } = await import('node:net');
    const slow = await Promise.all(
      [0, 1, 2, 3, 4].map(async (i) => {
        const token = await tokenFor(`slow-${i}`);
        const s = connect(api.port, '127.0.0.1');
        await new Promise((r) => s.once('connect', r));
        s.write(
          `POST ${path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
            `authorization: Bearer ${token}\r\ncontent-length: 100\r\n\r\n{"skuId":`,
        );
        return s;
      }),
    );
    try {
      // Each reached the api (its request is being read) before the buyers come.
      await new Promise((r) => setTimeout(r, 500));
      const ready = await request(`${api.url}/readyz`);
      expect(ready.statusCode).toBe(200);
      await ready.body.text();
      // One after another: never more than one buyer of ours in flight, so the cap is the slow
      // clients' only.
      const buyers: Answer[] = [];
      for (const i of [0, 1, 2]) {
        buyers.push(
          await send(`${api.url}${path}`, {
            token: await tokenFor(`buyer-${i}`),
            body: { skuId: 'tea', quantity: 1, requestId: `b${i}` },
          }),
        );
      }
      expect(buyers.map((b) => `${b.status} ${b.code ?? ''}`.trim())).toEqual(['202', '202', '202']);
      const metrics = await (await request(`${api.metricsUrl}/metrics`)).body.text();
      expect(metrics).not.toMatch(/flashsale_shed_total\{[^}]*reason="in_flight"[^}]*\} [1-9]/);

      // A slow body that arrives is counted then: refused if the cap filled meanwhile (two orders
      // held in Redis by CLIENT PAUSE WRITE), and otherwise taken like any other order.
      const finish = async (i: number): Promise<string> => {
        const answer = new Promise<string>((resolve) => {
          let text = '';
          slow[i]!.on('data', (chunk: Buffer) => {
            text += chunk.toString('utf8');
            if (text.includes('\r\n\r\n')) resolve(text.split('\r\n')[0]!);
          });
        });
        const whole = JSON.stringify({ skuId: 'tea', quantity: 1, requestId: `slow-${i}` });
        slow[i]!.write(whole.slice('{"skuId":'.length).padEnd(100 - '{"skuId":'.length, ' '));
        return answer;
      };
      await holdingTwoOrders(api.url, path, async () => {
        expect(await finish(1)).toBe('HTTP/1.1 503 Service Unavailable');
      });
      expect(await finish(0)).toBe('HTTP/1.1 202 Accepted');
    } finally {
      for (const s of slow) s.destroy();
    }
  }, 120_000);
});
