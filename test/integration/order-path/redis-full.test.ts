// A Redis at its maxmemory (noeviction) with half messages in its outbox, as a Kafka outage longer
// than the memory was sized for leaves it (docs/capacity.md, "Redis memory"), and every role
// restarted meanwhile (a crash, a rescheduled pod, the api scaled out at the peak). Redis then
// refuses every command that may grow its memory, but not the relay's reads, acks and deletes:
// draining the outbox is what frees the memory. So the restarted roles must come up, the relay
// must publish and delete the held half messages (their orders reach PostgreSQL), buyers get
// 503 UNAVAILABLE (nothing written) instead of 500, and once Redis takes writes again a buyer's
// retry reserves and every invariant holds. A private Redis, the suite's Kafka and PostgreSQL.
import { Redis } from 'ioredis';
import pg from 'pg';
import type { CatalogItem } from '../../../core/model.js';
import { dependencyOutage, FlashSaleError } from '../../../core/errors.js';
import { activityKeys } from '../../../core/keys.js';
import { createStreamGroup } from '../../../core/redis.js';
import { bucketLayout, unitsLeft } from '../../../core/buckets.js';
import { reservationIdFor, reserve, soldOutCheck } from '../../../core/reservations.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import type { Violation } from '../../faults/harness/invariants.js';
import { privateRedisSale } from '../../faults/harness/private-sale.js';
import {
  ROLES,
  Sale,
  answerLog,
  answersToOrders,
  buyers,
  prepareActivity,
  recoverAndCheck,
  countOrders,
} from '../../faults/harness/sale.js';
import type { BuyerAnswer } from '../../faults/harness/sale.js';
import { request } from 'undici';
import { waitFor } from '../../../dev/roles.js';
import { sample } from '../../fixtures/metrics-text.js';
import { uniqueId } from '../../../dev/servers.js';
import { loadOpenSale } from '../../fixtures/open-sale.js';
import { redisLimiter } from '../../../runtime/api/rate-limit.js';

