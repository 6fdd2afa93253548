// The payment-timeout sweeper: two sweepers (separate pools, like two replicas) over 5,000 expired
// orders close each exactly once and return its stock exactly once; after write-back the stock
// goes to PostgreSQL exactly once; an interrupted settlement is completed once; a settlement that
// cannot be proven is flagged, never doubled.
import { cleanupActivity, setGate } from '../../../core/activity-cache.js';
import { checkCache, holdForRestore, reloadFromPostgres } from '../../../core/cache-restore.js';
import { recordActivitySkus } from '../../../core/db/activity-skus-store.js';
import { advanceRestore, beginRestore } from '../../../core/db/cache-restores-store.js';
import { ReplicaAck } from '../../../core/durable-ack.js';
import type { ReservationAck } from '../../../core/durable-ack.js';
import { findLifecycleByReservationId } from '../../../core/db/orders-store.js';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows } from '../../../core/db/stock-store.js';
import { activityKeys } from '../../../core/keys.js';
import { readReservation } from '../../../core/reservations.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase, Reason } from '../../../operator/api/v1alpha1/types.js';
import { cleanUp } from '../../../operator/reconcile/clean-up.js';
import { sweepEveryActivity } from '../../../runtime/jobs/after-sale.js';
import { sweepExpiredOrders } from '../../../runtime/jobs/payment-timeout.js';
import {
  TIMEOUT_MS,
  counters,
  countRows,
  expireAll,
  materialize,
  openActivity,
  reserveFor,
  setUp,
  testPool,
  retryTransient,
  skuStock,
  type Fixture,
  freezeAndWriteBack,
} from './fixture.js';
import { stepContext } from '../../fixtures/step-context.js';

