// Failure window 7: payment-timeout close racing a payment, 200 orders at once. Two sweepers
// (separate pools, as two replicas) close expired orders in small batches while every order's
// payment notification arrives over HTTP, twice. Exactly one outcome per order, stock returned at
// most once (exactly once for the closed ones), counters consistent.
import { journalFor } from '../../../core/db/journal-store.js';
import type { Pool } from '../../../core/db/pool.js';
import { readReservation } from '../../../core/reservations.js';
import { sweepExpiredOrders } from '../../../runtime/jobs/payment-timeout.js';
import { auditStock } from '../../../runtime/jobs/stock-audit.js';
import {
  TIMEOUT_MS,
  counters,
  expireAll,
  materialize,
  notifyUntilAnswered,
  openActivity,
  reserveFor,
  setUp,
  testPool,
  retryTransient,
  skuStock,
  startApi,
  type Api,
  type Fixture,
} from './fixture.js';

const ORDERS = 200;

describe('close versus pay (failure window 7)', () => {
  let f: Fixture;
  let api: Api;
  const replicaPools: Pool[] = [];

  beforeAll(async () => {
    f = await setUp(12);
    api = await startApi(f);
    replicaPools.push(testPool(f.db.url, 4, 'sweeper-a'), testPool(f.db.url, 4, 'sweeper-b'));
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.close();
    for (const p of replicaPools) await p.end();
    await f?.close();
  }, TIMEOUT_MS);

  it(
    `${ORDERS} orders, each paid while two sweepers close them: exactly one outcome each, stock returned once`,
    async () => {
      const initial = ORDERS + 20;
      const { activityId, skuId } = await openActivity(f.redis, { stock: initial, price: '9.99' });
      const users = Array.from({ length: ORDERS }, (_, i) => `racer-${i}`);
      const rids = await reserveFor(f.redis, activityId, skuId, users);
      const ids = await materialize(f.pool, f.redis, activityId, rids);
      expect(ids.size).toBe(ORDERS);
      expect(await expireAll(f.pool, activityId)).toBe(ORDERS);

      const sweeper = (pool: Pool) => async () => {
        let closed = 0;
        for (;;) {
          const r = await retryTransient(() =>
            sweepExpiredOrders({
              ...f.deps,
              pool,
              activityId,
              batchSize: 7,
              maxBatches: 1,
              settleGraceSeconds: 0,
            }),
          );
          closed += r.closed;
          if (r.closed === 0 && r.resettled === 0) return closed;
        }
      };
      // Payments in a shuffled order, two deliveries each, interleaved with both sweepers.
      const order = [...rids].sort(() => Math.random() - 0.5);
      const pay = async (rid: string, attempt: number) =>
        notifyUntilAnswered(api, { orderId: ids.get(rid)!, tradeNo: `race-${rid}`, amount: '9.99' }).then(
          (r) => {
            if (r.status !== 200)
              throw new Error(`attempt ${attempt} for ${rid}: ${r.status} ${JSON.stringify(r.body)}`);
            return r.body.outcome as string;
          },
        );
      const [closedA, closedB, outcomes] = await Promise.all([
        sweeper(replicaPools[0]!)(),
        sweeper(replicaPools[1]!)(),
        Promise.all(order.map((rid) => Promise.all([pay(rid, 1), pay(rid, 2)]))),
      ]);

      const rows = await f.pool.query<{
        reservation_id: string;
        status: string;
        stock_returned: boolean;
        stock_return_via: string | null;
      }>(
        `SELECT reservation_id, status, stock_returned, stock_return_via FROM orders WHERE activity_id = $1`,
        [activityId],
      );
      const pays = await f.pool.query<{
        reservation_id: string;
        state: string;
        refund_reason: string | null;
      }>(`SELECT reservation_id, state, refund_reason FROM payments WHERE activity_id = $1`, [activityId]);
      const payOf = new Map(pays.rows.map((p) => [p.reservation_id, p]));
      expect(pays.rows).toHaveLength(ORDERS); // one payment row per trade_no, however often notified
      let paid = 0;
      let closed = 0;
      for (const o of rows.rows) {
        const p = payOf.get(o.reservation_id)!;
        const rsv = await readReservation(f.redis, activityId, o.reservation_id);
        const journal = await journalFor(f.pool, o.reservation_id);
        const events = journal.map((j) => j.event);
        if (o.status === 'PAID') {
          paid += 1;
          expect([p.state, o.stock_returned, rsv?.state]).toEqual(['APPLIED', false, 'PAID']);
          expect(events.filter((e) => e === 'ORDER_PAID')).toHaveLength(1);
          expect(events).not.toContain('ORDER_CLOSED');
          expect(events).not.toContain('STOCK_RETURNED');
        } else {
          closed += 1;
          expect(o.status).toBe('CLOSED');
          expect([p.state, p.refund_reason]).toEqual(['REFUND_PENDING', 'ORDER_CLOSED']);
          expect([o.stock_returned, o.stock_return_via, rsv?.state]).toEqual([true, 'redis', 'RELEASED']);
          expect(events.filter((e) => e === 'ORDER_CLOSED')).toHaveLength(1);
          expect(events.filter((e) => e === 'STOCK_RETURNED')).toHaveLength(1);
          expect(events).not.toContain('ORDER_PAID');
        }
      }
      expect(paid + closed).toBe(ORDERS);
      expect(closedA + closedB).toBeLessThanOrEqual(closed); // a retried run reports only its own part
      // Each order answered consistently: both deliveries of a paid order say PAID/ALREADY_PAID.
      for (const [i, rid] of order.entries()) {
        const status = rows.rows.find((o) => o.reservation_id === rid)!.status;
        const got = [...outcomes[i]!].sort();
        expect(got).toEqual(
          status === 'PAID' ? ['ALREADY_PAID', 'PAID'] : ['REFUND_PENDING', 'REFUND_PENDING'],
        );
      }
      const c = await counters(f.redis, activityId);
      expect(c.reserved).toBe(ORDERS);
      expect(c.released).toBe(closed);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(initial - paid);
      const rec = await auditStock({ ...f.deps, activityId, remeasureDelayMs: 50 });
      expect(rec.mismatches).toEqual([]);
      process.stdout.write(
        `close-vs-pay: ${paid} paid, ${closed} closed (sweeper A ${closedA}, B ${closedB})\n`,
      );
    },
    TIMEOUT_MS,
  );
});
