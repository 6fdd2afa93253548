// Source 004's payment outcome table, through the real HTTP endpoint, PostgreSQL and Redis:
// every row of the table, plus bad signature / wrong merchant / unknown order / trade conflict /
// malformed amount (nothing written) and a transient failure (503, so the provider retries).
import { closeOrder } from '../../../core/order-lifecycle.js';
import { createPool } from '../../../core/db/pool.js';
import { findOrderById } from '../../../core/db/orders-store.js';
import { paymentsForOrder } from '../../../core/db/payments-store.js';
import { journalFor } from '../../../core/db/journal-store.js';
import { readStock } from '../../../core/activity-cache.js';
import { activityKeys } from '../../../core/keys.js';
import { readReservation } from '../../../core/reservations.js';
import { signNotification } from '../../../runtime/payments/hmac-provider.js';
import {
  TIMEOUT_MS,
  PAY_SECRET,
  countRows,
  materialize,
  notify,
  notificationBody,
  openActivity,
  reserveFor,
  setUp,
  startApi,
  type Api,
  type Fixture,
  freezeAndWriteBack,
} from './fixture.js';

describe('payment notifications (docs/sources seed 004 outcome table)', () => {
  let f: Fixture;
  let api: Api;
  let activityId: string;
  let skuId: string;
  const orders: string[] = [];
  const rids: string[] = [];
  let seq = 0;
  /** A fresh unpaid order of 19.90. */
  const nextOrder = (): { orderId: string; reservationId: string } => {
    const i = seq;
    seq += 1;
    return { orderId: orders[i]!, reservationId: rids[i]! };
  };
  const tradeNo = () => `T${Date.now()}${Math.random().toString(36).slice(2, 8)}`;
  const snapshot = async () => ({
    payments: await countRows(f.pool, 'SELECT count(*) AS n FROM payments'),
    journal: await countRows(f.pool, 'SELECT count(*) AS n FROM order_journal'),
    paid: await countRows(f.pool, `SELECT count(*) AS n FROM orders WHERE status <> 'UNPAID'`),
  });

  beforeAll(async () => {
    f = await setUp();
    ({ activityId, skuId } = await openActivity(f.redis, { stock: 40, price: '19.90' }));
    const users = Array.from({ length: 30 }, (_, i) => `payer-${i}`);
    rids.push(...(await reserveFor(f.redis, activityId, skuId, users)));
    const ids = await materialize(f.pool, f.redis, activityId, rids);
    orders.push(...rids.map((r) => ids.get(r)!));
    api = await startApi(f);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.close();
    await f?.close();
  }, TIMEOUT_MS);

  it(
    'first notification: PAID (order PAID, payment APPLIED, reservation PAID in Redis, journal with trace id)',
    async () => {
      const { orderId, reservationId } = nextOrder();
      const trade = tradeNo();
      const r = await notify(api, { orderId, tradeNo: trade, amount: '19.90' });
      expect(r).toEqual({ status: 200, body: { result: 'success', outcome: 'PAID' } });
      expect((await findOrderById(f.pool, orderId))?.status).toBe('PAID');
      const pays = await paymentsForOrder(f.pool, orderId);
      expect(pays.map((p) => [p.tradeNo, p.state, p.amount])).toEqual([[trade, 'APPLIED', '19.90']]);
      expect((await readReservation(f.redis, activityId, reservationId))?.state).toBe('PAID');
      const journal = await journalFor(f.pool, reservationId);
      const paid = journal.filter((j) => j.event === 'ORDER_PAID');
      expect(paid).toHaveLength(1);
      expect(paid[0]?.toStatus).toBe('PAID');
      expect(paid[0]?.traceId).toMatch(/^[0-9a-f]{32}$/);
    },
    TIMEOUT_MS,
  );

  it(
    'same trade_no again after it was applied: ALREADY_PAID, nothing new, and Redis is re-confirmed',
    async () => {
      const { orderId, reservationId } = nextOrder();
      const trade = tradeNo();
      expect((await notify(api, { orderId, tradeNo: trade, amount: '19.90' })).body.outcome).toBe('PAID');
      // The confirmation in Redis got lost (e.g. Redis failed after the commit): the redelivery repairs it.
      await f.redis.hset(activityKeys(activityId).reservation(reservationId), 'state', 'RESERVED');
      const before = await snapshot();
      const again = await notify(api, { orderId, tradeNo: trade, amount: '19.90' });
      expect(again).toEqual({ status: 200, body: { result: 'success', outcome: 'ALREADY_PAID' } });
      expect(await snapshot()).toEqual(before);
      expect((await readReservation(f.redis, activityId, reservationId))?.state).toBe('PAID');
    },
    TIMEOUT_MS,
  );

  it(
    'the same trade_no delivered 12 times at once: applied exactly once',
    async () => {
      const { orderId } = nextOrder();
      const trade = tradeNo();
      const replies = await Promise.all(
        Array.from({ length: 12 }, () => notify(api, { orderId, tradeNo: trade, amount: '19.90' })),
      );
      expect(replies.every((r) => r.status === 200)).toBe(true);
      const outcomes = replies.map((r) => r.body.outcome).sort();
      expect(outcomes).toEqual(['PAID', ...Array.from({ length: 11 }, () => 'ALREADY_PAID')].sort());
      expect((await paymentsForOrder(f.pool, orderId)).map((p) => p.state)).toEqual(['APPLIED']);
    },
    TIMEOUT_MS,
  );

  it(
    'a second trade_no for a paid order: REFUND_PENDING, the order stays PAID with its first payment',
    async () => {
      const { orderId } = nextOrder();
      const first = tradeNo();
      const second = tradeNo();
      expect((await notify(api, { orderId, tradeNo: first, amount: '19.90' })).body.outcome).toBe('PAID');
      const r = await notify(api, { orderId, tradeNo: second, amount: '19.90' });
      expect(r).toEqual({ status: 200, body: { result: 'success', outcome: 'REFUND_PENDING' } });
      const pays = await paymentsForOrder(f.pool, orderId);
      expect(pays.map((p) => [p.tradeNo, p.state, p.refundReason]).sort()).toEqual(
        [
          [first, 'APPLIED', null],
          [second, 'REFUND_PENDING', 'PAID_BY_OTHER_TRADE'],
        ].sort(),
      );
      expect((await findOrderById(f.pool, orderId))?.status).toBe('PAID');
      // Redelivery of the refund-pending trade answers the same, and changes nothing.
      const again = await notify(api, { orderId, tradeNo: second, amount: '19.90' });
      expect(again.body.outcome).toBe('REFUND_PENDING');
      expect(await paymentsForOrder(f.pool, orderId)).toHaveLength(2);
    },
    TIMEOUT_MS,
  );

  it(
    'two trade_nos for one unpaid order at the same time: exactly one APPLIED, the other REFUND_PENDING',
    async () => {
      const { orderId } = nextOrder();
      const [a, b] = await Promise.all([
        notify(api, { orderId, tradeNo: tradeNo(), amount: '19.90' }),
        notify(api, { orderId, tradeNo: tradeNo(), amount: '19.90' }),
      ]);
      expect([a.body.outcome, b.body.outcome].sort()).toEqual(['PAID', 'REFUND_PENDING']);
      const states = (await paymentsForOrder(f.pool, orderId)).map((p) => p.state).sort();
      expect(states).toEqual(['APPLIED', 'REFUND_PENDING']);
    },
    TIMEOUT_MS,
  );

  it(
    'wrong amount: REFUND_PENDING (AMOUNT_MISMATCH), the order stays UNPAID and can still be paid correctly',
    async () => {
      const { orderId } = nextOrder();
      for (const amount of ['0.01', '19.9', '19.91', '199.00']) {
        const trade = tradeNo();
        const r = await notify(api, { orderId, tradeNo: trade, amount });
        // "19.9" is the same decimal as 19.90: it pays the order.
        if (amount === '19.9') {
          expect(r.body.outcome).toBe('PAID');
          continue;
        }
        expect(r).toEqual({ status: 200, body: { result: 'success', outcome: 'REFUND_PENDING' } });
        const pay = (await paymentsForOrder(f.pool, orderId)).find((p) => p.tradeNo === trade);
        expect([pay?.state, pay?.refundReason]).toEqual(['REFUND_PENDING', 'AMOUNT_MISMATCH']);
      }
      const { orderId: other } = nextOrder();
      expect((await notify(api, { orderId: other, tradeNo: tradeNo(), amount: '0.01' })).body.outcome).toBe(
        'REFUND_PENDING',
      );
      expect((await findOrderById(f.pool, other))?.status).toBe('UNPAID');
      expect((await notify(api, { orderId: other, tradeNo: tradeNo(), amount: '19.90' })).body.outcome).toBe(
        'PAID',
      );
    },
    TIMEOUT_MS,
  );

  it(
    'payment made after the deadline of an order the timeout closed: REFUND_PENDING (ORDER_CLOSED), the order stays CLOSED and its stock is not taken again',
    async () => {
      const { orderId, reservationId } = nextOrder();
      // Paid (now) after its deadline: decided by payment time, too late (docs/after-sale.md).
      await f.pool.query(`UPDATE orders SET expires_at = now() - interval '1 hour' WHERE id = $1`, [orderId]);
      await closeOrder(f.deps, orderId, 'PAYMENT_TIMEOUT', 'test-close');
      const stockBefore = await readStock(f.redis, activityId);
      const r = await notify(api, { orderId, tradeNo: tradeNo(), amount: '19.90' });
      expect(r).toEqual({ status: 200, body: { result: 'success', outcome: 'REFUND_PENDING' } });
      const order = await findOrderById(f.pool, orderId);
      expect([order?.status, order?.stockReturned]).toEqual(['CLOSED', true]);
      expect((await paymentsForOrder(f.pool, orderId)).map((p) => p.refundReason)).toEqual(['ORDER_CLOSED']);
      expect((await readReservation(f.redis, activityId, reservationId))?.state).toBe('RELEASED');
      expect(await readStock(f.redis, activityId)).toEqual(stockBefore);
    },
    TIMEOUT_MS,
  );

  it(
    'bad signature: 401 and nothing written (missing, wrong secret, tampered body, stale timestamp)',
    async () => {
      const { orderId } = nextOrder();
      const before = await snapshot();
      const n = { orderId, tradeNo: tradeNo(), amount: '19.90' };
      const body = notificationBody(n);
      const t = Math.floor(Date.now() / 1000);
      const replies = [
        await notify(api, n, { signature: null }),
        await notify(api, n, { signature: 'garbage' }),
        await notify(api, n, { secret: 'another-secret-of-sufficient-length-000' }),
        await notify(api, body.replace('"19.90"', '"0.01"'), {
          signature: signNotification(PAY_SECRET, body, t),
        }),
        await notify(api, n, { timestamp: t - 3600 }),
      ];
      expect(replies.map((r) => [r.status, r.body.code])).toEqual(
        Array.from({ length: 5 }, () => [401, 'BAD_SIGNATURE']),
      );
      expect(await snapshot()).toEqual(before);
      expect((await findOrderById(f.pool, orderId))?.status).toBe('UNPAID');
    },
    TIMEOUT_MS,
  );

  it(
    'wrong merchant/app, unknown order, trade conflict, float amount: refused, nothing written, provider retries',
    async () => {
      const { orderId } = nextOrder();
      const { orderId: paidOrder } = nextOrder();
      const trade = tradeNo();
      expect((await notify(api, { orderId: paidOrder, tradeNo: trade, amount: '19.90' })).body.outcome).toBe(
        'PAID',
      );
      const before = await snapshot();
      const merchant = await notify(api, {
        orderId,
        tradeNo: tradeNo(),
        amount: '19.90',
        merchantId: 'evil',
      });
      const app = await notify(api, { orderId, tradeNo: tradeNo(), amount: '19.90', appId: 'evil' });
      const unknown = await notify(api, { orderId: '999999999', tradeNo: tradeNo(), amount: '19.90' });
      const conflict = await notify(api, { orderId, tradeNo: trade, amount: '19.90' });
      const floatBody = notificationBody({ orderId, tradeNo: tradeNo(), amount: '19.90' }).replace(
        '"19.90"',
        '19.9',
      );
      const float = await notify(api, floatBody);
      const tooPrecise = await notify(api, { orderId, tradeNo: tradeNo(), amount: '19.900' });
      const unknownProvider = await notify(
        api,
        { orderId, tradeNo: tradeNo(), amount: '19.90' },
        { provider: 'nope' },
      );
      expect(
        [merchant, app, unknown, conflict, float, tooPrecise, unknownProvider].map((r) => [
          r.status,
          r.body.code,
        ]),
      ).toEqual([
        [403, 'MERCHANT_MISMATCH'],
        [403, 'MERCHANT_MISMATCH'],
        [404, 'UNKNOWN_ORDER'],
        [409, 'TRADE_CONFLICT'],
        [400, 'VALIDATION_ERROR'],
        [400, 'VALIDATION_ERROR'],
        [404, 'NOT_FOUND'],
      ]);
      expect(await snapshot()).toEqual(before);
    },
    TIMEOUT_MS,
  );

  it(
    'a notification that is not a success status is acknowledged and changes nothing',
    async () => {
      const { orderId } = nextOrder();
      const before = await snapshot();
      const r = await notify(api, { orderId, tradeNo: tradeNo(), amount: '19.90', status: 'WAIT_BUYER_PAY' });
      expect(r).toEqual({ status: 200, body: { result: 'success', outcome: 'IGNORED' } });
      expect(await snapshot()).toEqual(before);
    },
    TIMEOUT_MS,
  );

  it(
    'a transient database failure answers 503 so that the provider retries; the retry is applied once',
    async () => {
      const { orderId } = nextOrder();
      // A pool towards a port nobody listens on: connection refused, as during a database restart.
      const dead = createPool('postgres://postgres@127.0.0.1:9/none', 1, 'dead');
      const broken = await startApi(f, dead);
      try {
        const trade = tradeNo();
        const r = await notify(broken, { orderId, tradeNo: trade, amount: '19.90' });
        expect([r.status, r.body.code]).toEqual([503, 'UNAVAILABLE']);
        expect(await paymentsForOrder(f.pool, orderId)).toHaveLength(0);
        const retry = await notify(api, { orderId, tradeNo: trade, amount: '19.90' });
        expect(retry.body.outcome).toBe('PAID');
      } finally {
        await broken.close();
        await dead.end();
      }
    },
    TIMEOUT_MS,
  );

  it(
    'payment after write-back (cache frozen): PAID in PostgreSQL, the frozen cache is left alone',
    async () => {
      const { orderId, reservationId } = nextOrder();
      await freezeAndWriteBack(f, activityId, 0);
      const r = await notify(api, { orderId, tradeNo: tradeNo(), amount: '19.90' });
      expect(r.body.outcome).toBe('PAID');
      expect((await findOrderById(f.pool, orderId))?.status).toBe('PAID');
      expect((await readReservation(f.redis, activityId, reservationId))?.state).toBe('RESERVED');
    },
    TIMEOUT_MS,
  );
});