describe('payment-timeout sweeper', () => {
  let f: Fixture;
  const replicaPools: Pool[] = [];

  beforeAll(async () => {
    f = await setUp();
    replicaPools.push(testPool(f.db.url, 3, 'sweeper-a'), testPool(f.db.url, 3, 'sweeper-b'));
  }, TIMEOUT_MS);

  afterAll(async () => {
    for (const p of replicaPools) await p.end();
    await f?.close();
  }, TIMEOUT_MS);

  const sweep = (activityId: string, pool: Pool, batchSize = 500, stockAck?: ReservationAck) =>
    retryTransient(() =>
      sweepExpiredOrders({
        ...f.deps,
        pool,
        activityId,
        batchSize,
        maxBatches: 100,
        settleGraceSeconds: 0,
        stockAck,
      }),
    );

  /** Per order: [ORDER_CLOSED rows, STOCK_RETURNED rows]; every order must show [1, 1]. */
  const journalCounts = async (activityId: string) =>
    (
      await f.pool.query<{ closed: string; returned: string; n: string }>(
        `SELECT closed, returned, count(*)::text AS n FROM (
           SELECT o.id,
                  count(*) FILTER (WHERE j.event = 'ORDER_CLOSED')::text AS closed,
                  count(*) FILTER (WHERE j.event = 'STOCK_RETURNED')::text AS returned
             FROM orders o LEFT JOIN order_journal j ON j.order_id = o.id
            WHERE o.activity_id = $1 GROUP BY o.id) x
          GROUP BY closed, returned`,
        [activityId],
      )
    ).rows.map((r) => [Number(r.closed), Number(r.returned), Number(r.n)]);

  /**
   * What the operator does when Redis came back without the activity (operator/reconcile/
   * restore-cache.ts): finds the cache empty, opens a restore and holds the cache. `resume` then
   * reloads it from PostgreSQL and opens the gate.
   */
  async function holdEmptyCache(activityId: string) {
    const check = await checkCache(f.redis, f.pool, activityId, 0);
    expect(check.kind).toBe('CacheEmpty');
    const row = await beginRestore(f.pool, activityId, 'CacheEmpty', check.divergence);
    const now = Date.now();
    const target = {
      activityId,
      epoch: row.epoch,
      generation: 1,
      startMs: now - 60_000,
      endMs: now + 3_600_000,
      requireOrderCode: false,
      reopenOnRelease: false,
      ownerUid: activityId,
    };
    await holdForRestore(f.redis, target);
    const resume = async () => {
      await advanceRestore(f.pool, activityId, row.epoch, 'detected');
      await advanceRestore(f.pool, activityId, row.epoch, 'paused');
      const reload = await reloadFromPostgres(f.redis, f.pool, target);
      await advanceRestore(f.pool, activityId, row.epoch, 'drained', reload);
      await advanceRestore(f.pool, activityId, row.epoch, 'reloaded');
      await setGate(f.redis, activityId, 'open');
    };
    return { resume };
  }

  it(
    'two sweepers at once over 5,000 expired orders: each closed once, stock returned once',
    async () => {
      const n = 5000;
      const { activityId, skuId } = await openActivity(f.redis, { stock: n });
      const users = Array.from({ length: n }, (_, i) => `sleeper-${i}`);
      const rids = await reserveFor(f.redis, activityId, skuId, users);
      await materialize(f.pool, f.redis, activityId, rids);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(0);
      expect(await expireAll(f.pool, activityId)).toBe(n);

      const [a, b] = await Promise.all([
        sweep(activityId, replicaPools[0]!),
        sweep(activityId, replicaPools[1]!),
      ]);
      // A run retried after a transient failure reports only its own part; the rows below are exact.
      expect(a.closed + b.closed).toBeLessThanOrEqual(n);
      expect(
        await countRows(
          f.pool,
          `SELECT count(*) AS n FROM orders WHERE activity_id = $1 AND status = 'CLOSED' AND stock_returned
             AND stock_return_via = 'redis' AND close_reason = 'PAYMENT_TIMEOUT'`,
          [activityId],
        ),
      ).toBe(n);
      expect(await journalCounts(activityId)).toEqual([[1, 1, n]]);
      const c = await counters(f.redis, activityId);
      expect([c.reserved, c.released]).toEqual([n, n]);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(n);
      expect(await f.redis.zcard(activityKeys(activityId).ledger)).toBe(0);

      // Sweeping again, twice at once, changes nothing.
      const again = await Promise.all([
        sweep(activityId, replicaPools[0]!),
        sweep(activityId, replicaPools[1]!),
      ]);
      expect(again.map((r) => [r.closed, r.resettled])).toEqual([
        [0, 0],
        [0, 0],
      ]);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(n);
      expect(await journalCounts(activityId)).toEqual([[1, 1, n]]);
    },
    TIMEOUT_MS,
  );

  it(
    'an order that times out while the cache is restored is settled once the restore has resumed, its unit back once',
    async () => {
      const item = { skuId: 'sku-1', name: '秒杀商品 flash item', price: '19.90', stock: 3, limitPerUser: 1 };
      const { activityId, skuId } = await openActivity(f.redis, { stock: item.stock }, f.pool);
      await recordActivitySkus(f.pool, activityId, [item], 'spec');
      const [late, keeper] = await reserveFor(f.redis, activityId, skuId, ['late', 'keeper']);
      await materialize(f.pool, f.redis, activityId, [late!, keeper!]);

      // Redis loses the activity mid-sale; the operator opens a restore and holds the cache.
      const k = activityKeys(activityId);
      await f.redis.del(...(await f.redis.keys(k.scanPattern)));
      const restore = await holdEmptyCache(activityId);

      // One order times out meanwhile: closed, its unit's return waits for the restore.
      await f.pool.query(
        `UPDATE orders SET expires_at = now() - interval '1 second' WHERE reservation_id = $1`,
        [late],
      );
      const during = await sweep(activityId, f.pool);
      expect(during.closed).toBe(1);
      expect(during.settled).toMatchObject({ redis: 0, unresolved: 0 });
      expect(during.settled.deferred).toBeGreaterThan(0);
      expect(await findLifecycleByReservationId(f.pool, late!)).toMatchObject({
        status: 'CLOSED',
        stockReturnVia: null,
      });

      // The restore reloads (the closed order's unit is free, its reservation RELEASED) and resumes.
      await restore.resume();
      expect(await skuStock(f.redis, activityId, skuId)).toBe(2);

      const after = await sweep(activityId, f.pool);
      expect(after.settled).toMatchObject({ redis: 1, unresolved: 0, deferred: 0 });
      expect(await findLifecycleByReservationId(f.pool, late!)).toMatchObject({ stockReturnVia: 'redis' });
      // Once: the reload had counted it free already, the release finds it RELEASED.
      expect(await skuStock(f.redis, activityId, skuId)).toBe(2);
      expect((await readReservation(f.redis, activityId, late!))?.state).toBe('RELEASED');
    },
    TIMEOUT_MS,
  );

  it(
    'a release attempted just before Redis lost the sale (no restore opened yet) is deferred, not flagged; settled once after the restore',
    async () => {
      const item = { skuId: 'sku-1', name: '秒杀商品 flash item', price: '19.90', stock: 3, limitPerUser: 1 };
      const { activityId, skuId } = await openActivity(f.redis, { stock: item.stock }, f.pool);
      await recordActivitySkus(f.pool, activityId, [item], 'spec');
      const [lost, keeper] = await reserveFor(f.redis, activityId, skuId, ['lost', 'keeper']);
      const ids = await materialize(f.pool, f.redis, activityId, [lost!, keeper!]);
      // The order timed out and its release was attempted; Redis went away before it answered,
      // and came back empty. The operator has not noticed yet: no restore is open.
      await f.pool.query(
        `UPDATE orders SET status = 'CLOSED', closed_at = now(), close_reason = 'PAYMENT_TIMEOUT',
                stock_release_attempted_at = now() WHERE id = $1`,
        [ids.get(lost!)],
      );
      const k = activityKeys(activityId);
      await f.redis.del(...(await f.redis.keys(k.scanPattern)));

      const before = await sweep(activityId, f.pool);
      expect(before.resettled).toBe(1);
      expect(before.settled).toEqual({ redis: 0, postgres: 0, unresolved: 0, withheld: 0, deferred: 1 });
      expect(await findLifecycleByReservationId(f.pool, lost!)).toMatchObject({
        status: 'CLOSED',
        stockReturnVia: null,
      });

      // The restore rebuilds the cache from PostgreSQL (the closed order's unit free) and resumes.
      await (await holdEmptyCache(activityId)).resume();

      const after = await sweep(activityId, f.pool);
      expect(after.settled).toMatchObject({ redis: 1, unresolved: 0, deferred: 0 });
      expect(await findLifecycleByReservationId(f.pool, lost!)).toMatchObject({ stockReturnVia: 'redis' });
      expect(await skuStock(f.redis, activityId, skuId)).toBe(2);
    },
    TIMEOUT_MS,
  );

  it(
    'a stock return the replicas do not confirm is not recorded; the next sweep settles it, the unit back once',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 5 });
      const rids = await reserveFor(f.redis, activityId, skuId, ['unconfirmed-1', 'unconfirmed-2']);
      await materialize(f.pool, f.redis, activityId, rids);
      await expireAll(f.pool, activityId);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(3);

      // RESERVE_ACK=replica with one replica required; this Redis has none, so no WAIT confirms.
      const unconfirmed = new ReplicaAck(f.redis, 1, 50);
      const first = await sweep(activityId, f.pool, 500, unconfirmed);
      expect(first.closed).toBe(2);
      expect(first.settled).toMatchObject({ redis: 0, unresolved: 0 });
      expect(first.settled.deferred).toBeGreaterThanOrEqual(2);
      // Released on the primary, not recorded: a failover that lost the release leaves the
      // reservation RESERVED for the next release.
      expect(
        await countRows(
          f.pool,
          `SELECT count(*) AS n FROM orders WHERE activity_id = $1 AND status = 'CLOSED' AND stock_return_via IS NULL`,
          [activityId],
        ),
      ).toBe(2);

      // Confirmed (here: the primary's answer is enough): settled, and the units came back once.
      const next = await sweep(activityId, f.pool);
      expect(next.settled).toMatchObject({ redis: 2, deferred: 0 });
      expect(await skuStock(f.redis, activityId, skuId)).toBe(5);
      expect(await journalCounts(activityId)).toEqual([[1, 1, 2]]);
    },
    TIMEOUT_MS,
  );

  it(
    'after write-back (frozen cache) the stock goes to PostgreSQL, exactly once, and Redis stays frozen',
    async () => {
      const n = 120;
      const initial = 150;
      const { activityId, skuId } = await openActivity(f.redis, { stock: initial });
      const rids = await reserveFor(
        f.redis,
        activityId,
        skuId,
        Array.from({ length: n }, (_, i) => `late-${i}`),
      );
      await materialize(f.pool, f.redis, activityId, rids);
      await freezeAndWriteBack(f, activityId, n);
      expect((await readStockRows(f.pool, activityId))[0]?.remaining).toBe(initial - n);
      await expireAll(f.pool, activityId);

      const [a, b] = await Promise.all([
        sweep(activityId, replicaPools[0]!, 20),
        sweep(activityId, replicaPools[1]!, 20),
      ]);
      expect(a.closed + b.closed).toBeLessThanOrEqual(n);
      expect(
        await countRows(
          f.pool,
          `SELECT count(*) AS n FROM orders WHERE activity_id = $1 AND stock_returned AND stock_return_via = 'postgres'`,
          [activityId],
        ),
      ).toBe(n);
      expect((await readStockRows(f.pool, activityId))[0]?.remaining).toBe(initial);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(initial - n);
      expect(await journalCounts(activityId)).toEqual([[1, 1, n]]);
      await Promise.all([sweep(activityId, replicaPools[0]!), sweep(activityId, replicaPools[1]!)]);
      expect((await readStockRows(f.pool, activityId))[0]?.remaining).toBe(initial);
    },
    TIMEOUT_MS,
  );

  it(
    'cleanup waits for a release attempted before the freeze to be proven: the sweeper reads its reservation first, and the unit goes back to PostgreSQL, not flagged',
    async () => {
      const initial = 5;
      const { activityId, skuId } = await openActivity(f.redis, { stock: initial });
      const [failed, keeper] = await reserveFor(f.redis, activityId, skuId, ['failed', 'keeper']);
      const ids = await materialize(f.pool, f.redis, activityId, [failed!, keeper!]);
      // The relay's part: the half messages are in Kafka.
      const outbox = activityKeys(activityId).outbox;
      await f.redis.xdel(outbox, ...(await f.redis.xrange(outbox, '-', '+')).map(([id]) => id));
      // Closed while draining; its release was attempted and failed without running (Redis at its
      // maxmemory, a timeout): the reservation is still RESERVED when the gate freezes.
      await f.pool.query(
        `UPDATE orders SET status = 'CLOSED', closed_at = now(), close_reason = 'PAYMENT_TIMEOUT',
                stock_release_attempted_at = now() WHERE id = $1`,
        [ids.get(failed!)],
      );
      await freezeAndWriteBack(f, activityId, 2);
      expect((await readStockRows(f.pool, activityId))[0]?.remaining).toBe(initial - 2);

      // The operator's next pass would clean up: it waits, the reservation still to be read.
      const events: string[] = [];
      const now = new Date();
      const cleaning = () =>
        stepContext(
          {
            activityId,
            now,
            spec: { cleanup: { policy: 'Delete', resultRetention: '15m' } },
            status: {
              conditions: enterPhase(undefined, Phase.CleaningUp, 'test', 1, now),
              timestamps: { warmingUp: now.toISOString() },
            },
            deps: { redis: f.redis, pool: f.pool, config: { cleanupRetryMs: 5_000 } },
          },
          events,
        );
      const blocked = cleaning();
      await cleanUp(blocked);
      expect([blocked.degraded?.reason, blocked.transitioned]).toEqual([Reason.CleanupBlocked, false]);
      expect(blocked.degraded?.message).toMatch(/1 closed order\(s\) whose stock release was attempted/);
      expect((await readReservation(f.redis, activityId, failed!))?.state).toBe('RESERVED');

      // The sweeper reads it RESERVED under the frozen gate: held by the snapshot, back in PostgreSQL.
      const r = await sweep(activityId, f.pool);
      expect(r.settled).toMatchObject({ postgres: 1, unresolved: 0 });
      const done = cleaning();
      await cleanUp(done);
      expect([done.degraded, done.transitioned]).toEqual([undefined, true]);
      expect((await readStockRows(f.pool, activityId))[0]?.remaining).toBe(initial - 1);
    },
    TIMEOUT_MS,
  );

  it(
    'after write-back a Redis back from before the freeze (gate not frozen) is not released into: the stock goes to PostgreSQL',
    async () => {
      const initial = 10;
      const { activityId, skuId } = await openActivity(f.redis, { stock: initial });
      const rids = await reserveFor(f.redis, activityId, skuId, ['old-1', 'old-2']);
      await materialize(f.pool, f.redis, activityId, rids);
      await freezeAndWriteBack(f, activityId, 2);
      expect((await readStockRows(f.pool, activityId))[0]?.remaining).toBe(initial - 2);
      // Redis restarts from a snapshot taken before the freeze: the gate reads `closed` again.
      await f.redis.hset(activityKeys(activityId).meta, 'gate', 'closed');
      await expireAll(f.pool, activityId);

      const r = await sweep(activityId, f.pool);
      expect(r.closed).toBe(2);
      expect(r.settled).toMatchObject({ postgres: 2, redis: 0, unresolved: 0 });
      expect((await readStockRows(f.pool, activityId))[0]?.remaining).toBe(initial);
      // Nothing was released into the stale cache.
      expect(await skuStock(f.redis, activityId, skuId)).toBe(initial - 2);
    },
    TIMEOUT_MS,
  );

  it(
    'a guard closure whose settlement a crash interrupted is re-driven by the sweep with its unit withheld',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 10 });
      const rids = await reserveFor(f.redis, activityId, skuId, ['guarded-1', 'guarded-2']);
      await materialize(f.pool, f.redis, activityId, rids);
      // The consumer's guard closed both in its insert transaction and was killed before settling.
      await f.pool.query(
        `UPDATE orders SET status = 'CLOSED', closed_at = now(),
                close_reason = CASE WHEN user_id = 'guarded-1' THEN 'OVERSELL_PREVENTED' ELSE 'BUYER_LIMIT_EXCEEDED' END
          WHERE activity_id = $1`,
        [activityId],
      );
      // The sale gives a released slot back (reopenOnRelease), so the two closures differ there.
      const k = activityKeys(activityId);
      await f.redis.hset(k.meta, 'reopen', '1');
      const r = await sweep(activityId, f.pool);
      expect([r.closed, r.resettled]).toEqual([0, 2]);
      expect(r.settled).toEqual({ redis: 0, postgres: 0, unresolved: 0, withheld: 2, deferred: 0 });
      expect(await skuStock(f.redis, activityId, skuId)).toBe(8);
      expect((await counters(f.redis, activityId)).released ?? 0).toBe(0);
      // Both reservations released; the limit closure keeps its buyer's slot, the other frees it.
      for (const rid of rids)
        expect((await readReservation(f.redis, activityId, rid))?.state).toBe('RELEASED');
      expect(await f.redis.hget(k.buyer('guarded-1'), `${skuId}:slot:1`)).toBeNull();
      expect(await f.redis.hget(k.buyer('guarded-2'), `${skuId}:slot:1`)).toBe(rids[1]);
      expect((await sweep(activityId, f.pool)).resettled).toBe(0);
    },
    TIMEOUT_MS,
  );

  it(
    'an order closed but not settled (crash in between) is settled once by the next sweep; unprovable ones are flagged',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 10 });
      const rids = await reserveFor(f.redis, activityId, skuId, ['crash-1', 'crash-2', 'crash-3']);
      const ids = await materialize(f.pool, f.redis, activityId, rids);
      // Crash after the close committed, before any stock return (the state a killed sweeper leaves).
      await f.pool.query(
        `UPDATE orders SET status = 'CLOSED', closed_at = now(), close_reason = 'PAYMENT_TIMEOUT' WHERE activity_id = $1`,
        [activityId],
      );
      // Order 2: a Redis release happened before the crash, the database never heard of it.
      const { release } = await import('../../../core/reservations.js');
      await f.pool.query(`UPDATE orders SET stock_release_attempted_at = now() WHERE id = $1`, [
        ids.get(rids[1]!),
      ]);
      await release(f.redis, {
        activityId,
        reservationId: rids[1]!,
        userId: 'crash-2',
        skuId,
        reason: 'PAYMENT_TIMEOUT',
      });
      // Order 3: a release was attempted, then the cache was frozen, written back and cleaned up.
      await f.pool.query(`UPDATE orders SET stock_release_attempted_at = now() WHERE id = $1`, [
        ids.get(rids[2]!),
      ]);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(8);

      const r = await sweep(activityId, f.pool);
      expect([r.closed, r.resettled]).toEqual([0, 3]);
      expect(r.settled).toEqual({ redis: 3, postgres: 0, unresolved: 0, withheld: 0, deferred: 0 });
      expect(await skuStock(f.redis, activityId, skuId)).toBe(10);
      expect((await counters(f.redis, activityId)).released).toBe(3);

      // The unprovable case, on a second activity whose cache is gone after write-back.
      const other = await openActivity(f.redis, { stock: 5 });
      const [rid] = await reserveFor(f.redis, other.activityId, other.skuId, ['gone-1']);
      const [rid2] = await reserveFor(f.redis, other.activityId, other.skuId, ['gone-2']);
      const oids = await materialize(f.pool, f.redis, other.activityId, [rid!, rid2!]);
      await freezeAndWriteBack(f, other.activityId, 2);
      await f.pool.query(
        `UPDATE orders SET status = 'CLOSED', closed_at = now(), close_reason = 'PAYMENT_TIMEOUT' WHERE activity_id = $1`,
        [other.activityId],
      );
      await f.pool.query(`UPDATE orders SET stock_release_attempted_at = now() WHERE id = $1`, [
        oids.get(rid!),
      ]);
      await f.redis.del(
        activityKeys(other.activityId).reservation(rid!),
        activityKeys(other.activityId).reservation(rid2!),
      );
      const r2 = await sweep(other.activityId, f.pool);
      // gone-1: a release may have reached Redis before the freeze: flagged, not returned.
      // gone-2: no release was ever attempted: certainly held in the snapshot, returned in PostgreSQL.
      expect(r2.settled).toEqual({ redis: 0, postgres: 1, unresolved: 1, withheld: 0, deferred: 0 });
      expect((await readStockRows(f.pool, other.activityId))[0]?.remaining).toBe(5 - 2 + 1);
      const via = await f.pool.query<{ id: string; v: string; r: boolean }>(
        `SELECT id, stock_return_via AS v, stock_returned AS r FROM orders WHERE activity_id = $1 ORDER BY id`,
        [other.activityId],
      );
      expect(via.rows.map((x) => [x.v, x.r])).toEqual([
        ['unresolved', false],
        ['postgres', true],
      ]);
      const r3 = await sweep(other.activityId, f.pool);
      expect(r3.resettled).toBe(0);
    },
    TIMEOUT_MS,
  );

  it(
    'a release that meets the freeze is returned in PostgreSQL once written back, even after cleanup deleted its reservation',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 5 });
      const [rid] = await reserveFor(f.redis, activityId, skuId, ['meets-freeze']);
      await materialize(f.pool, f.redis, activityId, [rid!]);
      await expireAll(f.pool, activityId);
      // The operator freezes the gate between the sweeper's read of it (open) and its release,
      // which is answered FROZEN: the sweeper had recorded the attempt, and the write-back has
      // not committed, so the return to PostgreSQL waits.
      const freezing = new Proxy(f.redis, {
        get(target, prop, receiver) {
          const v: unknown = Reflect.get(target, prop, receiver);
          if (prop === 'fs_release' && typeof v === 'function')
            return async (...args: unknown[]) => {
              await setGate(target, activityId, 'frozen');
              return (v as (...a: unknown[]) => unknown).apply(target, args);
            };
          return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
        },
      });
      const first = await retryTransient(() =>
        sweepExpiredOrders({
          ...f.deps,
          redis: freezing,
          pool: f.pool,
          activityId,
          batchSize: 500,
          maxBatches: 100,
          settleGraceSeconds: 0,
        }),
      );
      expect(first.closed).toBe(1);
      // Deferred (by the close and again by the same sweep's pass over unsettled orders).
      expect(first.settled).toMatchObject({ redis: 0, postgres: 0, unresolved: 0, withheld: 0 });
      expect(first.settled.deferred).toBeGreaterThan(0);
      expect(await findLifecycleByReservationId(f.pool, rid!)).toMatchObject({
        status: 'CLOSED',
        stockReturnVia: null,
      });
      expect((await readReservation(f.redis, activityId, rid!))?.state).toBe('RESERVED');

      // The write-back commits (the unit held in its snapshot), and cleanup deletes every key.
      await freezeAndWriteBack(f, activityId, 1);
      expect((await readStockRows(f.pool, activityId))[0]?.remaining).toBe(4);
      await f.redis.del(activityKeys(activityId).outbox); // the relay had sent the order
      await cleanupActivity(f.redis, activityId, 60);
      expect(await readReservation(f.redis, activityId, rid!)).toBeUndefined();

      const second = await sweep(activityId, f.pool);
      expect(second.settled).toEqual({ redis: 0, postgres: 1, unresolved: 0, withheld: 0, deferred: 0 });
      expect(await findLifecycleByReservationId(f.pool, rid!)).toMatchObject({ stockReturnVia: 'postgres' });
      expect((await readStockRows(f.pool, activityId))[0]?.remaining).toBe(5);
      expect((await sweep(activityId, f.pool)).resettled).toBe(0);
    },
    TIMEOUT_MS,
  );

  it(
    'the platform sweeper: an activity whose Redis fails is retried next run; the activities after it are swept all the same',
    async () => {
      const broken = await openActivity(f.redis, { stock: 3 });
      const healthy = await openActivity(f.redis, { stock: 3 });
      for (const a of [broken, healthy]) {
        const rids = await reserveFor(f.redis, a.activityId, a.skuId, [`plat-${a.activityId}`]);
        await materialize(f.pool, f.redis, a.activityId, rids);
        await expireAll(f.pool, a.activityId);
      }
      // Every command on the broken activity's keys fails, as when its Cluster slot is unreachable.
      const tag = `{${broken.activityId}}`;
      const redis = new Proxy(f.redis, {
        get(target, prop, receiver) {
          const v: unknown = Reflect.get(target, prop, receiver);
          if (typeof v !== 'function') return v;
          return (...args: unknown[]) => {
            if (args.some((a) => typeof a === 'string' && a.includes(tag)))
              return Promise.reject(new Error('CLUSTERDOWN The cluster is down'));
            return (v as (...a: unknown[]) => unknown).apply(target, args);
          };
        },
      });
      const cfg = {
        PAYMENT_TIMEOUT_SECONDS: 900,
        PAYMENT_SWEEP_CRON: '* * * * *',
        PAYMENT_SWEEP_BATCH_SIZE: 500,
        PAYMENT_SWEEP_MAX_BATCHES: 100,
        STOCK_SETTLE_GRACE_SECONDS: 0,
      };
      const run = await sweepEveryActivity({ ...f.deps, metrics: f.metrics, redis, cfg });
      expect(run.failed).toEqual([broken.activityId]);
      expect(run.swept).toContain(healthy.activityId);
      const settled = async (activityId: string) =>
        (
          await f.pool.query<{ status: string; via: string | null }>(
            `SELECT status, stock_return_via AS via FROM orders WHERE activity_id = $1`,
            [activityId],
          )
        ).rows;
      expect(await settled(healthy.activityId)).toEqual([{ status: 'CLOSED', via: 'redis' }]);
      expect(await skuStock(f.redis, healthy.activityId, healthy.skuId)).toBe(3);

      // Its Redis back, the next run sweeps it.
      const again = await sweepEveryActivity({ ...f.deps, metrics: f.metrics, cfg });
      expect(again.failed).toEqual([]);
      expect(await settled(broken.activityId)).toEqual([{ status: 'CLOSED', via: 'redis' }]);
      expect(await skuStock(f.redis, broken.activityId, broken.skuId)).toBe(3);
    },
    TIMEOUT_MS,
  );
});
