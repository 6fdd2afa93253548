// Buyer cancellation through the real api (failure window 9 and docs/sources seed 004's release rules):
// cancel before the reservation (tombstone: the late reservation is refused), cancel twice
// (idempotent), cancel an in-flight reservation (never a live order afterwards, even racing the
// consumer's insert), cancel after payment (ALREADY_PAID), somebody else's reservation (404).
import { findLifecycleByReservationId } from '../../../core/db/orders-store.js';
import { journalFor } from '../../../core/db/journal-store.js';
import { readStock } from '../../../core/activity-cache.js';
import { activityKeys } from '../../../core/keys.js';
import { readReservation, reservationIdFor, reserve } from '../../../core/reservations.js';
import { runScript } from '../../../core/scripts.js';
import {
  TIMEOUT_MS,
  buyerOrders,
  counters,
  materialize,
  notify,
  openActivity,
  setUp,
  skuStock,
  startApi,
  type Api,
  type BuyerOrders,
  type Fixture,
} from './fixture.js';

describe('buyer cancellation', () => {
  let f: Fixture;
  let api: Api;
  let activityId: string;
  let skuId: string;
  let buyer: BuyerOrders;
  const INITIAL = 100;

  beforeAll(async () => {
    f = await setUp();
    ({ activityId, skuId } = await openActivity(f.redis, { stock: INITIAL, price: '5.00' }));
    api = await startApi(f);
    buyer = buyerOrders(api, activityId, skuId);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.close();
    await f?.close();
  }, TIMEOUT_MS);

  const returnedEvents = async (rid: string) =>
    (await journalFor(f.pool, rid)).filter((j) => j.event === 'STOCK_RETURNED').length;

  it(
    'cancel before the reservation arrives: tombstoned, and the late reservation is refused with CANCELLED',
    async () => {
      const stock = await skuStock(f.redis, activityId, skuId);
      const c = await buyer.cancelByRequest('early', 'early-1');
      expect([c.status, c.body.outcome]).toEqual([200, 'tombstoned']);
      const late = await buyer.submit('early', 'early-1');
      expect([late.status, late.body.code]).toEqual([409, 'CANCELLED']);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(stock);
      const rid = c.body.reservationId as string;
      const poll = await buyer.poll('early', rid);
      expect(poll.body).toMatchObject({ status: 'FAILED', reason: 'CANCELLED' });
      const again = await buyer.cancelByRequest('early', 'early-1');
      expect([again.status, again.body.outcome]).toEqual([200, 'already-cancelled']);
      // The buyer may still buy with a new request.
      expect((await buyer.submit('early', 'early-2')).status).toBe(202);
    },
    TIMEOUT_MS,
  );

  it(
    'cancel an unpaid order twice (and twice at once): closed once, stock returned once',
    async () => {
      for (const [user, concurrent] of [
        ['twice', false],
        ['twice-at-once', true],
      ] as const) {
        const r = await buyer.submit(user, `${user}-1`);
        expect(r.status).toBe(202);
        const rid = r.body.reservationId as string;
        await materialize(f.pool, f.redis, activityId, [rid]);
        const stock = await skuStock(f.redis, activityId, skuId);
        const replies = concurrent
          ? await Promise.all([buyer.cancel(user, rid), buyer.cancel(user, rid), buyer.cancel(user, rid)])
          : [await buyer.cancel(user, rid), await buyer.cancel(user, rid)];
        expect(replies.every((x) => x.status === 200)).toBe(true);
        const outcomes = replies.map((x) => x.body.outcome as string).sort();
        const expected = ['cancelled', ...replies.slice(1).map(() => 'already-cancelled')].sort();
        expect(outcomes).toEqual(expected);
        const order = await findLifecycleByReservationId(f.pool, rid);
        expect([order?.status, order?.closeReason, order?.stockReturned]).toEqual([
          'CLOSED',
          'CANCELLED',
          true,
        ]);
        expect(await skuStock(f.redis, activityId, skuId)).toBe(stock + 1);
        expect(await returnedEvents(rid)).toBe(1);
        // The submission again: the same answer as the poll (CLOSED, with its order and reason),
        // not FAILED ("no order was or will be created"), and no unit taken.
        const again = await buyer.submit(user, `${user}-1`);
        const poll = await buyer.poll(user, rid);
        expect(poll.body).toMatchObject({ status: 'CLOSED', reason: 'CANCELLED', orderId: order?.id });
        expect([again.status, again.body]).toEqual([202, { ...poll.body, replayed: true }]);
        expect(await skuStock(f.redis, activityId, skuId)).toBe(stock + 1);
      }
    },
    TIMEOUT_MS,
  );

  it(
    'cancel an in-flight reservation (no order yet): the order is written CLOSED, the consumer cannot revive it',
    async () => {
      const r = await buyer.submit('inflight', 'inflight-1');
      const rid = r.body.reservationId as string;
      const stock = await skuStock(f.redis, activityId, skuId);
      const c = await buyer.cancel('inflight', rid);
      expect([c.status, c.body.outcome]).toEqual([200, 'cancelled']);
      // The consumer now delivers the reservation's message: the database finds it closed.
      const ids = await materialize(f.pool, f.redis, activityId, [rid]);
      expect(ids.size).toBe(0);
      const order = await findLifecycleByReservationId(f.pool, rid);
      expect([order?.status, order?.stockReturned]).toEqual(['CLOSED', true]);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(stock + 1);
      expect((await readReservation(f.redis, activityId, rid))?.state).toBe('RELEASED');
      const poll = await buyer.poll('inflight', rid);
      // The order exists (inserted CLOSED): the buyer reads it from PostgreSQL.
      expect([poll.body.status, poll.body.reason]).toEqual(['CLOSED', 'CANCELLED']);
    },
    TIMEOUT_MS,
  );

  it(
    'cancellation racing the consumer insert, 20 times: never a live order, stock returned exactly once',
    async () => {
      const users = Array.from({ length: 20 }, (_, i) => `racer-${i}`);
      const rids = await Promise.all(
        users.map(async (u) => (await buyer.submit(u, `${u}-1`)).body.reservationId as string),
      );
      const before = await counters(f.redis, activityId);
      const replies = await Promise.all(
        users.map((u, i) =>
          Promise.all([buyer.cancel(u, rids[i]!), materialize(f.pool, f.redis, activityId, [rids[i]!])]).then(
            ([c]) => c,
          ),
        ),
      );
      expect(replies.map((x) => [x.status, x.body.outcome])).toEqual(users.map(() => [200, 'cancelled']));
      for (const rid of rids) {
        const order = await findLifecycleByReservationId(f.pool, rid);
        expect([order?.status, order?.stockReturned]).toEqual(['CLOSED', true]);
        expect(await returnedEvents(rid)).toBe(1);
      }
      const after = await counters(f.redis, activityId);
      expect(after.released! - before.released!).toBe(20);
      const live = await f.pool.query(
        `SELECT 1 FROM orders WHERE reservation_id = ANY($1::text[]) AND status <> 'CLOSED'`,
        [rids],
      );
      expect(live.rowCount).toBe(0);
    },
    TIMEOUT_MS,
  );

  /**
   * A bucketed activity, and the first step of a cancellation by requestId that went no further
   * (core/reservations.ts cancelBeforeReserve marks the buyer's scopes in turn; the process died
   * or lost its connection before the buyer's bucket): the activity's scope holds the marker.
   */
  async function halfCancelled(user: string, requestId: string) {
    const hot = await openActivity(f.redis, { stock: 8, buckets: 4, skuId: 'hot' });
    const rid = reservationIdFor(hot.activityId, user, requestId);
    const own = activityKeys(hot.activityId);
    await runScript(
      f.redis,
      'cancelBeforeReserve',
      [own.meta, own.reservation(rid), own.buyer(user)],
      [user, 'CANCELLED', 60, 16],
    );
    const remaining = async () =>
      (await readStock(f.redis, hot.activityId)).skus.map((x) => [x.skuId, x.remaining]);
    const cancelByRequest = () => buyerOrders(api, hot.activityId, 'hot').cancelByRequest(user, requestId);
    return { activityId: hot.activityId, rid, remaining, cancelByRequest };
  }

  it(
    'a cancellation by requestId that marked only the activity scope: the late bucketed submission is refused, a retry marks the rest',
    async () => {
      const h = await halfCancelled('halfway', 'halfway-1');
      // The submission's claim meets the marker: its bucket, not marked, reserves nothing.
      const late = await buyerOrders(api, h.activityId, 'hot').submit('halfway', 'halfway-1');
      expect([late.status, late.body.code]).toEqual([409, 'CANCELLED']);
      expect(await h.remaining()).toEqual([['hot', 8]]);
      // The buyer retries the cancellation (its first answer was lost): the bucket is marked now.
      const retried = await h.cancelByRequest();
      expect([retried.status, retried.body.outcome]).toEqual([200, 'tombstoned']);
      const again = await h.cancelByRequest();
      expect([again.status, again.body.outcome]).toEqual([200, 'already-cancelled']);
      const poll = await buyerOrders(api, h.activityId, 'hot').poll('halfway', h.rid);
      expect(poll.body).toMatchObject({ status: 'FAILED', reason: 'CANCELLED' });
      expect(await findLifecycleByReservationId(f.pool, h.rid)).toBeUndefined();
    },
    TIMEOUT_MS,
  );

  it(
    'per-buyer limit off (no claim): a bucketed submission crossing the cancellation is cancelled in flight, never left live',
    async () => {
      const h = await halfCancelled('crosser', 'crosser-1');
      // Without the buyer's window a bucket reservation makes no call in the activity's scope, so
      // nothing there stops it: it reserves in the bucket the cancellation has not reached.
      const r = await reserve(f.redis, {
        activityId: h.activityId,
        userId: 'crosser',
        skuId: 'hot',
        quantity: 1,
        requestId: 'crosser-1',
        traceId: 'crossing',
      });
      expect([r.kind, r.reservationId]).toEqual(['reserved', h.rid]);
      const poll = await buyerOrders(api, h.activityId, 'hot').poll('crosser', h.rid);
      expect(poll.body.status).toBe('QUEUED');
      const c = await h.cancelByRequest();
      expect([c.status, c.body.outcome, c.body.reservationId]).toEqual([200, 'cancelled', h.rid]);
      // The consumer delivers the reservation afterwards: PostgreSQL has it closed already.
      expect((await materialize(f.pool, f.redis, h.activityId, [h.rid])).size).toBe(0);
      const order = await findLifecycleByReservationId(f.pool, h.rid);
      expect([order?.status, order?.closeReason, order?.stockReturned]).toEqual([
        'CLOSED',
        'CANCELLED',
        true,
      ]);
      expect(await h.remaining()).toEqual([['hot', 8]]);
    },
    TIMEOUT_MS,
  );

  it(
    'cancel after payment: 409 ALREADY_PAID, the order stays PAID and keeps its stock',
    async () => {
      const r = await buyer.submit('payer', 'payer-1');
      const rid = r.body.reservationId as string;
      const ids = await materialize(f.pool, f.redis, activityId, [rid]);
      const paid = await notify(api, {
        orderId: ids.get(rid)!,
        tradeNo: `cancel-paid-${rid}`,
        amount: '5.00',
      });
      expect(paid.body.outcome).toBe('PAID');
      const stock = await skuStock(f.redis, activityId, skuId);
      const c = await buyer.cancel('payer', rid);
      expect([c.status, c.body.code]).toEqual([409, 'ALREADY_PAID']);
      expect((await findLifecycleByReservationId(f.pool, rid))?.status).toBe('PAID');
      expect(await skuStock(f.redis, activityId, skuId)).toBe(stock);
      expect(await returnedEvents(rid)).toBe(0);
    },
    TIMEOUT_MS,
  );

  it(
    "somebody else's reservation: 404, nothing changes",
    async () => {
      const r = await buyer.submit('owner', 'owner-1');
      const rid = r.body.reservationId as string;
      const c = await buyer.cancel('intruder', rid);
      expect([c.status, c.body.code]).toEqual([404, 'UNKNOWN_RESERVATION']);
      expect((await readReservation(f.redis, activityId, rid))?.state).toBe('RESERVED');
      const unauth = await fetch(`${api.url}/v1/activities/${activityId}/orders/${rid}`, {
        method: 'DELETE',
      });
      expect(unauth.status).toBe(401);
    },
    TIMEOUT_MS,
  );
});
