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
import { activityKeys } from '../../../core/keys.js';
import { createStreamGroup } from '../../../core/redis.js';
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
} from '../../faults/harness/sale.js';
import type { BuyerAnswer } from '../../faults/harness/sale.js';
import { request } from 'undici';
import { waitFor } from '../../../dev/roles.js';
import { sample } from '../../fixtures/metrics-text.js';
import { uniqueId } from '../../../dev/servers.js';

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
    const countOrders = async (): Promise<number> =>
      Number(
        (
          await sql.query<{ n: string }>('SELECT count(*)::text AS n FROM orders WHERE activity_id = $1', [
            activityId,
          ])
        ).rows[0]!.n,
      );
    const wave = (name: string, size: number): string[] =>
      Array.from({ length: size }, (_, i) => `${activityId}-${name}${i}`);
    try {
      const s = new Sale({ servers, activityId });
      f.sale = s;
      await s.start();
      const opts = { skuId: 'tea', concurrency: 4, onAttempt: log.onAttempt };
      answers.push(...(await buyers(s, activityId, wave('a', 10), opts)));
      await waitFor('the first orders in PostgreSQL', async () => (await countOrders()) === 10, 60_000, 100);

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
        async () => (await countOrders()) === 30,
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