describe('Redis at its maxmemory with half messages held, every role restarted', () => {
  const f = privateRedisSale('redis');

  test('a stream group that exists is found on a full Redis (XGROUP CREATE answers OOM there), a missing one is not', async () => {
    const redis = new Redis(f.servers.redisUrl, { maxRetriesPerRequest: 3 });
    const stream = `${uniqueId('full-stream')}:outbox`;
    try {
      await redis.xadd(stream, '*', 'k', 'v');
      await createStreamGroup(redis, stream, 'relay', { mkstream: false });
      await redis.config('SET', 'maxmemory-policy', 'noeviction');
      await redis.config('SET', 'maxmemory', '1');
      await expect(redis.call('XGROUP', 'CREATE', stream, 'relay', '0')).rejects.toThrow(/^OOM /);
      await expect(createStreamGroup(redis, stream, 'relay', { mkstream: false })).resolves.toBeUndefined();
      await expect(createStreamGroup(redis, stream, 'other', { mkstream: false })).rejects.toThrow(/^OOM /);
    } finally {
      await redis.config('SET', 'maxmemory', '0');
      await redis.del(stream);
      redis.disconnect();
    }
  });

  test("the other limited routes' limiter falls back to its in-memory limit on a full Redis, never lets every request through", async () => {
    const redis = new Redis(f.servers.redisUrl, { maxRetriesPerRequest: 3 });
    const key = `${activityKeys(uniqueId('full-limit')).prefix}rl:address:`;
    try {
      expect(await redis.ping()).toBe('PONG');
      const limiter = redisLimiter(redis, key, { requests: 2, perSeconds: 600 })!;
      await redis.config('SET', 'maxmemory-policy', 'noeviction');
      await redis.config('SET', 'maxmemory', '1');
      await limiter.consume('flood');
      await limiter.consume('flood');
      await expect(limiter.consume('flood')).rejects.toMatchObject({ consumedPoints: 3 });
    } finally {
      await redis.config('SET', 'maxmemory', '0');
      redis.disconnect();
    }
  });

  test('with a per-buyer limit, the answers that write nothing are still given (SOLD_OUT, not 503), nothing is counted, a reservation is refused', async () => {
    const redis = new Redis(f.servers.redisUrl, { maxRetriesPerRequest: 3 });
    const window = { requests: 5, perSeconds: 60 };
    const item = (skuId: string, stock: number, buckets?: number): CatalogItem => ({
      skuId,
      name: `item ${skuId}`,
      price: '10.00',
      stock,
      limitPerUser: 1,
      ...(buckets ? { buckets } : {}),
    });
    const load = async (gate: 'open' | 'pending'): Promise<string> => {
      const id = uniqueId('full-shaped');
      await loadOpenSale(
        redis,
        id,
        [item('gone', 1), item('left', 5), item('hot', 2, 2), item('warm', 4, 2)],
        { pending: gate === 'pending' },
      );
      return id;
    };
    /** `ok:<kind>[:<points counted>]`, the error's code, or `refused` (a Redis refusal: 503). */
    const answer = async (
      call: () => Promise<{ kind: string; counted?: { consumed: number } | undefined }>,
    ) => {
      try {
        const r = await call();
        return `ok:${r.kind}${r.counted ? `:${r.counted.consumed}` : ''}`;
      } catch (err) {
        if (err instanceof FlashSaleError) return err.code;
        if (dependencyOutage(err) === 'refused') return 'refused';
        throw err;
      }
    };
    const buy = (activityId: string, userId: string, skuId: string, requestId = `r-${skuId}`) =>
      answer(() =>
        reserve(redis, { activityId, userId, skuId, quantity: 1, requestId, traceId: 't', window }),
      );
    const check = (activityId: string, userId: string, skuId: string, requestId = `r-${skuId}`) =>
      answer(() => soldOutCheck(redis, { activityId, userId, skuId, requestId, window }));
    const counter = (activityId: string, userId: string) =>
      redis.get(activityKeys(activityId).rateLimitKey('buyer', userId));
    try {
      const id = await load('open');
      const pending = await load('pending');
      expect(await buy(id, 'a', 'gone')).toBe('ok:reserved:1');
      expect(await buy(id, 'a', 'hot')).toBe('ok:reserved:2');
      expect(await buy(id, 'b', 'hot')).toBe('ok:reserved:1');

      await redis.config('SET', 'maxmemory-policy', 'noeviction');
      await redis.config('SET', 'maxmemory', '1');
      // The reserve script's answers that write nothing: sold out, a replay, the gate.
      expect(await buy(id, 'b', 'gone')).toBe('SOLD_OUT');
      expect(await buy(id, 'a', 'gone')).toBe('ok:replayed');
      expect(await buy(pending, 'b', 'gone')).toBe('NOT_STARTED');
      // The sold-out fast path (soldOutChecks-var.lua; countWindow-1.lua for a bucketed SKU).
      expect(await check(id, 'b', 'gone')).toBe('ok:sold-out');
      expect(await check(id, 'c', 'hot')).toBe('ok:sold-out');
      expect(await check(id, 'a', 'gone')).toBe('ok:replay');
      // A bucketed SKU through the script: its claim in the activity's scope (claimRequest-2.lua)
      // is refused, and the bucket gives the answers that write nothing (reserve-9.lua ARGV[11]).
      expect(await buy(id, 'c', 'hot')).toBe('SOLD_OUT');
      expect(await buy(id, 'a', 'hot')).toBe('ok:replayed');
      // A reservation must write: refused, and nothing is written or counted.
      expect(await buy(id, 'c', 'left')).toBe('refused');
      expect(await buy(id, 'c', 'warm')).toBe('refused');
      // The same submissions in one turn share one call (reserveMany-var.lua): each answered as
      // its own call is, the refused reservations refused alone.
      expect(
        await Promise.all([
          buy(id, 'd', 'left'),
          buy(id, 'a', 'gone'),
          buy(id, 'd', 'gone'),
          buy(id, 'e', 'left'),
          buy(pending, 'd', 'left'),
        ]),
      ).toEqual(['refused', 'ok:replayed', 'SOLD_OUT', 'refused', 'NOT_STARTED']);
      expect([await counter(id, 'a'), await counter(id, 'b'), await counter(id, 'c')]).toEqual([
        '2',
        '1',
        null,
      ]);
      expect(await redis.hget(activityKeys(id).sku('left'), 'stock')).toBe('5');
      const warm = (await bucketLayout(redis, id)).bucketsOf('warm');
      expect(await unitsLeft(redis, await bucketLayout(redis, id), 'warm')).toBe(4);
      expect(await Promise.all(warm.map((b) => redis.hget(b.sku('warm'), 'stock')))).toEqual(['2', '2']);
      expect(await redis.exists(activityKeys(id).reservation(reservationIdFor(id, 'c', 'r-warm')))).toBe(0);

      // Redis takes writes again: every submission counts as before.
      await redis.config('SET', 'maxmemory', '0');
      expect(await buy(id, 'c', 'left')).toBe('ok:reserved:1');
      expect(await buy(id, 'c', 'warm')).toBe('ok:reserved:2');
      expect(await check(id, 'b', 'gone', 'r2')).toBe('ok:sold-out:2');
    } finally {
      await redis.config('SET', 'maxmemory', '0');
      redis.disconnect();
    }
  });

  test('a Redis refusing writes (no replica for min-replicas-to-write): the sold-out checks of one call are answered alone, a replay still replays', async () => {
    const redis = new Redis(f.servers.redisUrl, { maxRetriesPerRequest: 3 });
    const window = { requests: 5, perSeconds: 60 };
    const id = uniqueId('norepl');
    await loadOpenSale(redis, id, [
      { skuId: 'gone', name: 'gone', price: '10.00', stock: 1, limitPerUser: 1 },
    ]);
    const answer = async (userId: string) => {
      try {
        const r = await soldOutCheck(redis, {
          activityId: id,
          userId,
          skuId: 'gone',
          requestId: 'r1',
          window,
        });
        return `ok:${r.kind}`;
      } catch (err) {
        return dependencyOutage(err) === 'refused' ? 'refused' : String(err);
      }
    };
    try {
      await reserve(redis, {
        activityId: id,
        userId: 'a',
        skuId: 'gone',
        quantity: 1,
        requestId: 'r1',
        traceId: 't',
        window,
      });
      await redis.config('SET', 'min-replicas-to-write', '1');
      // One turn, one call: the replay writes nothing and is answered; the new submission's count
      // is refused (NOREPLICAS), for it alone.
      expect(await Promise.all([answer('a'), answer('b')])).toEqual(['ok:replay', 'refused']);
    } finally {
      await redis.config('SET', 'min-replicas-to-write', '0');
      redis.disconnect();
    }
  });

  test('the restarted relay drains the outbox, buyers get 503, and a retry reserves once Redis takes writes', async () => {
    const activityId = uniqueId('redis-full');
    const servers = f.servers;
    await prepareActivity(servers, activityId, [
      { skuId: 'tea', name: '龙井 明前 250g', price: '128.00', stock: 1_000, limitPerUser: 1 },
    ]);
    const admin = new Redis(servers.redisUrl, { maxRetriesPerRequest: 3 });
    const sql = new pg.Pool({ connectionString: servers.databaseUrl, max: 2 });
    const keys = activityKeys(activityId);
    const log = answerLog();
    const v: Violation[] = [];
    const answers: BuyerAnswer[] = [];
    const ordersNow = (): Promise<number> => countOrders(sql, activityId);
    const wave = (name: string, size: number): string[] =>
      Array.from({ length: size }, (_, i) => `${activityId}-${name}${i}`);
    try {
      const s = new Sale({ servers, activityId });
      f.sale = s;
      await s.start();
      const opts = { skuId: 'tea', concurrency: 4, onAttempt: log.onAttempt };
      answers.push(...(await buyers(s, activityId, wave('a', 10), opts)));
      await waitFor('the first orders in PostgreSQL', async () => (await ordersNow()) === 10, 60_000, 100);

      // Kafka away, as far as Redis can tell: the relay stands still while buyers reserve.
      process.kill(s.current.get('relay')!.proc.pid!, 'SIGSTOP');
      const held = await buyers(s, activityId, wave('b', 20), opts);
      answers.push(...held);
      expect(held.map((a) => a.status)).toEqual(held.map(() => 202));
      expect(await admin.xlen(keys.outbox)).toBeGreaterThanOrEqual(20);

      // Redis full: nothing that may grow its memory is taken any more.
      await admin.config('SET', 'maxmemory-policy', 'noeviction');
      await admin.config('SET', 'maxmemory', '1');
      const refusedIds = wave('c', 10);
      const refused = await buyers(s, activityId, refusedIds, { ...opts, maxAttempts: 1 });
      expect(refused.map((a) => `${a.status} ${a.code ?? ''}`)).toEqual(refused.map(() => '503 UNAVAILABLE'));

      // Every role restarted while Redis is full (the supervisor starts each again at once).
      const killedAt = Date.now();
      for (const role of ROLES) await s.kill(role);
      for (const role of ROLES) expect(await s.diedTimes(role, 1, 30_000)).toBe(true);
      // The restarted relay publishes the held half messages and deletes them: their orders land.
      await waitFor(
        'the held orders in PostgreSQL with Redis still full',
        async () => (await ordersNow()) === 30,
        90_000,
        250,
      );
      const heldWrittenMs = Date.now() - killedAt;
      await waitFor(
        'the outbox empty with Redis still full',
        async () => (await admin.xlen(keys.outbox)) === 0,
        30_000,
        250,
      );
      // The gauges say so (FlashSaleRedisMemoryHigh): the restarted consumer's redis sampler reads
      // the limit and the memory above it.
      const memory = { used: NaN, max: NaN };
      await waitFor(
        'the Redis memory gauges of the full Redis',
        async () => {
          const text = await request(`${s.current.get('consumer')!.metricsUrl}/metrics`).then((r) =>
            r.body.text(),
          );
          memory.used = sample(text, 'flashsale_redis_memory_used_bytes', { activity: activityId });
          memory.max = sample(text, 'flashsale_redis_memory_max_bytes', { activity: activityId });
          return memory.max === 1 && memory.used > 1;
        },
        30_000,
        500,
      );
      // The restarted api answers, and still refuses what it cannot write.
      const again = await buyers(s, activityId, wave('d', 5), { ...opts, maxAttempts: 1 });
      expect(again.map((a) => `${a.status} ${a.code ?? ''}`)).toEqual(again.map(() => '503 UNAVAILABLE'));
      // Each is an attempt the restarted api counts (FlashSaleNoTraffic reads attempts of any result).
      const apiMetrics = await request(`${s.current.get('api')!.metricsUrl}/metrics`).then((r) =>
        r.body.text(),
      );
      expect(
        sample(apiMetrics, 'flashsale_reservations_total', { activity: activityId, result: 'unavailable' }),
      ).toBe(again.length);

      // Redis takes writes again: a refused buyer's retry (same requestId) reserves.
      await admin.config('SET', 'maxmemory', '0');
      const mendedAt = Date.now();
      answers.push(...(await buyers(s, activityId, refusedIds, opts)));
      answers.push(...(await buyers(s, activityId, wave('d', 5), opts)));
      const rec = await recoverAndCheck(servers, activityId, 120_000);
      console.log(
        `redis full: ${JSON.stringify({ 'held orders written after the restarts ms': heldWrittenMs, 'mended to every reservation confirmed ms': Date.now() - mendedAt, restarts: s.deaths.length })}`,
      );
      await s.stop();
      f.sale = undefined;
      v.push(...rec.violations, ...log.violations());
      const got = await answersToOrders(sql, activityId, answers);
      v.push(...got.violations);
      expect(got.accepted).toBe(45);
      expect(s.deaths.map((d) => d.role).sort()).toEqual([...ROLES].sort());
    } finally {
      await admin.config('SET', 'maxmemory', '0').catch(() => undefined);
      admin.disconnect();
      await sql.end();
    }
    expect(formatViolations(v)).toBe('');
  }, 600_000);
});
