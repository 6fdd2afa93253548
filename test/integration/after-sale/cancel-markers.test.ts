// Cancel markers cannot be used to fill Redis or PostgreSQL, nor to block another buyer
// (lua/cancelBeforeReserve-3.lua, core/order-lifecycle.ts cancelReservation): made-up ids write
// nothing; a marker exists only under the id derived from the buyer's own requestId, expires after
// the sale and is bounded per buyer. Real api (express app), real Redis and PostgreSQL.
import { setGate } from '../../../core/activity-cache.js';
import { activityKeys } from '../../../core/keys.js';
import { UNKNOWN_ACTIVITY_LABEL } from '../../../core/metrics.js';
import { DEFAULT_CANCEL_MARKER_POLICY, reservationIdFor } from '../../../core/reservations.js';
import { uniqueId } from '../../../dev/servers.js';
import { httpClient, pool as inParallel } from '../../../dev/roles.js';
import {
  TIMEOUT_MS,
  buyerOrders,
  buyerToken,
  countRows,
  openActivity,
  setUp,
  skuStock,
  startApi,
  type Api,
  type BuyerOrders,
  type Fixture,
} from './fixture.js';

describe('cancel markers', () => {
  let f: Fixture;
  let api: Api;
  let activityId: string;
  let skuId: string;
  let buyer: BuyerOrders;
  const http = httpClient(32);

  beforeAll(async () => {
    f = await setUp();
    ({ activityId, skuId } = await openActivity(f.redis, { stock: 50, price: '5.00', limitPerUser: 1 }));
    api = await startApi(f);
    buyer = buyerOrders(api, activityId, skuId);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await http.close();
    await api?.close();
    await f?.close();
  }, TIMEOUT_MS);

  const keysMatching = async (pattern: string): Promise<number> => {
    let cursor = '0';
    let n = 0;
    do {
      const [next, keys] = await f.redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
      cursor = next;
      n += keys.length;
    } while (cursor !== '0');
    return n;
  };
  const activityKeyCount = () => keysMatching(activityKeys(activityId).scanPattern);
  const journalRows = () => countRows(f.pool, 'SELECT count(*) AS n FROM order_journal');
  const orderRows = () => countRows(f.pool, 'SELECT count(*) AS n FROM orders');

  it(
    '10,000 DELETEs with made-up ids write nothing to Redis or PostgreSQL',
    async () => {
      const ghost = uniqueId('ghost');
      const token = await buyerToken('mallory');
      const before = {
        keys: await activityKeyCount(),
        ghostKeys: await keysMatching(`fs:{${ghost}*`),
        journal: await journalRows(),
        orders: await orderRows(),
        buyer: await f.redis.exists(activityKeys(activityId).buyer('mallory')),
      };
      const paths: string[] = [];
      for (let i = 0; i < 10_000; i += 1) {
        const id = `${uniqueId('r')}${i}`.replaceAll('.', '_').slice(-40);
        if (i % 10 === 0) {
          // Made-up activities (the api serves every activity), both forms.
          paths.push(
            i % 20 === 0
              ? `/v1/activities/${ghost}-${i}/orders/${id}`
              : `/v1/activities/${ghost}-${i}/orders?requestId=${id}`,
          );
        } else {
          paths.push(`/v1/activities/${activityId}/orders/${id}`);
        }
      }
      const statuses = await inParallel(
        32,
        paths.map((p) => async () => {
          const r = await http.raw(`${api.url}${p}`, {
            method: 'DELETE',
            headers: { authorization: `Bearer ${token}` },
          });
          return `${r.status} ${String(r.json.code)} ${r.contentType.split(';')[0]}`;
        }),
      );
      const tally = new Map<string, number>();
      for (const s of statuses) tally.set(s, (tally.get(s) ?? 0) + 1);
      expect([...tally]).toEqual([['404 UNKNOWN_RESERVATION application/problem+json', 10_000]]);
      expect({
        keys: await activityKeyCount(),
        ghostKeys: await keysMatching(`fs:{${ghost}*`),
        journal: await journalRows(),
        orders: await orderRows(),
        buyer: await f.redis.exists(activityKeys(activityId).buyer('mallory')),
      }).toEqual(before);
    },
    TIMEOUT_MS,
  );

  it(
    'a buyer cannot block another buyer’s submission, by reservation id or by requestId',
    async () => {
      const victimRid = reservationIdFor(activityId, 'victim', 'v-1');
      // By the victim's reservation id (computable by anyone who learns the requestId): unknown.
      const byId = await buyer.cancel('mallory', victimRid);
      expect([byId.status, byId.body.code]).toEqual([404, 'UNKNOWN_RESERVATION']);
      expect(await f.redis.exists(activityKeys(activityId).reservation(victimRid))).toBe(0);
      // By the victim's requestId: the marker is mallory's own submission, not the victim's.
      const byRequest = await buyer.cancelByRequest('mallory', 'v-1');
      expect([byRequest.status, byRequest.body.outcome]).toEqual([200, 'tombstoned']);
      expect(byRequest.body.reservationId).toBe(reservationIdFor(activityId, 'mallory', 'v-1'));
      const submitted = await buyer.submit('victim', 'v-1');
      expect([submitted.status, submitted.body.reservationId]).toEqual([202, victimRid]);

      // A marker of another buyer under the victim's id (as buyers could leave before markers were
      // bound to their owner) does not refuse the victim either: the script removes it.
      const victim2Rid = reservationIdFor(activityId, 'victim-2', 'v-2');
      await f.redis.hset(activityKeys(activityId).reservation(victim2Rid), {
        state: 'CANCELLED',
        user: 'mallory',
        sku: '0-cancelled-before-reservation-0',
      });
      const stock = await skuStock(f.redis, activityId, skuId);
      const late = await buyer.submit('victim-2', 'v-2');
      expect([late.status, late.body.reservationId]).toEqual([202, victim2Rid]);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(stock - 1);
      expect(await f.redis.hget(activityKeys(activityId).reservation(victim2Rid), 'user')).toBe('victim-2');
    },
    TIMEOUT_MS,
  );

  it(
    'a marker expires after the sale, belongs to its buyer, and each buyer may leave only a bounded number',
    async () => {
      const own = await buyer.cancelByRequest('hoarder', 'h-0');
      expect([own.status, own.body.outcome]).toEqual([200, 'tombstoned']);
      const key = activityKeys(activityId).reservation(reservationIdFor(activityId, 'hoarder', 'h-0'));
      expect(await f.redis.hgetall(key)).toMatchObject({ state: 'CANCELLED', user: 'hoarder' });
      // The sale ends in an hour; the marker outlives it by the grace period, and does expire.
      expect(await f.redis.ttl(key)).toBeGreaterThan(DEFAULT_CANCEL_MARKER_POLICY.graceSeconds);
      const late = await buyer.submit('hoarder', 'h-0');
      expect([late.status, late.body.code]).toEqual([409, 'CANCELLED']);
      // Repeating a cancellation is idempotent and does not count again.
      expect((await buyer.cancelByRequest('hoarder', 'h-0')).body.outcome).toBe('already-cancelled');

      const keysBefore = await activityKeyCount();
      const journalBefore = await journalRows();
      const max = DEFAULT_CANCEL_MARKER_POLICY.maxPerBuyer;
      for (let i = 1; i < max; i += 1) {
        expect((await buyer.cancelByRequest('hoarder', `h-${i}`)).body.outcome).toBe('tombstoned');
      }
      const over = await buyer.cancelByRequest('hoarder', `h-${max}`);
      expect([over.status, over.body.code]).toEqual([429, 'CANCEL_MARKER_LIMIT']);
      // Retry-After: until the sale ends (in an hour), when nothing can arrive any more.
      const retryAfter = Number(over.headers['retry-after']);
      expect(retryAfter).toBeGreaterThan(3_500);
      expect(retryAfter).toBeLessThanOrEqual(3_600);
      expect(await activityKeyCount()).toBe(keysBefore + max - 1);
      expect(await journalRows()).toBe(journalBefore + max - 1);
      // Another buyer is not affected by the hoarder's bound.
      expect((await buyer.cancelByRequest('other', 'o-1')).body.outcome).toBe('tombstoned');
    },
    TIMEOUT_MS,
  );

  it(
    'after the sale nothing can arrive any more: a cancellation by requestId writes nothing',
    async () => {
      const ended = await openActivity(f.redis, { stock: 5 });
      await setGate(f.redis, ended.activityId, 'closed');
      const keys = await keysMatching(activityKeys(ended.activityId).scanPattern);
      const r = await buyerOrders(api, ended.activityId, skuId).cancelByRequest('late-buyer', 'l-1');
      expect([r.status, r.body.code]).toEqual([404, 'UNKNOWN_RESERVATION']);
      expect(await keysMatching(activityKeys(ended.activityId).scanPattern)).toBe(keys);
    },
    TIMEOUT_MS,
  );

  it(
    'an api serving every activity makes no metric series per made-up activity id',
    async () => {
      const ghost = uniqueId('nosale');
      const token = await buyerToken('prober');
      const replies = await inParallel(
        16,
        Array.from({ length: 200 }, (_, i) => async () => {
          const r = await http.post(
            `${api.url}/v1/activities/${ghost}-${i}/orders`,
            { skuId, quantity: 1, requestId: `p-${i}` },
            token,
          );
          return r.status;
        }),
      );
      // Activities nobody registered: 404 NOT_FOUND (core/order-view.ts), all under one label value.
      expect(new Set(replies)).toEqual(new Set([404]));
      const text = await f.metrics.registry.metrics();
      expect(text).not.toContain(ghost);
      expect(text).toMatch(
        new RegExp(
          `flashsale_reservations_total\\{activity="${UNKNOWN_ACTIVITY_LABEL}",result="unknown_activity"[^}]*\\} 200`,
        ),
      );
    },
    TIMEOUT_MS,
  );
});
