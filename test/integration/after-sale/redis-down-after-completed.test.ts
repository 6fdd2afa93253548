// After `Completed` PostgreSQL holds the whole sale: the platform after-sale role (a real process)
// must keep serving it when Redis goes away, as long after the sale as that happens. It stayed in
// its Service only while Redis answered (its readiness probed Redis), and a payment it committed
// was answered 503 for the Redis copy it then confirms (frozen or cleaned up, read by nobody), so
// the provider's every redelivery got 503 too. And a pod started during the outage exited at start
// (its restock subscription awaited). A private Redis (test/env/start-redis.sh), killed.
import { cleanupActivity, outboxStreams } from '../../../core/activity-cache.js';
import { findOrderById } from '../../../core/db/orders-store.js';
import { readStockRows } from '../../../core/db/stock-store.js';
import { sweepExpiredOrders } from '../../../runtime/jobs/payment-timeout.js';
import { startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import { startPrivateRedis } from '../../fixtures/private-redis.js';
import type { PrivateRedis } from '../../fixtures/private-redis.js';
import {
  APP_ID,
  JWT_SECRET,
  MERCHANT_ID,
  PAY_SECRET,
  TIMEOUT_MS,
  buyerOrders,
  freezeAndWriteBack,
  materialize,
  notify,
  openActivity,
  reserveFor,
  setUp,
  type Fixture,
} from './fixture.js';

describe('the after-sale role with Redis gone after Completed', () => {
  let redis: PrivateRedis | undefined;
  let f: Fixture | undefined;
  let role: RoleProcess | undefined;
  let sale: { activityId: string; skuId: string; rids: string[]; orders: Map<string, string> } | undefined;
  const roleEnv = (url: string) => ({
    REDIS_URL: url,
    JWT_HS256_SECRET: JWT_SECRET,
    PAYMENT_HMAC_SECRET: PAY_SECRET,
    PAYMENT_HMAC_APP_ID: APP_ID,
    PAYMENT_HMAC_MERCHANT_ID: MERCHANT_ID,
  });

  // A sale Completed (relayed, written back, cleaned up) with three UNPAID orders; an after-sale
  // process started; then Redis SIGKILLed.
  beforeAll(async () => {
    redis = startPrivateRedis('after-completed');
    f = await setUp(4, redis.url);
    const { activityId, skuId } = await openActivity(f.redis, { stock: 5, price: '9.90' }, f.pool);
    const rids = await reserveFor(f.redis, activityId, skuId, ['payer', 'waiter', 'late-payer', 'held']);
    const orders = await materialize(f.pool, f.redis, activityId, rids);
    sale = { activityId, skuId, rids, orders };
    for (const outbox of await outboxStreams(f.redis, activityId)) await f.redis.del(outbox);
    await freezeAndWriteBack(f, activityId, 4);
    await cleanupActivity(f.redis, activityId, 3600);

    role = await startRole('after-sale', { databaseUrl: f.db.url, env: roleEnv(redis.url) });
    f.redis.disconnect();
    process.kill(redis.pid, 'SIGKILL');
    await waitFor('the private Redis to die', async () => {
      try {
        process.kill(redis!.pid, 0);
        return false;
      } catch {
        return true;
      }
    });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await role?.stop();
    await f?.close();
    redis?.stop();
  }, TIMEOUT_MS);

  it(
    'stays ready, takes a late payment (200, PAID) and answers buyers from PostgreSQL',
    async () => {
      const { activityId, skuId, rids, orders } = sale!;
      const api = { url: role!.url, close: async () => undefined };

      // Ready on PostgreSQL alone, check after check.
      for (let i = 0; i < 3; i += 1) {
        const ready = await fetch(`${role!.url}/readyz`);
        expect([ready.status, await ready.text()]).toEqual([
          200,
          expect.stringContaining('"status":"ready"'),
        ]);
        await new Promise((r) => setTimeout(r, 500));
      }
      // A payment in time for an UNPAID order: recorded and answered, and so is its redelivery.
      const orderId = orders.get(rids[0]!)!;
      const paid = { orderId, tradeNo: 'T-after-completed', amount: '9.90' };
      const first = await notify(api, paid);
      expect([first.status, first.body.outcome ?? first.body.code]).toEqual([200, 'PAID']);
      const again = await notify(api, paid);
      expect(again.status).toBe(200);
      expect((await findOrderById(f!.pool, orderId))?.status).toBe('PAID');
      // The buyers read their orders from PostgreSQL.
      const buyer = buyerOrders(api, activityId, skuId);
      const polled = await buyer.poll('payer', rids[0]!);
      expect([polled.status, polled.body.status]).toEqual([200, 'PAID']);
      const unpaid = await buyer.poll('waiter', rids[1]!);
      expect([unpaid.status, unpaid.body.status]).toEqual([200, 'UNPAID']);
      // A cancellation PostgreSQL decides alone is answered as such, not 503.
      const cancelPaid = await buyer.cancel('payer', rids[0]!);
      expect([cancelPaid.status, cancelPaid.body.code]).toEqual([409, 'ALREADY_PAID']);
      expect(role!.output()).not.toMatch(/"level":50/);
    },
    TIMEOUT_MS,
  );

  it(
    'a pod started while Redis is still down (a restart, a reschedule) becomes ready and takes payments too',
    async () => {
      const { activityId, skuId, rids, orders } = sale!;
      const reservationId = rids[2]!;
      const orderId = orders.get(reservationId)!;
      const late = await startRole('after-sale', { databaseUrl: f!.db.url, env: roleEnv(redis!.url) });
      try {
        const ready = await fetch(`${late.url}/readyz`);
        expect(ready.status).toBe(200);
        const api = { url: late.url, close: async () => undefined };
        const paid = { orderId, tradeNo: 'T-started-without-redis', amount: '9.90' };
        const first = await notify(api, paid);
        expect([first.status, first.body.outcome ?? first.body.code]).toEqual([200, 'PAID']);
        const polled = await buyerOrders(api, activityId, skuId).poll('late-payer', reservationId);
        expect([polled.status, polled.body.status]).toEqual([200, 'PAID']);
      } finally {
        await late.stop();
      }
    },
    TIMEOUT_MS,
  );

  it(
    'an order that times out while Redis is away gets its unit back in PostgreSQL: the sweep does not wait for Redis',
    async () => {
      const { activityId, rids, orders } = sale!;
      const orderId = orders.get(rids[1]!)!;
      // Another one whose unit the write-back held for a late payment (its reservation PAID in
      // Redis): only Redis can tell, so it waits.
      const held = orders.get(rids[3]!)!;
      const remaining = async () =>
        (await readStockRows(f!.pool, activityId)).reduce((n, r) => n + r.remaining, 0);
      const before = await remaining();
      await f!.pool.query(`UPDATE orders SET unit_held_for_payment = true WHERE id = $1`, [held]);
      await f!.pool.query(`UPDATE orders SET expires_at = now() - interval '10 seconds' WHERE id = ANY($1)`, [
        [orderId, held],
      ]);
      // This process's Redis client is disconnected: every command fails, as with Redis away.
      const swept = await sweepExpiredOrders({
        ...f!.deps,
        activityId,
        batchSize: 10,
        maxBatches: 1,
        settleGraceSeconds: 0,
      });
      // The held one is deferred (the sweep's settlement of its batch, and again as unsettled).
      expect([swept.closed, swept.settled.postgres]).toEqual([2, 1]);
      expect(swept.settled.deferred).toBeGreaterThan(0);
      expect(await findOrderById(f!.pool, held)).toMatchObject({ status: 'CLOSED', stockReturned: false });
      expect(await findOrderById(f!.pool, orderId)).toMatchObject({
        status: 'CLOSED',
        stockReturned: true,
        stockReturnVia: 'postgres',
      });
      expect(await remaining()).toBe(before + 1);
    },
    TIMEOUT_MS,
  );
});
