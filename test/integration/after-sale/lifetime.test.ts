// Orders outlive the sale (docs/after-sale.md "Late payment", "Buyer answers"), on the real
// PostgreSQL and Redis through the real HTTP endpoints: a payment made in time for an order the
// timeout closed takes its unit back from PostgreSQL after write-back (or goes to REFUND_PENDING
// when it cannot, never an oversell); buyers read every state from PostgreSQL; a replay after the
// cache is gone gets its order back and a new submission the answer of the sale window.
import { pino } from 'pino';
import { cleanupActivity, outboxStreams, setGate } from '../../../core/activity-cache.js';
import { registerActivity } from '../../../core/db/activity-registry-store.js';
import { lockActivitySkus, recordActivitySkus } from '../../../core/db/activity-skus-store.js';
import { closeExpiredOrders, findOrderById } from '../../../core/db/orders-store.js';
import { paymentsForOrder } from '../../../core/db/payments-store.js';
import { readStockRows } from '../../../core/db/stock-store.js';
import {
  locateReservation,
  readReservation,
  reclaimPaid,
  release,
  reservationIdFor,
} from '../../../core/reservations.js';
import { bucketLayout, unitsLeft } from '../../../core/buckets.js';
import { activityKeys } from '../../../core/keys.js';
import type { BucketKeys } from '../../../core/keys.js';
import { acceptPayment } from '../../../runtime/payments/apply.js';
import { sweepExpiredOrders } from '../../../runtime/jobs/payment-timeout.js';
import { uniqueId } from '../../../dev/servers.js';
import { cleanupKilledAtFirstDelete } from '../../fixtures/interrupted-cleanup.js';
import {
  APP_ID,
  MERCHANT_ID,
  TIMEOUT_MS,
  buyerCall,
  buyerOrders,
  counters,
  countRows,
  materialize,
  notify,
  openActivity,
  reserveFor,
  setUp,
  skuStock,
  startApi,
  type Api,
  type Fixture,
  freezeAndWriteBack,
} from './fixture.js';

/** A signed notification with an explicit payment time. */
function paidBody(orderId: string, tradeNo: string, paidAt: Date, amount = '19.90'): string {
  return JSON.stringify({
    app_id: APP_ID,
    merchant_id: MERCHANT_ID,
    out_trade_no: orderId,
    trade_no: tradeNo,
    total_amount: amount,
    trade_status: 'TRADE_SUCCESS',
    gmt_payment: paidAt.toISOString(),
  });
}

