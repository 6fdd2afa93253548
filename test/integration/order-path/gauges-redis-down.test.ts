// The gauge samplers are independent: with the activity's Redis stopped (a private Redis from
// test/env/start-redis.sh, never the shared one), the jobs role (a real process) keeps updating the
// PostgreSQL-based gauges, while the Redis sampler's last-success timestamp stops advancing: the
// stale-metrics alert has something to see, and the other gauges do not freeze with it.
import pg from 'pg';
import { insertOrders } from '../../../core/db/orders-store.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { setUpActivity, startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import { sample } from '../../fixtures/metrics-text.js';
import { startPrivateRedis } from '../../fixtures/private-redis.js';
import type { PrivateRedis } from '../../fixtures/private-redis.js';

const TIMEOUT_MS = 180_000;

describe('gauge samplers with Redis stopped', () => {
  const activityId = uniqueId('gauges');
  let privateRedis: PrivateRedis | undefined;
  let redisPid = 0;
  let db: FreshDatabase;
  let sql: pg.Pool;
  let jobs: RoleProcess | undefined;

  beforeAll(async () => {
    privateRedis = startPrivateRedis('gauges-redis');
    const redisUrl = privateRedis.url;
    redisPid = privateRedis.pid;

    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    await setUpActivity(
      activityId,
      [{ skuId: 'rice', name: '五常大米 5kg', price: '59.90', stock: 7, limitPerUser: 1 }],
      { partitions: 1, redisUrl },
    );
    jobs = await startRole('jobs', {
      activityId,
      databaseUrl: db.url,
      env: { REDIS_URL: redisUrl, JOBS_GAUGE_CRON: '*/1 * * * * *' },
    });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await jobs?.stop();
    await sql?.end();
    await db?.drop();
    privateRedis?.stop();
  }, TIMEOUT_MS);

  /** SIGKILLs the activity's Redis (no shutdown), once; resolves when it is gone. */
  const killRedis = async (): Promise<void> => {
    try {
      process.kill(redisPid, 'SIGKILL');
    } catch {
      // dead already
    }
    await waitFor('the private Redis to die', async () => {
      try {
        process.kill(redisPid, 0);
        return false;
      } catch {
        return true;
      }
    });
  };
  const metrics = async (): Promise<string> => (await fetch(`${jobs!.metricsUrl}/metrics`)).text();
  const lastSuccess = (text: string, sampler: string): number =>
    sample(text, 'flashsale_sampler_last_success_timestamp_seconds', { activity: activityId, sampler });

  it(
    'keeps the PostgreSQL gauges current and leaves the Redis sampler behind',
    async () => {
      // Every sampler succeeds while Redis is up.
      const before = await waitFor(
        'every sampler to succeed once',
        async () => {
          const text = await metrics();
          // Each sampler's own gauge (the timestamps exist from the process's start).
          const a = { activity: activityId };
          const all = [
            sample(text, 'flashsale_stock_remaining', { ...a, sku: 'rice' }),
            sample(text, 'flashsale_order_gap', a),
            sample(text, 'flashsale_orders_stored', { ...a, status: 'UNPAID' }),
            sample(text, 'flashsale_consumer_lag', a),
          ].every((v) => !Number.isNaN(v));
          return all ? text : undefined;
        },
        60_000,
      );
      expect(sample(before, 'flashsale_stock_remaining', { activity: activityId, sku: 'rice' })).toBe(7);
      expect(sample(before, 'flashsale_orders_stored', { activity: activityId, status: 'UNPAID' })).toBe(0);

      // The activity's Redis goes away (SIGKILL: no shutdown).
      await killRedis();

      // A tick that started after the kill has completed once the postgres sampler passes the
      // value read now; from then on the Redis sampler's timestamp is what the last good tick left.
      const p1 = lastSuccess(await metrics(), 'postgres');
      const afterKill = await waitFor(
        'a postgres sample after the kill',
        async () => {
          const text = await metrics();
          return lastSuccess(text, 'postgres') > p1 ? text : undefined;
        },
        60_000,
      );
      const frozen = lastSuccess(afterKill, 'redis');
      const frozenGap = lastSuccess(afterKill, 'order_gap');

      // An order reaches PostgreSQL while Redis is down: the PostgreSQL gauge shows it.
      await insertOrders(
        sql,
        [
          {
            reservationId: `${activityId}-r1`,
            activityId,
            userId: 'alice',
            skuId: 'rice',
            quantity: 1,
            slot: 1,
            unitPrice: '59.90',
            itemName: '五常大米 5kg',
            reservedAt: Date.now(),
            traceId: 't1',
            requestId: 'q1',
          },
        ],
        900,
      );
      const p2 = lastSuccess(afterKill, 'postgres');
      const later = await waitFor(
        'the PostgreSQL gauge to count the new order',
        async () => {
          const text = await metrics();
          const counted =
            sample(text, 'flashsale_orders_stored', { activity: activityId, status: 'UNPAID' }) === 1;
          return counted && lastSuccess(text, 'postgres') > p2 ? text : undefined;
        },
        60_000,
      );

      expect(lastSuccess(later, 'postgres')).toBeGreaterThan(p2);
      expect(lastSuccess(later, 'kafka')).toBeGreaterThan(frozen);
      // The Redis-based samplers stopped: same timestamp as right after the kill, behind the others.
      expect(lastSuccess(later, 'redis')).toBe(frozen);
      expect(lastSuccess(later, 'order_gap')).toBe(frozenGap);
      expect(frozen).toBeLessThan(lastSuccess(later, 'postgres'));
      // The Redis gauges keep their last value (the meta-alert says they are stale).
      expect(sample(later, 'flashsale_stock_remaining', { activity: activityId, sku: 'rice' })).toBe(7);
      expect(jobs!.output()).toMatch(/gauge sampler failed/);
    },
    TIMEOUT_MS,
  );

  it(
    'a jobs process started while Redis is down exports the Redis samplers at its start, ageing, for the stale alert to name',
    async () => {
      // The activity's Redis is dead (the test above killed it; when run alone, killed here): a
      // pod started now never reaches it.
      await killRedis();
      const startedAt = Date.now() / 1000;
      const late = await startRole('jobs', {
        activityId,
        databaseUrl: db.url,
        env: { REDIS_URL: privateRedis!.url, JOBS_GAUGE_CRON: '*/1 * * * * *' },
        waitReady: false,
      });
      try {
        const read = async (): Promise<string> => (await fetch(`${late.metricsUrl}/metrics`)).text();
        const first = await waitFor(
          'a postgres sample of the late process',
          async () => {
            const text = await read().catch(() => '');
            return lastSuccess(text, 'postgres') > 0 ? text : undefined;
          },
          60_000,
        );
        const p1 = lastSuccess(first, 'postgres');
        const later = await waitFor(
          'a second postgres sample',
          async () => {
            const text = await read();
            return lastSuccess(text, 'postgres') > p1 ? text : undefined;
          },
          60_000,
        );
        // Present from the start, never advancing: the rule's age grows from the process's start.
        for (const sampler of ['redis', 'order_gap']) {
          const at = lastSuccess(later, sampler);
          expect(at).toBeGreaterThanOrEqual(Math.floor(startedAt));
          expect(at).toBe(lastSuccess(first, sampler));
          expect(at).toBeLessThan(lastSuccess(later, 'postgres'));
        }
      } finally {
        await late.stop();
      }
    },
    TIMEOUT_MS,
  );
});
