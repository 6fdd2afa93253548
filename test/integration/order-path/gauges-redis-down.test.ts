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
          const all = ['redis', 'order_gap', 'postgres', 'kafka'].every((s) => lastSuccess(text, s) > 0);
          return all ? text : undefined;
        },
        60_000,
      );
      expect(sample(before, 'flashsale_stock_remaining', { activity: activityId, sku: 'rice' })).toBe(7);
      expect(sample(before, 'flashsale_orders_stored', { activity: activityId, status: 'UNPAID' })).toBe(0);

      // The activity's Redis goes away (SIGKILL: no shutdown).
      process.kill(redisPid, 'SIGKILL');
      await waitFor('the private Redis to die', async () => {
        try {
          process.kill(redisPid, 0);
          return false;
        } catch {
          return true;
        }
      });

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
});