describe('orders outlive the sale: late payments and buyer answers', () => {
  let f: Fixture;
  let api: Api;
  let activityId: string;
  let skuId: string;
  const users = ['late-in-time', 'late-too-late', 'sold-again', 'dup-trade', 'never-pays', 'unpaid-view'];
  const order = new Map<string, string>();
  const rid = new Map<string, string>();
  const deadline = async (orderId: string): Promise<Date> =>
    (await findOrderById(f.pool, orderId))!.expiresAt;
  const remaining = async (): Promise<number> =>
    (await readStockRows(f.pool, activityId)).reduce((n, r) => n + r.remaining, 0);
  /** One sweep of an activity's expired orders (a batch of 10, unsettled closures at once). */
  const sweepOnce = (activity: string) =>
    sweepExpiredOrders({
      ...f.deps,
      activityId: activity,
      batchSize: 10,
      maxBatches: 1,
      settleGraceSeconds: 0,
    });
  /** The order's payment deadline passed an hour ago; one sweep of its activity. */
  const expireAndSweep = async (activity: string, orderId: string) => {
    await f.pool.query(`UPDATE orders SET expires_at = now() - interval '1 hour' WHERE id = $1`, [orderId]);
    return sweepOnce(activity);
  };
  const sweep = () =>
    sweepExpiredOrders({
      ...f.deps,
      activityId,
      batchSize: 100,
      maxBatches: 5,
      settleGraceSeconds: 0,
    });

  beforeAll(async () => {
    f = await setUp();
    ({ activityId, skuId } = await openActivity(f.redis, { stock: 10, price: '19.90' }));
    const rids = await reserveFor(f.redis, activityId, skuId, users);
    const ids = await materialize(f.pool, f.redis, activityId, rids);
    users.forEach((u, i) => {
      rid.set(u, rids[i]!);
      order.set(u, ids.get(rids[i]!)!);
    });
    api = await startApi(f);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.close();
    await f?.close();
  }, TIMEOUT_MS);

  it(
    'GET answers UNPAID with amount and payment deadline from PostgreSQL; by requestId too; not to another buyer',
    async () => {
      const u = 'unpaid-view';
      const r = await buyerCall(api, 'GET', `/v1/activities/${activityId}/orders/${rid.get(u)!}`, u);
      expect(r.status).toBe(200);
      expect(r.body).toMatchObject({
        reservationId: rid.get(u),
        status: 'UNPAID',
        orderId: order.get(u),
        amount: '19.90',
        quantity: 1,
        skuId,
        paymentDeadline: (await deadline(order.get(u)!)).toISOString(),
      });
      const byRequest = await buyerCall(
        api,
        'GET',
        `/v1/activities/${activityId}/orders?requestId=req-${u}`,
        u,
      );
      expect(byRequest.body).toEqual(r.body);
      const other = await buyerCall(
        api,
        'GET',
        `/v1/activities/${activityId}/orders/${rid.get(u)!}`,
        'intruder',
      );
      expect(other.status).toBe(404);
      expect(other.body.code).toBe('UNKNOWN_RESERVATION');
    },
    TIMEOUT_MS,
  );

  it(
    'while the cache is live, an in-time payment for a timed-out order takes its unit back from Redis; a unit sold again → REFUND_PENDING',
    async () => {
      const u = 'never-pays';
      const id = order.get(u)!;
      await f.pool.query(`UPDATE orders SET expires_at = now() - interval '10 seconds' WHERE id = $1`, [id]);
      const swept = await sweep();
      expect(swept.closed).toBe(1);
      expect(swept.settled.redis).toBe(1);
      const stockAfterClose = await skuStock(f.redis, activityId, skuId);
      const released = (await counters(f.redis, activityId)).released ?? 0;
      const paidAt = new Date((await deadline(id)).getTime() - 5_000);
      const r = await notify(api, paidBody(id, uniqueId('T'), paidAt));
      expect(r).toEqual({ status: 200, body: { result: 'success', outcome: 'PAID' } });
      expect(await findOrderById(f.pool, id)).toMatchObject({
        status: 'PAID',
        stockReturned: false,
        stockReturnVia: null,
      });
      expect(await skuStock(f.redis, activityId, skuId)).toBe(stockAfterClose - 1);
      expect((await counters(f.redis, activityId)).released).toBe(released - 1);
      expect((await readReservation(f.redis, activityId, rid.get(u)!))?.state).toBe('PAID');
      const view = await buyerCall(api, 'GET', `/v1/activities/${activityId}/orders/${rid.get(u)!}`, u);
      expect(view.body).toMatchObject({ status: 'PAID', orderId: id });

      // Another sale, one unit: closed, released, bought by somebody else, then paid in time.
      const other = await openActivity(f.redis, { stock: 1, price: '19.90' });
      const [first] = await reserveFor(f.redis, other.activityId, other.skuId, ['slow-payer']);
      const ids = await materialize(f.pool, f.redis, other.activityId, [first!]);
      const slow = ids.get(first!)!;
      await f.pool.query(`UPDATE orders SET expires_at = now() - interval '10 seconds' WHERE id = $1`, [
        slow,
      ]);
      await sweepOnce(other.activityId);
      const [second] = await reserveFor(f.redis, other.activityId, other.skuId, ['quick-buyer']);
      expect((await readReservation(f.redis, other.activityId, second!))?.state).toBe('RESERVED');
      const late = await notify(
        api,
        paidBody(slow, uniqueId('T'), new Date((await deadline(slow)).getTime() - 1_000)),
      );
      expect(late.body.outcome).toBe('REFUND_PENDING');
      expect((await findOrderById(f.pool, slow))?.status).toBe('CLOSED');
      expect(await skuStock(f.redis, other.activityId, other.skuId)).toBe(0);
      expect((await readReservation(f.redis, other.activityId, first!))?.state).toBe('RELEASED');
      const why = await f.pool.query<{ detail: Record<string, unknown> }>(
        `SELECT detail FROM order_journal WHERE order_id = $1 AND event = 'PAYMENT_REFUND_PENDING'`,
        [slow],
      );
      expect(why.rows.map((j) => j.detail.why)).toEqual(['paid in time, but Redis: SOLD_OUT']);
    },
    TIMEOUT_MS,
  );

  it.each([
    ['every key of the sale', 0],
    ["only the keys of its stock bucket (one cluster node's)", 2],
  ])(
    'an in-time payment for a timed-out order whose Redis lost %s (no restore opened yet) is answered 503, not refunded',
    async (_lost, buckets) => {
      const lost = await openActivity(f.redis, {
        stock: 4,
        price: '19.90',
        ...(buckets > 0 ? { skuId: 'sku-lost-bucket', buckets } : {}),
      });
      const payer = `lost-cache-payer-${buckets}`;
      const [r] = await reserveFor(f.redis, lost.activityId, lost.skuId, [payer]);
      const id = (await materialize(f.pool, f.redis, lost.activityId, [r!])).get(r!)!;
      await f.pool.query(`UPDATE orders SET expires_at = now() - interval '10 seconds' WHERE id = $1`, [id]);
      await sweepOnce(lost.activityId);
      // Redis restarts without its data (or one node of a cluster does); the operator has not
      // noticed yet.
      const scope = (await bucketLayout(f.redis, lost.activityId)).scopeFor(lost.skuId, payer);
      await f.redis.del(...(await f.redis.keys(`${scope.prefix}*`)));
      if (buckets > 0) expect(await f.redis.exists(activityKeys(lost.activityId).meta)).toBe(1);
      const paid = paidBody(id, uniqueId('T'), new Date((await deadline(id)).getTime() - 1_000));
      const r1 = await notify(api, paid);
      expect([r1.status, r1.body.code]).toEqual([503, 'UNAVAILABLE']);
      expect(r1.headers['retry-after']).toBeDefined();
      expect((await findOrderById(f.pool, id))?.status).toBe('CLOSED');
      const journal = await f.pool.query<{ event: string }>(
        `SELECT event FROM order_journal WHERE order_id = $1 AND event LIKE 'PAYMENT%'`,
        [id],
      );
      expect(journal.rows).toEqual([]);
      expect(await paymentsForOrder(f.pool, id)).toEqual([]);
    },
    TIMEOUT_MS,
  );

  it(
    'while the cache is live, an in-time payment for a timed-out order of a bucketed SKU whose home bucket sold out takes a unit moved in from another bucket (no phantom refund)',
    async () => {
      // 4 units in 2 buckets of 2. The slow payer's unit goes back to its home bucket, which two
      // buyers of the same home bucket then empty; the other bucket still has its 2 units.
      const sale = await openActivity(f.redis, {
        stock: 4,
        price: '19.90',
        skuId: 'sku-bkt-late',
        buckets: 2,
      });
      const layout = await bucketLayout(f.redis, sale.activityId);
      const home = (user: string): number => (layout.scopeFor(sale.skuId, user) as BucketKeys).index;
      const payer = 'bkt-slow-payer';
      const sameHome = Array.from({ length: 64 }, (_, i) => `bkt-buyer-${i}`)
        .filter((u) => home(u) === home(payer))
        .slice(0, 2);
      expect(sameHome).toHaveLength(2);
      const [first] = await reserveFor(f.redis, sale.activityId, sale.skuId, [payer]);
      const slow = (await materialize(f.pool, f.redis, sale.activityId, [first!])).get(first!)!;
      expect((await expireAndSweep(sale.activityId, slow)).settled.redis).toBe(1);
      await reserveFor(f.redis, sale.activityId, sale.skuId, sameHome);
      const bucketStock = async (): Promise<number[]> =>
        Promise.all(
          layout
            .bucketsOf(sale.skuId)
            .map(async (b) => Number((await f.redis.hget(b.sku(sale.skuId), 'stock')) ?? 0)),
        );
      const before = await bucketStock();
      expect(before[home(payer)]).toBe(0);
      expect(before.reduce((n, x) => n + x, 0)).toBe(2);

      const late = await notify(
        api,
        paidBody(slow, uniqueId('T'), new Date((await deadline(slow)).getTime() - 1_000)),
      );
      expect(late).toEqual({ status: 200, body: { result: 'success', outcome: 'PAID' } });
      expect(await findOrderById(f.pool, slow)).toMatchObject({ status: 'PAID' });
      expect((await locateReservation(f.redis, sale.activityId, first!))?.record.state).toBe('PAID');
      // Exactly one unit left the sale for the payment: 4 units, 3 sold, 1 left over the buckets.
      expect((await bucketStock()).reduce((n, x) => n + x, 0)).toBe(1);
      expect(await unitsLeft(f.redis, layout, sale.skuId)).toBe(1);
    },
    TIMEOUT_MS,
  );

  it(
    "a late payment's unit taken back from a bucketed SKU whose every refill other buyers outrun: a retry (503), never a refund while units are left",
    async () => {
      // 1,200 units in 2 buckets of 600. The payer's unit went back to its home bucket, which other
      // buyers emptied; the other bucket has its 600 (each refill moves half of a donor's units).
      const sale = await openActivity(f.redis, {
        stock: 1200,
        price: '19.90',
        skuId: 'sku-bkt-outrun',
        buckets: 2,
      });
      const layout = await bucketLayout(f.redis, sale.activityId);
      const home = (user: string): number => (layout.scopeFor(sale.skuId, user) as BucketKeys).index;
      const payer = 'outrun-payer';
      const homeBucket = layout.scopeFor(sale.skuId, payer) as BucketKeys;
      const homeBuyers = Array.from({ length: 3000 }, (_, i) => `outrun-${i}`).filter(
        (u) => home(u) === home(payer),
      );
      const [rid] = await reserveFor(f.redis, sale.activityId, sale.skuId, [payer]);
      await release(f.redis, {
        activityId: sale.activityId,
        reservationId: rid!,
        userId: payer,
        skuId: sale.skuId,
        reason: 'PAYMENT_TIMEOUT',
      });
      await reserveFor(f.redis, sale.activityId, sale.skuId, homeBuyers.splice(0, 600));
      // Every unit a refill moves toward the payer's home bucket is bought by the next buyer there
      // before the payment's retry in the bucket runs.
      const outrun = new Proxy(f.redis, {
        get(t, prop) {
          const v: unknown = Reflect.get(t, prop);
          if (prop === 'fs_transferStock')
            return async (...args: unknown[]) => {
              const r = await (v as (...a: unknown[]) => Promise<unknown>).apply(t, args);
              const landed = Number((await f.redis.hget(homeBucket.sku(sale.skuId), 'stock')) ?? 0);
              await reserveFor(f.redis, sale.activityId, sale.skuId, homeBuyers.splice(0, landed));
              return r;
            };
          return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
        },
      });
      const taken = await reclaimPaid(outrun, {
        activityId: sale.activityId,
        reservationId: rid!,
        userId: payer,
        skuId: sale.skuId,
        quantity: 1,
      }).then(
        (o) => o.kind,
        (err: unknown) => (err as { code?: string }).code,
      );
      const left = await unitsLeft(f.redis, layout, sale.skuId);
      expect(left).toBeGreaterThan(0);
      // SOLD_OUT would refund a payment made in time while units are left: the provider retries.
      expect(taken).toBe('UNAVAILABLE');
    },
    TIMEOUT_MS,
  );

  it(
    "an in-time payment whose transaction died after Redis took the unit back is completed by the provider's retry, not refunded",
    async () => {
      const other = await openActivity(f.redis, { stock: 3, price: '19.90' });
      const u = 'crashed-payer';
      const [r2] = await reserveFor(f.redis, other.activityId, other.skuId, [u]);
      const id = (await materialize(f.pool, f.redis, other.activityId, [r2!])).get(r2!)!;
      await f.pool.query(`UPDATE orders SET expires_at = now() - interval '10 seconds' WHERE id = $1`, [id]);
      // The sweeper closes the order in PostgreSQL and dies before its release ran.
      expect(await closeExpiredOrders(f.pool, other.activityId, 10, 'PAYMENT_TIMEOUT')).toHaveLength(1);
      // The payment's transaction took the unit in Redis and died before its commit (the
      // provider got no answer and retries).
      await reclaimPaid(f.redis, {
        activityId: other.activityId,
        reservationId: r2!,
        userId: u,
        skuId: other.skuId,
        quantity: 1,
      });
      // The sweeper's next pass finds the reservation PAID: it leaves the unit to the payment.
      const swept = await sweepOnce(other.activityId);
      expect(swept.settled).toMatchObject({ unresolved: 0, redis: 0 });
      expect(await findOrderById(f.pool, id)).toMatchObject({ status: 'CLOSED', stockReturnVia: null });

      const paidAt = new Date((await deadline(id)).getTime() - 5_000);
      const r = await notify(api, paidBody(id, uniqueId('T'), paidAt));
      expect(r).toEqual({ status: 200, body: { result: 'success', outcome: 'PAID' } });
      expect(await findOrderById(f.pool, id)).toMatchObject({ status: 'PAID', stockReturnVia: null });
      expect((await readReservation(f.redis, other.activityId, r2!))?.state).toBe('PAID');
      expect(await skuStock(f.redis, other.activityId, other.skuId)).toBe(2);
    },
    TIMEOUT_MS,
  );

  it(
    'an in-time payment whose transaction died after Redis took the unit back, retried only after the write-back: PAID, no second unit taken, plain SKU and stock bucket alike',
    async () => {
      const plain = await openActivity(f.redis, { stock: 3, price: '19.90', skuId: 'sku-held' }, f.pool);
      const bucketed = await openActivity(
        f.redis,
        { stock: 4, price: '19.90', skuId: 'sku-held-bkt', buckets: 2 },
        f.pool,
      );
      const item = (a: { skuId: string }, stock: number) => ({
        skuId: a.skuId,
        name: 'held',
        price: '19.90',
        stock,
        limitPerUser: 1,
      });
      await recordActivitySkus(f.pool, plain.activityId, [item(plain, 3)], 'spec');
      await recordActivitySkus(f.pool, bucketed.activityId, [item(bucketed, 4)], 'spec');
      const [released, unreleased] = await reserveFor(f.redis, plain.activityId, plain.skuId, [
        'held-released',
        'held-unreleased',
      ]);
      const ids = await materialize(f.pool, f.redis, plain.activityId, [released!, unreleased!]);
      const [inBucket] = await reserveFor(f.redis, bucketed.activityId, bucketed.skuId, ['held-bkt']);
      const bucketId = (await materialize(f.pool, f.redis, bucketed.activityId, [inBucket!])).get(inBucket!)!;
      expect((await locateReservation(f.redis, bucketed.activityId, inBucket!))!.scope.meta).not.toBe(
        activityKeys(bucketed.activityId).meta,
      );
      const orderOf = { released: ids.get(released!)!, unreleased: ids.get(unreleased!)! };
      // 'held-released' and the bucket's buyer: timed out, their units back in Redis (settled
      // 'redis'); 'held-unreleased': closed by a sweeper that died before its release ran.
      expect((await expireAndSweep(plain.activityId, orderOf.released)).settled.redis).toBe(1);
      expect((await expireAndSweep(bucketed.activityId, bucketId)).settled.redis).toBe(1);
      await f.pool.query(`UPDATE orders SET expires_at = now() - interval '1 hour' WHERE id = $1`, [
        orderOf.unreleased,
      ]);
      expect(await closeExpiredOrders(f.pool, plain.activityId, 10, 'PAYMENT_TIMEOUT')).toHaveLength(1);
      // Each buyer's payment, made in time, took the unit in Redis and died before its commit.
      for (const [a, rsv, user] of [
        [plain, released!, 'held-released'],
        [plain, unreleased!, 'held-unreleased'],
        [bucketed, inBucket!, 'held-bkt'],
      ] as const) {
        await reclaimPaid(f.redis, {
          activityId: a.activityId,
          reservationId: rsv,
          userId: user,
          skuId: a.skuId,
          quantity: 1,
        });
      }
      // The sale ends. The sweeper's pass after the freeze finds the unreleased one's reservation
      // PAID and leaves it unresolved; then the write-back, whose snapshot holds all three units.
      await setGate(f.redis, plain.activityId, 'frozen');
      await sweepOnce(plain.activityId);
      await freezeAndWriteBack(f, plain.activityId, 2);
      await freezeAndWriteBack(f, bucketed.activityId, 1);
      const stockOf = async (a: { activityId: string }) =>
        (await readStockRows(f.pool, a.activityId)).reduce((n, r) => n + r.remaining, 0);
      expect([await stockOf(plain), await stockOf(bucketed)]).toEqual([1, 3]);
      for (const id of [orderOf.released, orderOf.unreleased, bucketId]) {
        expect(await findOrderById(f.pool, id)).toMatchObject({
          status: 'CLOSED',
          unitHeldForPayment: true,
          stockReturnVia: 'unresolved',
        });
      }
      // No later settlement returns a held unit to activity_stock.
      await sweepOnce(plain.activityId);
      expect(await stockOf(plain)).toBe(1);

      // The providers' retries: each order PAID, its unit the one the snapshot held.
      for (const id of [orderOf.released, orderOf.unreleased, bucketId]) {
        const r = await notify(
          api,
          paidBody(id, uniqueId('T'), new Date((await deadline(id)).getTime() - 5_000)),
        );
        expect(r).toEqual({ status: 200, body: { result: 'success', outcome: 'PAID' } });
        expect(await findOrderById(f.pool, id)).toMatchObject({
          status: 'PAID',
          unitHeldForPayment: false,
          stockReturnVia: null,
        });
        const paid = await f.pool.query<{ detail: Record<string, unknown> }>(
          `SELECT detail FROM order_journal WHERE order_id = $1 AND event IN ('ORDER_PAID', 'STOCK_HELD_FOR_PAYMENT')
            ORDER BY id`,
          [id],
        );
        expect(paid.rows.map((j) => j.detail)).toEqual([
          expect.objectContaining({ why: expect.stringMatching(/reservation PAID in Redis/) }),
          expect.objectContaining({ late: true, stock: 'still-held', from: 'postgres' }),
        ]);
      }
      expect([await stockOf(plain), await stockOf(bucketed)]).toEqual([1, 3]);
    },
    TIMEOUT_MS,
  );

  it(
    'after write-back a late payment locks the SKU row before activity_stock, in the order a stock return does (they never deadlock)',
    async () => {
      const item = { skuId: 'sku-lock', name: 'lock order', price: '19.90', stock: 3, limitPerUser: 1 };
      const a = await openActivity(f.redis, { stock: 3, price: '19.90', skuId: item.skuId }, f.pool);
      await recordActivitySkus(f.pool, a.activityId, [item], 'spec');
      const [r1] = await reserveFor(f.redis, a.activityId, a.skuId, ['lock-order']);
      const id = (await materialize(f.pool, f.redis, a.activityId, [r1!])).get(r1!)!;
      await freezeAndWriteBack(f, a.activityId, 1);
      const swept = await expireAndSweep(a.activityId, id);
      expect(swept.settled.postgres).toBe(1);

      // A stock return of the same SKU holds its activity_skus row (returnStock's first lock).
      const returning = await f.pool.connect();
      const probe = await f.pool.connect();
      try {
        await returning.query('BEGIN');
        await lockActivitySkus(returning, a.activityId, [a.skuId]);
        const paying = notify(api, paidBody(id, 'lock-1', new Date((await deadline(id)).getTime() - 1_000)));
        // The payment waits for that row...
        for (let i = 0; ; i += 1) {
          const waiting = await f.pool.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'`,
          );
          if (waiting.rows[0]!.n > 0) break;
          if (i > 200) throw new Error('the payment never waited for the SKU row');
          await new Promise((r) => setTimeout(r, 25));
        }
        // ...without holding activity_stock's, which the return takes next.
        await probe.query('BEGIN');
        const free = await probe.query(
          `SELECT remaining FROM activity_stock WHERE activity_id = $1 AND sku_id = $2 FOR UPDATE NOWAIT`,
          [a.activityId, a.skuId],
        );
        expect(free.rows).toEqual([{ remaining: 3 }]);
        await probe.query('ROLLBACK');
        await returning.query('COMMIT');
        expect((await paying).body.outcome).toBe('PAID');
      } finally {
        await probe.query('ROLLBACK').catch(() => undefined);
        await returning.query('ROLLBACK').catch(() => undefined);
        probe.release();
        returning.release();
      }
      expect((await readStockRows(f.pool, a.activityId)).map((r) => r.remaining)).toEqual([2]);
    },
    TIMEOUT_MS,
  );

  it(
    'after write-back: paid in time → PAID with its unit taken back from activity_stock; paid too late → REFUND_PENDING; nothing left → REFUND_PENDING, stock never negative',
    async () => {
      // The duplicate trade's order is paid during the sale.
      const dup = order.get('dup-trade')!;
      expect((await notify(api, paidBody(dup, 'dup-1', new Date()))).body.outcome).toBe('PAID');

      // The sale ends: frozen, written back, the rest expires and is swept to PostgreSQL.
      await freezeAndWriteBack(f, activityId, 6);
      const before = await remaining();
      expect(before).toBe(10 - 6); // 6 reserved; never-pays' unit released, then taken back by its payment
      const late = ['late-in-time', 'late-too-late', 'sold-again'].map((u) => order.get(u)!);
      await f.pool.query(
        `UPDATE orders SET expires_at = now() - interval '1 hour' WHERE id = ANY($1::bigint[])`,
        [late],
      );
      const swept = await sweep();
      expect(swept.closed).toBe(3);
      expect(swept.settled.postgres).toBe(3);
      expect(await remaining()).toBe(before + 3);

      // Paid within the window, notified an hour later: applied, one unit taken back.
      const [inTime, tooLate, soldAgain] = late as [string, string, string];
      const r1 = await notify(
        api,
        paidBody(inTime, 'late-1', new Date((await deadline(inTime)).getTime() - 1_000)),
      );
      expect(r1).toEqual({ status: 200, body: { result: 'success', outcome: 'PAID' } });
      const paid = await findOrderById(f.pool, inTime);
      expect(paid).toMatchObject({ status: 'PAID', stockReturned: false, stockReturnVia: null });
      expect(await remaining()).toBe(before + 2);
      expect((await paymentsForOrder(f.pool, inTime)).map((p) => p.state)).toEqual(['APPLIED']);
      const journal = await f.pool.query<{ detail: Record<string, unknown> }>(
        `SELECT detail FROM order_journal WHERE order_id = $1 AND event = 'ORDER_PAID'`,
        [inTime],
      );
      expect(journal.rows.map((j) => j.detail)).toEqual([
        expect.objectContaining({ late: true, stock: 'taken-back' }),
      ]);
      // The same notification again: ALREADY_PAID, no second take-back.
      const again = await notify(
        api,
        paidBody(inTime, 'late-1', new Date((await deadline(inTime)).getTime() - 1_000)),
      );
      expect(again.body.outcome).toBe('ALREADY_PAID');
      expect(await remaining()).toBe(before + 2);

      // Paid after the deadline (beyond the tolerance): refund, the order stays closed.
      const r2 = await notify(
        api,
        paidBody(tooLate, 'late-2', new Date((await deadline(tooLate)).getTime() + 400_000)),
      );
      expect(r2.body.outcome).toBe('REFUND_PENDING');
      expect((await findOrderById(f.pool, tooLate))?.status).toBe('CLOSED');
      expect(await remaining()).toBe(before + 2);

      // Paid in time, but every unit is gone again: refund, never below zero.
      await f.pool.query(`UPDATE activity_stock SET remaining = 0 WHERE activity_id = $1`, [activityId]);
      const r3 = await notify(
        api,
        paidBody(soldAgain, 'late-3', new Date((await deadline(soldAgain)).getTime() - 1_000)),
      );
      expect(r3.body.outcome).toBe('REFUND_PENDING');
      expect(await findOrderById(f.pool, soldAgain)).toMatchObject({
        status: 'CLOSED',
        stockReturnVia: 'postgres',
      });
      expect(await remaining()).toBe(0);

      // A second trade for a paid order: refund, the order keeps its first payment.
      const r4 = await notify(api, paidBody(dup, 'dup-2', new Date()));
      expect(r4.body.outcome).toBe('REFUND_PENDING');
      expect((await paymentsForOrder(f.pool, dup)).map((p) => [p.tradeNo, p.state])).toEqual([
        ['dup-1', 'APPLIED'],
        ['dup-2', 'REFUND_PENDING'],
      ]);
      const view = await buyerCall(
        api,
        'GET',
        `/v1/activities/${activityId}/orders/${rid.get('dup-trade')!}`,
        'dup-trade',
      );
      expect(view.body).toMatchObject({ status: 'PAID', refundPending: { amount: '19.90', count: 1 } });
    },
    TIMEOUT_MS,
  );

  it(
    'a malformed or future payment time is refused with 400 and writes nothing',
    async () => {
      const id = order.get('unpaid-view')!;
      const payments = await countRows(f.pool, 'SELECT count(*) AS n FROM payments');
      const bad = JSON.stringify({
        app_id: APP_ID,
        merchant_id: MERCHANT_ID,
        out_trade_no: id,
        trade_no: 'bad-time',
        total_amount: '19.90',
        trade_status: 'TRADE_SUCCESS',
        gmt_payment: 'yesterday',
      });
      const r1 = await notify(api, bad);
      expect([r1.status, r1.body.code]).toEqual([400, 'VALIDATION_ERROR']);
      const r2 = await notify(api, paidBody(id, 'future-time', new Date(Date.now() + 3_600_000)));
      expect([r2.status, r2.body.code]).toEqual([400, 'VALIDATION_ERROR']);
      expect(await countRows(f.pool, 'SELECT count(*) AS n FROM payments')).toBe(payments);
      expect((await findOrderById(f.pool, id))?.status).toBe('UNPAID');
    },
    TIMEOUT_MS,
  );

  it(
    'a submission finding no cache inside the sale window is told to retry (503), not NOT_STARTED',
    async () => {
      // A sale whose window is open but whose cache is not there (Redis lost it and the restore has
      // not put the hold in place yet; a warm-up running late) is not "not open yet": retry.
      const open = uniqueId('open');
      await registerActivity(f.pool, {
        activityId: open,
        owner: 'test/open',
        ownerUid: 'uid-open',
        startAt: new Date(Date.now() - 60_000),
        endAt: new Date(Date.now() + 3_600_000),
        requireOrderCode: false,
        reopenOnRelease: false,
      });
      const during = await buyerCall(api, 'POST', `/v1/activities/${open}/orders`, 'newcomer', {
        skuId,
        quantity: 1,
        requestId: 'req-newcomer',
      });
      expect([during.status, during.body.code, during.headers['retry-after']]).toEqual([
        503,
        'UNAVAILABLE',
        '1',
      ]);
    },
    TIMEOUT_MS,
  );

  it(
    'after cleanup: a replay gets its order back, a new submission ENDED, an unknown activity NOT_FOUND, a future one NOT_STARTED; cancellation returns the unit to PostgreSQL',
    async () => {
      // The test wrote orders without a relay: the outbox still holds their half messages.
      await cleanupActivity(f.redis, activityId, 3600, { force: true });
      const u = 'late-in-time';
      const replay = await buyerCall(api, 'POST', `/v1/activities/${activityId}/orders`, u, {
        skuId,
        quantity: 1,
        requestId: `req-${u}`,
      });
      expect(replay.status).toBe(202);
      expect(replay.body).toMatchObject({
        reservationId: reservationIdFor(activityId, u, `req-${u}`),
        status: 'PAID',
        orderId: order.get(u),
        replayed: true,
      });
      const closed = await buyerCall(
        api,
        'GET',
        `/v1/activities/${activityId}/orders/${rid.get('late-too-late')!}`,
        'late-too-late',
      );
      expect(closed.body).toMatchObject({
        status: 'CLOSED',
        reason: 'PAYMENT_TIMEOUT',
        refundPending: { count: 1 },
      });

      const conflict = await buyerCall(api, 'POST', `/v1/activities/${activityId}/orders`, u, {
        skuId,
        quantity: 2,
        requestId: `req-${u}`,
      });
      expect([conflict.status, conflict.body.code]).toEqual([409, 'IDEMPOTENCY_CONFLICT']);

      const fresh = await buyerCall(api, 'POST', `/v1/activities/${activityId}/orders`, 'newcomer', {
        skuId,
        quantity: 1,
        requestId: 'req-newcomer',
      });
      expect([fresh.status, fresh.body.code]).toEqual([409, 'ENDED']);

      const unknown = await buyerCall(
        api,
        'POST',
        `/v1/activities/${uniqueId('nobody')}/orders`,
        'newcomer',
        {
          skuId,
          quantity: 1,
          requestId: 'req-newcomer',
        },
      );
      expect([unknown.status, unknown.body.code]).toEqual([404, 'NOT_FOUND']);

      const future = uniqueId('future');
      await registerActivity(f.pool, {
        activityId: future,
        owner: 'test/future',
        ownerUid: 'uid-future',
        startAt: new Date(Date.now() + 3_600_000),
        endAt: new Date(Date.now() + 7_200_000),
        requireOrderCode: false,
        reopenOnRelease: false,
      });
      const early = await buyerCall(api, 'POST', `/v1/activities/${future}/orders`, 'newcomer', {
        skuId,
        quantity: 1,
        requestId: 'req-newcomer',
      });
      expect([early.status, early.body.code]).toEqual([409, 'NOT_STARTED']);
      // A buyer can still cancel an unpaid order: closed, its unit returned to PostgreSQL.
      const stockBefore = await remaining();
      const cancel = await buyerCall(
        api,
        'DELETE',
        `/v1/activities/${activityId}/orders?requestId=req-unpaid-view`,
        'unpaid-view',
      );
      expect([cancel.status, cancel.body.outcome]).toEqual([200, 'cancelled']);
      expect(await findOrderById(f.pool, order.get('unpaid-view')!)).toMatchObject({
        status: 'CLOSED',
        closeReason: 'CANCELLED',
        stockReturnVia: 'postgres',
      });
      expect(await remaining()).toBe(stockBefore + 1);
      const again = await buyerCall(
        api,
        'DELETE',
        `/v1/activities/${activityId}/orders/${rid.get('unpaid-view')!}`,
        'unpaid-view',
      );
      expect([again.status, again.body.outcome]).toEqual([200, 'already-cancelled']);
      expect(await remaining()).toBe(stockBefore + 1);

      // None of these wrote anything.
      expect(
        await countRows(f.pool, 'SELECT count(*) AS n FROM orders WHERE activity_id = ANY($1::text[])', [
          [future],
        ]),
      ).toBe(0);
      expect(
        await countRows(f.pool, 'SELECT count(*) AS n FROM orders WHERE activity_id = $1', [activityId]),
      ).toBe(users.length);
    },
    TIMEOUT_MS,
  );

  it(
    'a late in-time payment of a bucketed SKU during cleanup: PAID from activity_stock, nothing logged as inconsistent',
    async () => {
      const item = { skuId: 'sku-bkt', name: 'bucketed', price: '19.90', stock: 4, limitPerUser: 1 };
      const a = await openActivity(
        f.redis,
        { stock: 4, price: '19.90', skuId: item.skuId, buckets: 2 },
        f.pool,
      );
      await recordActivitySkus(f.pool, a.activityId, [item], 'spec');
      const [r1] = await reserveFor(f.redis, a.activityId, a.skuId, ['bkt-late']);
      const id = (await materialize(f.pool, f.redis, a.activityId, [r1!])).get(r1!)!;
      const home = (await locateReservation(f.redis, a.activityId, r1!))!.scope;
      expect(home.meta).not.toBe(activityKeys(a.activityId).meta);
      // The order times out and its unit goes back to Redis before the freeze.
      const swept = await expireAndSweep(a.activityId, id);
      expect(swept.settled.redis).toBe(1);
      await freezeAndWriteBack(f, a.activityId, 1);
      // Cleanup has deleted the bucket's meta hash, not yet the reservation (SCAN's order).
      await f.redis.del(home.meta);
      expect((await readReservation(f.redis, a.activityId, r1!, home))?.state).toBe('RELEASED');

      const lines: string[] = [];
      const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(line) });
      const paid = await acceptPayment(
        { pool: f.pool, redis: f.redis, logger },
        'hmac',
        {
          orderId: id,
          tradeNo: uniqueId('T'),
          amount: '19.90',
          status: 'success',
          providerStatus: 'TRADE_SUCCESS',
          paidAt: new Date((await deadline(id)).getTime() - 5_000),
          fields: {},
        },
        'trace-bkt-late',
      );
      expect(paid.outcome).toBe('PAID');
      expect(await findOrderById(f.pool, id)).toMatchObject({ status: 'PAID' });
      expect((await readStockRows(f.pool, a.activityId))[0]?.remaining).toBe(3);
      expect(lines.filter((l) => /INCONSISTENT/.test(l))).toEqual([]);
    },
    TIMEOUT_MS,
  );

  it(
    'during cleanup: a retry of a submission that reserved gets its order back, not SOLD_OUT or ENDED, from a sold-out flag or a stock bucket alike',
    async () => {
      // An api that answers a SKU it saw sold out from its own flag, as in production.
      const flagging = await startApi(f, undefined, { soldOutRecheckMs: 600_000 });
      try {
        const plain = await openActivity(f.redis, { stock: 2, skuId: 'sku-plain' }, f.pool);
        const bucketed = await openActivity(f.redis, { stock: 6, skuId: 'sku-hot', buckets: 3 }, f.pool);
        const onPlain = buyerOrders(flagging, plain.activityId, plain.skuId);
        const onHot = buyerOrders(flagging, bucketed.activityId, bucketed.skuId);
        const first = await onPlain.submit('retry-plain', 'req-retry-plain');
        const second = await onPlain.submit('keeps-plain', 'req-keeps-plain');
        const hot = await onHot.submit('retry-hot', 'req-retry-hot');
        expect([first.status, second.status, hot.status]).toEqual([202, 202, 202]);
        // The SKU is sold out: this api answers it from its flag from now on.
        const late = await onPlain.submit('too-late', 'req-too-late');
        expect([late.status, late.body.code]).toEqual([409, 'SOLD_OUT']);

        const plainRids = [first.body.reservationId, second.body.reservationId] as string[];
        const hotRid = hot.body.reservationId as string;
        const orders = new Map([
          ...(await materialize(f.pool, f.redis, plain.activityId, plainRids)),
          ...(await materialize(f.pool, f.redis, bucketed.activityId, [hotRid])),
        ]);
        // Where a resumed cleanup's SCAN may reach first: the reservations' own hashes.
        const doomed = [
          (await locateReservation(f.redis, plain.activityId, plainRids[0]!))!.scope.reservation(
            plainRids[0]!,
          ),
          (await locateReservation(f.redis, bucketed.activityId, hotRid))!.scope.reservation(hotRid),
        ];
        for (const a of [plain, bucketed]) {
          // The relay sent the half messages (their orders are in PostgreSQL): cleanup may run.
          for (const outbox of await outboxStreams(f.redis, a.activityId)) await f.redis.del(outbox);
        }
        await freezeAndWriteBack(f, plain.activityId, 2);
        await freezeAndWriteBack(f, bucketed.activityId, 1);
        await cleanupKilledAtFirstDelete(f.redis, plain.activityId);
        await cleanupKilledAtFirstDelete(f.redis, bucketed.activityId);
        expect(await f.redis.del(...doomed)).toBe(2);

        const replayOf = (r: { status: number; body: Record<string, unknown> }) => [
          r.status,
          r.body.code ?? r.body.status,
          r.body.orderId,
          r.body.replayed,
        ];
        // Answered from PostgreSQL, which holds every order once cleanup began.
        const plainRetry = await onPlain.submit('retry-plain', 'req-retry-plain');
        expect(replayOf(plainRetry)).toEqual([202, 'UNPAID', orders.get(plainRids[0]!), true]);
        const hotRetry = await onHot.submit('retry-hot', 'req-retry-hot');
        expect(replayOf(hotRetry)).toEqual([202, 'UNPAID', orders.get(hotRid), true]);
        // A reservation the cleanup has not reached yet is still replayed from Redis.
        const kept = await onPlain.submit('keeps-plain', 'req-keeps-plain');
        expect([kept.status, kept.body.reservationId, kept.body.replayed]).toEqual([202, plainRids[1], true]);
        // Anything else is told the sale ended, by the window, as once the cache is gone.
        const fresh = await onPlain.submit('newcomer', 'req-newcomer');
        expect([fresh.status, fresh.body.code]).toEqual([409, 'ENDED']);
        const freshHot = await onHot.submit('newcomer', 'req-newcomer');
        expect([freshHot.status, freshHot.body.code]).toEqual([409, 'ENDED']);

        // The cleanup completes: the same answers, and not a key left but the retained results.
        for (const a of [plain, bucketed]) {
          await cleanupActivity(f.redis, a.activityId, 60);
          const k = activityKeys(a.activityId);
          const left = [...(await f.redis.keys(k.scanPattern)), ...(await f.redis.keys(k.bucketScanPattern))];
          expect(left.filter((key) => key !== k.results)).toEqual([]);
        }
        expect(replayOf(await onPlain.submit('retry-plain', 'req-retry-plain'))).toEqual(
          replayOf(plainRetry),
        );
        expect(replayOf(await onHot.submit('retry-hot', 'req-retry-hot'))).toEqual(replayOf(hotRetry));
      } finally {
        await flagging.close();
      }
    },
    TIMEOUT_MS,
  );
});
