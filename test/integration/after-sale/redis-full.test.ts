// The after-sale paths on a Redis at its maxmemory (noeviction), as a Kafka outage longer than the
// memory was sized for leaves it (docs/capacity.md "Redis memory"). Redis then refuses every
// script that writes, so what PostgreSQL decides must stay decided and what Redis must still learn
// must be retried, never lost or doubled:
//   - a payment: committed PAID in PostgreSQL, answered 503 so the provider re-sends; the
//     redelivery (ALREADY_PAID) marks the reservation PAID once Redis takes writes
//   - a buyer's cancellation and a payment timeout: the order CLOSED (answered 200), its unit's
//     return deferred; the sweeper's next pass returns it, exactly once
//   - a cancellation before the reservation and a new submission: 503, nothing written
// A private Redis (the limit would stop every other test file), the suite's PostgreSQL.
import { journalFor } from '../../../core/db/journal-store.js';
import { findLifecycleByReservationId } from '../../../core/db/orders-store.js';
import { paymentsForOrder } from '../../../core/db/payments-store.js';
import { readReservation } from '../../../core/reservations.js';
import { sweepExpiredOrders } from '../../../runtime/jobs/payment-timeout.js';
import { startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';
import {
  TIMEOUT_MS,
  buyerOrders,
  counters,
  materialize,
  notify,
  openActivity,
  reserveFor,
  setUp,
  skuStock,
  startApi,
  type Api,
  type Fixture,
} from './fixture.js';

describe('after-sale on a full Redis', () => {
  let priv: PrivateServers | undefined;
  let f: Fixture;
  let api: Api;

  beforeAll(async () => {
    priv = await startPrivateServers(['redis']);
    f = await setUp(10, priv.env.REDIS_URL!);
    api = await startApi(f);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.close();
    await f?.close();
    if (priv) await stopPrivateServers(priv);
  }, TIMEOUT_MS);

  const fill = async (full: boolean): Promise<void> => {
    await f.redis.config('SET', 'maxmemory-policy', 'noeviction');
    await f.redis.config('SET', 'maxmemory', full ? '1' : '0');
  };

  it(
    'a payment stays paid and is confirmed on redelivery; closed orders return their units once Redis takes writes',
    async () => {
      const STOCK = 10;
      const { activityId, skuId } = await openActivity(f.redis, { stock: STOCK, price: '5.00' }, f.pool);
      const users = ['payer', 'canceller', 'late', 'keeper'];
      const rids = await reserveFor(f.redis, activityId, skuId, users);
      const orders = await materialize(f.pool, f.redis, activityId, rids);
      const [payRid, cancelRid, lateRid] = rids as [string, string, string, string];
      const payment = { orderId: orders.get(payRid)!, tradeNo: `${activityId}-t1`, amount: '5.00' };
      const buyer = buyerOrders(api, activityId, skuId);
      const returnedEvents = async (rid: string) =>
        (await journalFor(f.pool, rid)).filter((j) => j.event === 'STOCK_RETURNED').length;
      const sweep = () =>
        sweepExpiredOrders({ ...f.deps, activityId, batchSize: 100, maxBatches: 10, settleGraceSeconds: 0 });

      await fill(true);
      try {
        // The payment: PostgreSQL first (committed), then the mark in Redis, refused: the provider
        // is told to retry, and the order stays paid.
        const paid = await notify(api, payment);
        expect([paid.status, paid.body.code]).toEqual([503, 'UNAVAILABLE']);
        expect((await findLifecycleByReservationId(f.pool, payRid))?.status).toBe('PAID');
        expect((await paymentsForOrder(f.pool, payment.orderId)).map((p) => p.state)).toEqual(['APPLIED']);
        expect((await readReservation(f.redis, activityId, payRid))?.state).toBe('RESERVED');

        // The buyer's cancellation: the order closes, the unit's return waits for Redis.
        const cancelled = await buyer.cancel('canceller', cancelRid);
        expect([cancelled.status, cancelled.body.outcome]).toEqual([200, 'cancelled']);
        // The payment timeout: likewise.
        await f.pool.query(`UPDATE orders SET expires_at = now() - interval '1 second' WHERE id = $1`, [
          orders.get(lateRid),
        ]);
        const swept = await sweep();
        // With no grace period the same run re-drives both closed orders' returns: deferred again.
        expect([swept.closed, swept.resettled, swept.settled.redis, swept.settled.deferred]).toEqual([
          1, 2, 0, 3,
        ]);
        for (const rid of [cancelRid, lateRid]) {
          const o = await findLifecycleByReservationId(f.pool, rid);
          expect([o?.status, o?.stockReturned]).toEqual(['CLOSED', false]);
          expect((await readReservation(f.redis, activityId, rid))?.state).toBe('RESERVED');
        }
        expect(await skuStock(f.redis, activityId, skuId)).toBe(STOCK - users.length);

        // What Redis alone would record is refused, and nothing is written anywhere.
        const early = await buyer.cancelByRequest('early', 'early-1');
        expect([early.status, early.body.code]).toEqual([503, 'UNAVAILABLE']);
        const submitted = await buyer.submit('newcomer', 'new-1');
        expect([submitted.status, submitted.body.code]).toEqual([503, 'UNAVAILABLE']);
        const journalRows = await f.pool.query(
          `SELECT count(*)::int AS n FROM order_journal WHERE activity_id = $1 AND event = 'CANCELLED_BEFORE_RESERVATION'`,
          [activityId],
        );
        expect(journalRows.rows[0].n).toBe(0);
      } finally {
        await fill(false);
      }

      // Redis takes writes: the provider's redelivery confirms, the sweeper's next pass returns.
      const again = await notify(api, payment);
      expect(again).toEqual({ status: 200, body: { result: 'success', outcome: 'ALREADY_PAID' } });
      expect((await readReservation(f.redis, activityId, payRid))?.state).toBe('PAID');
      const resweep = await sweep();
      expect([resweep.closed, resweep.resettled, resweep.settled.redis]).toEqual([0, 2, 2]);
      expect((await sweep()).resettled).toBe(0);
      for (const rid of [cancelRid, lateRid]) {
        expect((await findLifecycleByReservationId(f.pool, rid))?.stockReturned).toBe(true);
        expect((await readReservation(f.redis, activityId, rid))?.state).toBe('RELEASED');
        expect(await returnedEvents(rid)).toBe(1);
      }
      expect(await returnedEvents(payRid)).toBe(0);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(STOCK - users.length + 2);
      const c = await counters(f.redis, activityId);
      expect([c.reserved, c.released]).toEqual([users.length, 2]);
      // The refused calls, retried, now do what they would have done.
      const early = await buyer.cancelByRequest('early', 'early-1');
      expect([early.status, early.body.outcome]).toEqual([200, 'tombstoned']);
      const submitted = await buyer.submit('newcomer', 'new-1');
      expect(submitted.status).toBe(202);
    },
    TIMEOUT_MS,
  );
});
