// The operator's write-back step (operator/reconcile/write-back.ts) on the real Redis and
// PostgreSQL: the gate is frozen before the stock snapshot is read (after the freeze no release
// can change Redis stock, so the snapshot counts exactly what was not released before it), and the
// write is fenced (a repeat writes nothing). The Redis connection is wrapped only to record the
// order of the calls the step makes; every call still goes to the real server.
import { Redis } from 'ioredis';
import pg from 'pg';
import { readMeta } from '../../../core/activity-cache.js';
import { readStockRows, readWriteBack, writeBack as writeBackStock } from '../../../core/db/stock-store.js';
import { recordActivitySkus } from '../../../core/db/activity-skus-store.js';
import { findLifecycleByReservationId, insertOrders } from '../../../core/db/orders-store.js';
import { activityKeys } from '../../../core/keys.js';
import { createLogger } from '../../../core/logger.js';
import { settleStock } from '../../../core/order-lifecycle.js';
import {
  orderMessageOf,
  readReservation,
  reclaimPaid,
  release,
  reserve,
} from '../../../core/reservations.js';
import { derivePhase, enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import type { EffectiveSchedule } from '../../../operator/api/v1alpha1/funcs.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import { ReconcileContext } from '../../../operator/reconcile/context.js';
import type { ReconcileDeps } from '../../../operator/reconcile/context.js';
import { writeBack } from '../../../operator/reconcile/write-back.js';
import { detectFailure } from '../../../operator/reconcile/detect-failure.js';
import { stepContext } from '../../fixtures/step-context.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { loadBucketedSale, loadOpenSale } from '../../fixtures/open-sale.js';

const TIMEOUT_MS = 60_000;

describe('write-back (operator step, real Redis and PostgreSQL)', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let redis: Redis;
  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 2 });
  }, TIMEOUT_MS);
  afterAll(async () => {
    await sql.end();
    redis.disconnect();
    await db.drop();
  }, TIMEOUT_MS);

  /** The real connection, recording the name of every method the step calls on it. */
  function recording(target: Redis): { redis: Redis; calls: string[] } {
    const calls: string[] = [];
    const proxy = new Proxy(target, {
      get(t, prop, receiver) {
        const v: unknown = Reflect.get(t, prop, receiver);
        if (typeof v !== 'function' || typeof prop !== 'string') return v;
        return (...args: unknown[]) => {
          calls.push(prop);
          return (v as (...a: unknown[]) => unknown).apply(t, args);
        };
      },
    });
    return { redis: proxy, calls };
  }

  /**
   * A sale of 5 units per SKU, recorded in PostgreSQL and open in Redis, and its buyer: each user
   * reserves one unit and its order is written as the consumer writes it; returns the reservation
   * ids.
   */
  async function openSaleWithBuyer(
    id: string,
    skuIds: string[],
  ): Promise<(skuId: string, users: string[]) => Promise<string[]>> {
    const items = skuIds.map((skuId) => ({
      skuId,
      name: `item ${skuId}`,
      price: '1.00',
      stock: 5,
      limitPerUser: 1,
    }));
    await recordActivitySkus(sql, id, items, 'spec');
    await loadOpenSale(redis, id, items, { reopenOnRelease: true });
    return async (skuId, users) => {
      const ids: string[] = [];
      for (const u of users) {
        const r = await reserve(redis, {
          activityId: id,
          userId: u,
          skuId,
          quantity: 1,
          requestId: u,
          traceId: u,
        });
        const rsv = (await readReservation(redis, id, r.reservationId))!;
        await insertOrders(sql, [orderMessageOf(id, rsv)], 900);
        ids.push(r.reservationId);
      }
      return ids;
    };
  }

  /** A pass of a sale in WritingBack whose cache was loaded once, as the step functions meet it. */
  const writingBackStep = (activityId: string, events: string[], loadedGeneration = 1) => {
    const now = new Date();
    return stepContext(
      {
        activityId,
        now,
        spec: {},
        status: {
          conditions: enterPhase(undefined, Phase.WritingBack, 'test', 1, now),
          cache: { loads: 1, loadedGeneration },
        },
        deps: { redis, pool: sql },
      },
      events,
    );
  };

  /** A one-SKU sale loaded at generation 1, in a WritingBack pass that loaded `loadedGeneration`. */
  const openSaleWritingBack = async (prefix: string, loadedGeneration = 1) => {
    const id = uniqueId(prefix);
    await loadOpenSale(redis, id, [{ skuId: 'v', name: 'v', price: '1.00', stock: 5, limitPerUser: 1 }]);
    const events: string[] = [];
    return { id, events, ctx: writingBackStep(id, events, loadedGeneration) };
  };

  async function context(activityId: string, r: Redis, events: string[] = []): Promise<ReconcileContext> {
    const now = new Date();
    const fsa = {
      apiVersion: 'flashsale.io/v1alpha1',
      kind: 'FlashSaleActivity',
      metadata: { name: activityId, namespace: 'default', generation: 1, uid: activityId },
      spec: {},
      status: { conditions: enterPhase(undefined, Phase.WritingBack, 'test', 1, now) },
    } as unknown as FlashSaleActivity;
    const log = createLogger('write-back-test', 'silent');
    const deps = {
      redis: r,
      pool: sql,
      identity: 'write-back-test',
      now: () => now,
      log,
      events: {
        record: async (_fsa: unknown, type: string, reason: string) => {
          events.push(`${type} ${reason}`);
        },
      },
    } as unknown as ReconcileDeps;
    const ctx = new ReconcileContext(deps, fsa, activityId, {} as EffectiveSchedule, log);
    // The claim-id step ran first in a real pass: this resource owns its activity id.
    ctx.ownsActivityId = true;
    return ctx;
  }

  test(
    'the gate is frozen before the stock snapshot is read; the snapshot is the frozen stock; a repeat or a second writer writes nothing',
    async () => {
      const id = uniqueId('wb');
      await loadOpenSale(
        redis,
        id,
        [{ skuId: 's', name: 'item', price: '1.00', stock: 10, limitPerUser: 3 }],
        { reopenOnRelease: true },
      );
      await reserve(redis, {
        activityId: id,
        userId: 'u',
        skuId: 's',
        quantity: 3,
        requestId: 'r',
        traceId: 't',
      });

      const rec = recording(redis);
      const ctx = await context(id, rec.redis);
      await writeBack(ctx);
      const freeze = rec.calls.indexOf('fs_setGate');
      const firstRead = rec.calls.findIndex((c) => c === 'smembers' || c === 'pipeline' || c === 'hmget');
      expect(freeze).toBeGreaterThanOrEqual(0);
      expect(firstRead).toBeGreaterThan(freeze);
      expect((await readMeta(redis, id))?.gate).toBe('frozen');
      expect(await readStockRows(sql, id)).toEqual([{ skuId: 's', initial: 10, remaining: 7 }]);
      expect(await readWriteBack(sql, id)).toMatchObject({ remainingTotal: 7, reservedTotal: 3 });

      // A repeat (the operator killed after writing) finds the fence and reads no stock at all.
      const again = recording(redis);
      await writeBack(await context(id, again.redis));
      expect(again.calls).not.toContain('fs_setGate');
      expect(await readStockRows(sql, id)).toEqual([{ skuId: 's', initial: 10, remaining: 7 }]);
      // The fence itself: a second write (a concurrent operator that read no fence) writes nothing.
      const second = await writeBackStock(sql, {
        activityId: id,
        generation: 1,
        skus: [{ skuId: 's', initial: 10, remaining: 10 }],
        reserved: 0,
        released: 0,
        orders: 0,
        writtenBy: 'another-operator',
      });
      expect(second).toEqual({ written: false, trimmed: 0 });
      expect(await readStockRows(sql, id)).toEqual([{ skuId: 's', initial: 10, remaining: 7 }]);
      expect(await readWriteBack(sql, id)).toMatchObject({ remainingTotal: 7 });
    },
    TIMEOUT_MS,
  );

  test(
    'units Redis counts beyond PostgreSQL (it forgot reservations) are not written back; the truth is never cut',
    async () => {
      const id = uniqueId('wb-trim');
      const buy = await openSaleWithBuyer(id, ['a', 'b']);
      // a: 4 units sold and in PostgreSQL, then Redis forgets 3 of them (as a failover to a replica
      // that missed them does): it counts 4 left where PostgreSQL has 1.
      await buy('a', ['a1', 'a2', 'a3', 'a4']);
      await redis.hincrby(activityKeys(id).sku('a'), 'stock', 3);
      // b: 3 sold, one of them closed and its unit not returned to Redis yet (held in the snapshot,
      // returned through PostgreSQL after the write-back): Redis' 2 are right, 5 - 2 live = 3 is
      // only an upper bound, and nothing is cut.
      await buy('b', ['b1', 'b2', 'b3']);
      await sql.query(
        `UPDATE orders SET status = 'CLOSED', close_reason = 'CANCELLED', closed_at = now()
          WHERE activity_id = $1 AND user_id = 'b1'`,
        [id],
      );

      const events: string[] = [];
      const ctx = await context(id, redis, events);
      await writeBack(ctx);
      expect(await readStockRows(sql, id)).toEqual([
        { skuId: 'a', initial: 5, remaining: 1 },
        { skuId: 'b', initial: 5, remaining: 2 },
      ]);
      expect(await readWriteBack(sql, id)).toMatchObject({ remainingTotal: 3, trimmedTotal: 3 });
      expect(ctx.status.writeBack).toMatchObject({ remaining: 3, trimmed: 3 });
      expect(events).toEqual(['Normal WroteBack', 'Warning StockTrimmed']);
    },
    TIMEOUT_MS,
  );
  test(
    "a closed order's unit returned after the write-back does not take the stock above PostgreSQL's unsold units",
    async () => {
      const id = uniqueId('wb-return');
      const buy = await openSaleWithBuyer(id, ['c', 'd']);
      const closeUnreturned = (user: string): Promise<unknown> =>
        sql.query(
          `UPDATE orders SET status = 'CLOSED', close_reason = 'PAYMENT_TIMEOUT', closed_at = now()
            WHERE activity_id = $1 AND user_id = $2`,
          [id, user],
        );
      // c: 4 sold, Redis forgets 3 of them (it counts 4 left), and one of the 4 orders is closed,
      // its unit not returned yet: 5 - 3 live = 2 units are PostgreSQL's to sell.
      const [c1] = await buy('c', ['c1', 'c2', 'c3', 'c4']);
      await redis.hincrby(activityKeys(id).sku('c'), 'stock', 3);
      await closeUnreturned('c1');
      // d: the same without the forgetting: Redis' 2 are right and the return makes them 3.
      const [d1] = await buy('d', ['d1', 'd2', 'd3']);
      await closeUnreturned('d1');

      const ctx = await context(id, redis);
      await writeBack(ctx);
      expect(await readStockRows(sql, id)).toEqual([
        { skuId: 'c', initial: 5, remaining: 2 },
        { skuId: 'd', initial: 5, remaining: 2 },
      ]);
      expect(await readWriteBack(sql, id)).toMatchObject({ trimmedTotal: 2 });

      // The settler returns both closed orders' units through PostgreSQL (Redis is frozen).
      const deps = {
        pool: sql,
        redis,
        logger: createLogger('write-back-test', 'silent'),
        paymentTimeoutSeconds: 900,
      };
      const closed = await Promise.all([c1!, d1!].map((r) => findLifecycleByReservationId(sql, r)));
      expect(
        await settleStock(
          deps,
          closed.map((o) => o!),
        ),
      ).toMatchObject({ postgres: 2, deferred: 0 });
      expect(await readStockRows(sql, id)).toEqual([
        { skuId: 'c', initial: 5, remaining: 2 },
        { skuId: 'd', initial: 5, remaining: 3 },
      ]);
      // The unit left out is counted with the write-back's, and in the order's journal entry.
      expect(await readWriteBack(sql, id)).toMatchObject({ trimmedTotal: 3 });
      const journal = await sql.query<{ detail: Record<string, unknown> }>(
        `SELECT detail FROM order_journal WHERE reservation_id = $1 AND event = 'STOCK_RETURNED'`,
        [c1],
      );
      expect(journal.rows.map((r) => r.detail)).toEqual([
        expect.objectContaining({ via: 'postgres', trimmed: 1 }),
      ]);
      // A repeat settles nothing twice.
      expect(
        await settleStock(
          deps,
          closed.map((o) => o!),
        ),
      ).toMatchObject({ postgres: 0 });
      expect(await readStockRows(sql, id)).toEqual([
        { skuId: 'c', initial: 5, remaining: 2 },
        { skuId: 'd', initial: 5, remaining: 3 },
      ]);
    },
    TIMEOUT_MS,
  );

  test(
    'the write-back marks, in its transaction, the closed orders whose reservation a payment holds PAID; a repeat marks nothing',
    async () => {
      const id = uniqueId('wb-held');
      const buy = await openSaleWithBuyer(id, ['e']);
      const [held, returned, cancelled] = await buy('e', ['e1', 'e2', 'e3']);
      await sql.query(
        `UPDATE orders SET status = 'CLOSED', closed_at = now(),
                close_reason = CASE user_id WHEN 'e3' THEN 'CANCELLED' ELSE 'PAYMENT_TIMEOUT' END
          WHERE activity_id = $1`,
        [id],
      );
      // e1: a payment in time took the unit (reclaimPaid-5.lua) and its transaction died. e2: its
      // unit released. e3: cancelled by its buyer, its reservation PAID (no payment can reopen it).
      await reclaimPaid(redis, {
        activityId: id,
        reservationId: held!,
        userId: 'e1',
        skuId: 'e',
        quantity: 1,
      });
      await release(redis, {
        activityId: id,
        reservationId: returned!,
        userId: 'e2',
        skuId: 'e',
        reason: 'T',
      });
      await redis.hset(activityKeys(id).reservation(cancelled!), 'state', 'PAID');

      await writeBack(await context(id, redis));
      expect(await readStockRows(sql, id)).toEqual([{ skuId: 'e', initial: 5, remaining: 3 }]);
      const orders = async () =>
        Promise.all(
          [held!, returned!, cancelled!].map(async (r) => {
            const o = (await findLifecycleByReservationId(sql, r))!;
            return [o.unitHeldForPayment, o.stockReturnVia];
          }),
        );
      expect(await orders()).toEqual([
        [true, 'unresolved'],
        [false, null],
        [false, null],
      ]);
      const journal = async () =>
        (
          await sql.query<{ reservation_id: string }>(
            `SELECT reservation_id FROM order_journal WHERE activity_id = $1 AND event = 'STOCK_HELD_FOR_PAYMENT'`,
            [id],
          )
        ).rows.map((r) => r.reservation_id);
      expect(await journal()).toEqual([held]);
      // A repeat (an operator killed after the commit) finds the fence: nothing marked twice.
      await writeBack(await context(id, redis));
      expect(await journal()).toEqual([held]);
    },
    TIMEOUT_MS,
  );

  test(
    "a stock bucket's keys lost before the write-back fail the activity CacheLost, not a write-back retried for ever",
    async () => {
      const id = uniqueId('wb-bucket-lost');
      const [, lost] = await loadBucketedSale(redis, id, 40);
      // Its node restarted without its data: every key of that bucket is gone.
      await redis.del(lost!.meta);
      const events: string[] = [];
      const ctx = writingBackStep(id, events);
      await detectFailure(ctx);
      expect(ctx.transitioned).toBe(true);
      const failed = ctx.status.conditions?.filter((c) => c.reason === 'CacheLost') ?? [];
      expect(failed.length).toBeGreaterThan(0);
      for (const c of failed)
        expect(c.message).toMatch(/1 stock bucket\(s\) of activity .* lost their Redis keys/);
      expect(events).toEqual(['Failed']);
      expect(await readWriteBack(sql, id)).toBeUndefined();
    },
    TIMEOUT_MS,
  );
  test(
    'a cache that vanishes between detect-failure and the write-back in one pass fails CacheLost, not a clean-up with nothing written back',
    async () => {
      const { id, events, ctx } = await openSaleWritingBack('wb-vanished');
      // detect-failure sees the cache loaded; then Redis restarts without its data.
      expect(await detectFailure(ctx)).toEqual({ done: false });
      expect(ctx.transitioned).toBe(false);
      await redis.del(...(await redis.keys(`${activityKeys(id).prefix}*`)));
      await writeBack(ctx);
      expect(ctx.transitioned).toBe(true);
      expect(derivePhase(ctx.status.conditions)).toBe(Phase.Failed);
      expect(ctx.status.conditions?.some((c) => c.reason === 'CacheLost')).toBe(true);
      expect(events).toEqual(['Failed']);
      expect(await readWriteBack(sql, id)).toBeUndefined();
    },
    TIMEOUT_MS,
  );
  test(
    'a cache behind the loaded generation (a lagging replica promoted after the drain) fails CacheLost; nothing is frozen or written back',
    async () => {
      // Generation 1 in Redis; the operator had loaded generation 2 (a stock increase).
      const { id, events, ctx } = await openSaleWritingBack('wb-behind', 2);
      await detectFailure(ctx);
      expect(ctx.transitioned).toBe(true);
      expect(derivePhase(ctx.status.conditions)).toBe(Phase.Failed);
      const failed = ctx.status.conditions?.find((c) => c.reason === 'CacheLost');
      expect(failed?.message).toMatch(/is behind: it holds generation 1, generation 2 was loaded/);
      expect(events).toEqual(['Failed']);
      expect(await redis.hget(activityKeys(id).meta, 'gate')).toBe('open');
      expect(await readWriteBack(sql, id)).toBeUndefined();
    },
    TIMEOUT_MS,
  );
});
