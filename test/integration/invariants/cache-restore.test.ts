// A cache restore's steps at their boundaries (core/cache-restore.ts, core/db/cache-restores-store.ts,
// ARCHITECTURE.md "a cache that came back empty or behind..."): each step repeated, as after an
// operator SIGKILL between its side effect and its recorded step, leaves exactly the same state;
// the reload writes initial − live orders − proven in-flight reservations, each order's
// reservation in the state PostgreSQL decides, and each buyer's held quantity and slots; the
// restore's step only moves forward, one open restore per activity.
import { DEFAULT_TRAFFIC_POLICY, syncDenyList } from '../../../core/traffic-policy.js';
import { Redis } from 'ioredis';
import pg from 'pg';
import {
  loadActivity,
  outboxStreams,
  readMeta,
  readOutbox,
  readStock,
  setGate,
} from '../../../core/activity-cache.js';
import {
  bucketLayout,
  completeTransfers,
  forgetBucketLayout,
  transferStock,
  unitsInFlight,
} from '../../../core/buckets.js';
import { checkCache, holdForRestore, reloadFromPostgres } from '../../../core/cache-restore.js';
import type { RestoreTarget } from '../../../core/cache-restore.js';
import { recordActivityItems } from '../../../core/db/activity-items-store.js';
import { registerActivity } from '../../../core/db/activity-registry-store.js';
import { recordActivitySkus } from '../../../core/db/activity-skus-store.js';
import {
  advanceRestore,
  beginRestore,
  lastReloadedEpoch,
  openRestore,
} from '../../../core/db/cache-restores-store.js';
import type { CacheRestoreRow } from '../../../core/db/cache-restores-store.js';
import { findLifecycleByReservationId, insertOrders } from '../../../core/db/orders-store.js';
import type { LifecycleOrderRow } from '../../../core/db/orders-store.js';
import type { Pool } from '../../../core/db/pool.js';
import { activityKeys, homeBucket } from '../../../core/keys.js';
import type { CatalogItem, OrderMessage } from '../../../core/model.js';
import type { LifecycleDeps } from '../../../core/order-lifecycle.js';
import { cancelReservation, closeOrder, settleStock } from '../../../core/order-lifecycle.js';
import {
  orderMessageOf,
  readReservation,
  reclaimPaid,
  release,
  reserve,
} from '../../../core/reservations.js';
import { registerScripts, runScript } from '../../../core/scripts.js';
import { createLogger } from '../../../core/logger.js';
import { createOperatorMetrics } from '../../../core/metrics.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import type { EffectiveSchedule } from '../../../operator/api/v1alpha1/funcs.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import type { OperatorConfig } from '../../../operator/config.js';
import { ReconcileContext } from '../../../operator/reconcile/context.js';
import type { ReconcileDeps } from '../../../operator/reconcile/context.js';
import { restoreCache } from '../../../operator/reconcile/restore-cache.js';
import { acceptPayment } from '../../../runtime/payments/apply.js';
import { waitFor } from '../../../dev/roles.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

describe('cache restore steps (core/cache-restore.ts)', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let redis: Redis;

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 3 });
    registerScripts(redis);
  });

  afterAll(async () => {
    redis?.disconnect();
    await sql?.end();
    await db?.drop();
  });

  /**
   * A sale open from a minute ago for an hour: its items recorded in PostgreSQL as the operator's
   * sync-spec records them, then loaded into Redis at generation 1 and opened.
   */
  const openSale = async (
    id: string,
    items: CatalogItem[],
    settings = { requireOrderCode: false, reopenOnRelease: true },
  ): Promise<{ start: Date; end: Date }> => {
    const start = new Date(Date.now() - 60_000);
    const end = new Date(Date.now() + 3_600_000);
    await recordActivityItems(sql, id, 1, items);
    await recordActivitySkus(sql, id, items, 'spec');
    await loadActivity(redis, { id, generation: 1, startAt: start, endAt: end, ...settings, items });
    await setGate(redis, id, 'open');
    return { start, end };
  };

  /** Every key of the activity (its stock buckets' too) with its whole value, for comparing two states. */
  async function snapshot(activityId: string): Promise<Record<string, unknown>> {
    const out: Record<string, unknown> = {};
    const k = activityKeys(activityId);
    const keys = [...(await redis.keys(k.scanPattern)), ...(await redis.keys(k.bucketScanPattern))].sort();
    for (const key of keys) {
      const type = await redis.type(key);
      if (type === 'hash') {
        const h = await redis.hgetall(key);
        delete h.restoredAt; // the Redis clock at the first reload
        out[key] = h;
      } else if (type === 'set') out[key] = (await redis.smembers(key)).sort();
      else if (type === 'zset') out[key] = await redis.zrange(key, 0, -1, 'WITHSCORES');
      else out[key] = type;
    }
    return out;
  }

  test('repeated steps change nothing more; the reload is exactly what PostgreSQL proves', async () => {
    const id = uniqueId('rst');
    const items: CatalogItem[] = [
      { skuId: 'a', name: '汤圆', price: '5.00', stock: 10, limitPerUser: 2 },
      { skuId: 'b', name: '月饼', price: '8.00', stock: 3, limitPerUser: 1 },
    ];
    const { start, end } = await openSale(id, items);
    const msg = (rid: string, user: string, sku: string, qty: number, slot: number): OrderMessage => ({
      reservationId: rid,
      activityId: id,
      userId: user,
      skuId: sku,
      quantity: qty,
      slot,
      unitPrice: sku === 'a' ? '5.00' : '8.00',
      itemName: sku === 'a' ? '汤圆' : '月饼',
      reservedAt: Date.now(),
      traceId: 't',
      requestId: rid,
    });
    // u1 holds 2 of a in two slots, u2 1 of a and 1 of b, u3 had 1 of b closed.
    await insertOrders(
      sql,
      [
        msg('r1', 'u1', 'a', 1, 1),
        msg('r2', 'u1', 'a', 1, 2),
        msg('r3', 'u2', 'a', 1, 1),
        msg('r4', 'u2', 'b', 1, 1),
        msg('r5', 'u3', 'b', 1, 1),
      ],
      900,
    );
    await sql.query(
      `UPDATE orders SET status = 'CLOSED', close_reason = 'CANCELLED' WHERE reservation_id = 'r5'`,
    );

    // Healthy but never reserved in Redis: PostgreSQL holds more live units than Redis took.
    expect((await checkCache(redis, sql, id, 0, 10)).kind).toBe('CacheBehind');
    // Redis loses the activity's data.
    await redis.del(...(await redis.keys(activityKeys(id).scanPattern)));
    const check = await checkCache(redis, sql, id, 0, 10);
    expect(check.kind).toBe('CacheEmpty');

    const row = await beginRestore(sql, id, 'CacheEmpty', check.divergence);
    // Two operators (or one restarted) open the same restore, never a second one.
    expect((await beginRestore(sql, id, 'CacheEmpty', check.divergence)).epoch).toBe(row.epoch);
    expect(row.epoch).toBe(1);

    const t: RestoreTarget = {
      activityId: id,
      epoch: row.epoch,
      generation: 1,
      startMs: start.getTime(),
      endMs: end.getTime(),
      requireOrderCode: false,
      reopenOnRelease: true,
      ownerUid: 'uid-1',
    };
    expect(await holdForRestore(redis, t)).toBe('');
    expect(await holdForRestore(redis, t)).toBe('paused');
    expect((await readMeta(redis, id))?.gate).toBe('paused');
    expect(await advanceRestore(sql, id, row.epoch, 'detected')).toBe(true);
    expect(await advanceRestore(sql, id, row.epoch, 'detected')).toBe(false); // already moved
    expect(await advanceRestore(sql, id, row.epoch, 'paused')).toBe(true);

    const reload = await reloadFromPostgres(redis, sql, t);
    const first = await snapshot(id);
    // Killed after the reload, before its step was recorded: the repeat writes the same state.
    expect(await reloadFromPostgres(redis, sql, t)).toEqual(reload);
    expect(await snapshot(id)).toEqual(first);

    expect(reload).toEqual({
      skus: [
        { skuId: 'a', initial: 10, live: 3, inFlight: 0, remaining: 7 },
        { skuId: 'b', initial: 3, live: 1, inFlight: 0, remaining: 2 },
      ],
      orders: 5,
      buyers: 4,
      paidDuringReload: 0,
    });
    const k = activityKeys(id);
    const stock = await readStock(redis, id);
    expect(stock.skus.map((s) => [s.skuId, s.initial, s.remaining])).toEqual([
      ['a', 10, 7],
      ['b', 3, 2],
    ]);
    expect([stock.reserved, stock.released, stock.reservations]).toEqual([5, 1, 5]);
    expect(await redis.hgetall(k.buyer('u1'))).toEqual({ 'a:qty': '2', 'a:slot:1': 'r1', 'a:slot:2': 'r2' });
    expect(await redis.hgetall(k.buyer('u3'))).toEqual({ 'b:qty': '0' });
    expect(await redis.hget(k.reservation('r5'), 'state')).toBe('RELEASED');
    expect(await redis.hget(k.reservation('r4'), 'state')).toBe('RESERVED');
    // Still paused: nothing in the reload opens the gate; the mark is written last.
    expect(await redis.hmget(k.meta, 'gate', 'epoch', 'gen')).toEqual(['paused', '1', '1']);

    expect(await advanceRestore(sql, id, row.epoch, 'drained', reload)).toBe(true);
    expect(await lastReloadedEpoch(sql, id)).toBe(1);
    expect(await advanceRestore(sql, id, row.epoch, 'reloaded')).toBe(true);
    expect(await openRestore(sql, id)).toBeUndefined();
    await setGate(redis, id, 'open');
    // The restored cache is consistent with PostgreSQL; an older epoch would be behind.
    expect((await checkCache(redis, sql, id, 1, 10)).kind).toBe('consistent');
    expect((await checkCache(redis, sql, id, 2, 10)).kind).toBe('CacheBehind');
    // The next restore is epoch 2.
    expect((await beginRestore(sql, id, 'CacheBehind', check.divergence)).epoch).toBe(2);
  });

  test('an item added by an edit whose load did not finish is not a cache that lost anything; one the cache listed and lost is', async () => {
    const id = uniqueId('rsa');
    const items: CatalogItem[] = [{ skuId: 'old', name: '汤圆', price: '5.00', stock: 10, limitPerUser: 1 }];
    await openSale(id, items);
    // sync-spec records the new SKU, then the load is interrupted (a SIGKILL, a Redis timeout).
    await recordActivitySkus(
      sql,
      id,
      [...items, { skuId: 'new', name: '元宵', price: '6.00', stock: 4, limitPerUser: 1 }],
      'spec',
    );
    expect((await checkCache(redis, sql, id, 0, 10)).kind).toBe('consistent');
    // A SKU the cache did list, gone with nothing sold, is a cache that lost something.
    await redis.del(activityKeys(id).sku('old'));
    expect((await checkCache(redis, sql, id, 0, 10)).kind).toBe('CacheBehind');
  });

  test('a bucketed sale: healthy is never behind; an empty cache is rebuilt bucket by bucket', async () => {
    const id = uniqueId('rsb');
    const BUCKETS = 4;
    const items: CatalogItem[] = [
      { skuId: 'hot', name: '茅台', price: '1499.00', stock: 20, limitPerUser: 2, buckets: BUCKETS },
      { skuId: 'cold', name: '粽子', price: '6.00', stock: 5, limitPerUser: 1 },
    ];
    const { start, end } = await openSale(id, items);
    const k = activityKeys(id);

    /** A buyer's reservation, and (as the consumer would) its order in PostgreSQL. */
    let n = 0;
    const requestIds = new Map<string, string>();
    const buy = async (user: string, skuId: string, order = true): Promise<string | undefined> => {
      n += 1;
      try {
        const r = await reserve(redis, {
          activityId: id,
          userId: user,
          skuId,
          quantity: 1,
          requestId: `q${n}`,
          traceId: 't',
        });
        requestIds.set(r.reservationId, `q${n}`);
        const rec = await readReservation(redis, id, r.reservationId, r.scope);
        if (order) await insertOrders(sql, [orderMessageOf(id, rec!)], 900);
        return r.reservationId;
      } catch (err) {
        if (
          (err as { code?: string }).code === 'SOLD_OUT' ||
          (err as { code?: string }).code === 'LIMIT_REACHED'
        )
          return undefined;
        throw err;
      }
    };

    // Several detection passes with reservations flowing between them (orders in PostgreSQL, some
    // in flight, a stock transfer between two buckets half done): never behind.
    const kinds: string[] = [];
    let halfDone = 0;
    for (let pass = 0; pass < 4; pass += 1) {
      for (let i = 0; i < 3; i += 1) await buy(`p${pass}u${i}`, 'hot', i !== 2);
      await buy(`p${pass}c`, 'cold');
      if (pass === 3) {
        // The donor's step of a transfer only (a process killed between the two), from the
        // fullest bucket: units in no bucket's stock.
        const all = (await bucketLayout(redis, id)).bucketsOf('hot');
        const stocks = await Promise.all(
          all.map(async (b) => Number(await redis.hget(b.sku('hot'), 'stock'))),
        );
        const donor = all[stocks.indexOf(Math.max(...stocks))]!;
        const to = all.find((b) => b.index !== donor.index)!;
        const out = await runScript(
          redis,
          'transferStock',
          [donor.meta, donor.sku('hot'), donor.transfers, donor.counters],
          ['out', 'half-done', 2, to.index, 'hot'],
        );
        halfDone = Number(out[1]);
      }
      kinds.push((await checkCache(redis, sql, id, 0, 10)).kind);
    }
    expect(kinds).toEqual(['consistent', 'consistent', 'consistent', 'consistent']);

    // Redis loses everything of the activity: its own keys and every bucket's.
    const before = await readStock(redis, id);
    expect(halfDone).toBe(2);
    expect(await unitsInFlight(redis, await bucketLayout(redis, id), 'hot')).toBe(2);
    for (const pattern of [k.scanPattern, k.bucketScanPattern]) {
      const keys = await redis.keys(pattern);
      if (keys.length > 0) await redis.del(...keys);
    }
    forgetBucketLayout(id);
    const check = await checkCache(redis, sql, id, 0, 10);
    expect(check.kind).toBe('CacheEmpty');
    const row = await beginRestore(sql, id, 'CacheEmpty', check.divergence);
    const t: RestoreTarget = {
      activityId: id,
      epoch: row.epoch,
      generation: 1,
      startMs: start.getTime(),
      endMs: end.getTime(),
      requireOrderCode: false,
      reopenOnRelease: true,
      ownerUid: 'uid-1',
      buckets: new Map([['hot', BUCKETS]]),
    };
    expect(await holdForRestore(redis, t)).toBe('');
    const layout = (await bucketLayout(redis, id, { refresh: true })).keys;
    const buckets = Array.from({ length: BUCKETS }, (_, i) => layout.bucket('hot', i, BUCKETS));
    // Every bucket held paused too: no bucket sells before the reload.
    expect(await Promise.all(buckets.map((b) => redis.hget(b.meta, 'gate')))).toEqual(
      buckets.map(() => 'paused'),
    );
    // One buyer of hot pays while the reload reads (after its snapshot, before its writes).
    const [paidHot] = (
      await sql.query<{ reservation_id: string }>(
        `SELECT reservation_id FROM orders WHERE activity_id = $1 AND sku_id = 'hot' ORDER BY id LIMIT 1`,
        [id],
      )
    ).rows;
    const reload = await reloadFromPostgres(
      redis,
      afterSkusRead(sql, async () => {
        const o = (await findLifecycleByReservationId(sql, paidHot!.reservation_id))!;
        expect((await payOrder(o, 'trace-paid')).outcome).toBe('PAID');
      }),
      t,
    );
    expect(reload.paidDuringReload).toBe(1);
    const first = await snapshot(id);
    expect(await reloadFromPostgres(redis, sql, t)).toEqual({ ...reload, paidDuringReload: 0 });
    expect(await snapshot(id)).toEqual(first);

    // PostgreSQL holds 8 live units of hot (2 of every pass's 3 buyers; the third's reservation was
    // in flight and is lost with the cache) and 4 of cold.
    const live = await sql.query<{ sku_id: string; n: string }>(
      `SELECT sku_id, sum(quantity)::text AS n FROM orders WHERE activity_id = $1 AND status <> 'CLOSED' GROUP BY sku_id ORDER BY sku_id`,
      [id],
    );
    expect(live.rows.map((r) => [r.sku_id, Number(r.n)])).toEqual([
      ['cold', 4],
      ['hot', 8],
    ]);
    expect([...reload.skus].sort((x, y) => (x.skuId < y.skuId ? -1 : 1))).toEqual([
      { skuId: 'cold', initial: 5, live: 4, inFlight: 0, remaining: 1 },
      { skuId: 'hot', initial: 20, live: 8, inFlight: 0, remaining: 12 },
    ]);
    // Each bucket its share of the 12 left, no transfer record of the lost cache, the layout back.
    expect(await Promise.all(buckets.map((b) => redis.hget(b.sku('hot'), 'stock')))).toEqual([
      '3',
      '3',
      '3',
      '3',
    ]);
    expect(await Promise.all(buckets.map((b) => redis.exists(b.transfers)))).toEqual([0, 0, 0, 0]);
    expect(await redis.hget(k.meta, k.bucketField('hot'))).toBe(String(BUCKETS));
    const stock = await readStock(redis, id);
    expect(stock.skus.map((s) => [s.skuId, s.initial, s.remaining])).toEqual([
      ['cold', 5, 1],
      ['hot', 20, 12],
    ]);
    expect(before.initial).toBe(stock.initial);
    // Each buyer's slot in the buyer's home bucket, and nowhere else.
    const orders = await sql.query<{ user_id: string; reservation_id: string; slot: number }>(
      `SELECT user_id, reservation_id, slot FROM orders WHERE activity_id = $1 AND sku_id = 'hot'`,
      [id],
    );
    for (const o of orders.rows) {
      const home = buckets[homeBucket(id, 'hot', o.user_id, BUCKETS)]!;
      expect(await redis.hgetall(home.buyer(o.user_id))).toEqual({
        'hot:qty': '1',
        [`hot:slot:${o.slot}`]: o.reservation_id,
      });
      // The one paid while the reload read is PAID in its home bucket, as PostgreSQL has it now.
      expect(await redis.hget(home.reservation(o.reservation_id), 'state')).toBe(
        o.reservation_id === paidHot!.reservation_id ? 'PAID' : 'RESERVED',
      );
      expect(await redis.exists(k.buyer(o.user_id))).toBe(0);
      // Its id claimed in the activity's scope again (claimRequest-2.lua).
      expect(await redis.hmget(k.reservation(o.reservation_id), 'state', 'sku', 'user')).toEqual([
        'ELSEWHERE',
        'hot',
        o.user_id,
      ]);
    }
    // Still paused everywhere; the mark is on every bucket and, last, on the activity.
    expect(await redis.hmget(k.meta, 'gate', 'epoch')).toEqual(['paused', String(row.epoch)]);
    expect(await Promise.all(buckets.map((b) => redis.hmget(b.meta, 'gate', 'epoch')))).toEqual(
      buckets.map(() => ['paused', String(row.epoch)]),
    );
    await advanceRestore(sql, id, row.epoch, 'detected');
    await advanceRestore(sql, id, row.epoch, 'paused');
    await advanceRestore(sql, id, row.epoch, 'drained', reload);
    await advanceRestore(sql, id, row.epoch, 'reloaded');
    await setGate(redis, id, 'open');
    expect((await checkCache(redis, sql, id, row.epoch, 10)).kind).toBe('consistent');

    // A requestId that reserved in a bucket before the loss cannot reserve another SKU after it.
    const claimed = orders.rows[0]!;
    await expect(
      reserve(redis, {
        activityId: id,
        userId: claimed.user_id,
        skuId: 'cold',
        quantity: 1,
        requestId: requestIds.get(claimed.reservation_id)!,
        traceId: 't',
      }),
    ).rejects.toMatchObject({ code: 'IDEMPOTENCY_CONFLICT' });

    // The sale resumes with demand above supply: exactly the 12 left sell (transfers refill the
    // buckets that run out), a buyer who already holds one gets one more at most.
    const again = await Promise.all(orders.rows.map((o) => buy(o.user_id, 'hot')));
    const third = await Promise.all(orders.rows.map((o) => buy(o.user_id, 'hot')));
    expect(third.filter((r) => r !== undefined)).toEqual([]); // limit 2: never a third
    const fresh: (string | undefined)[] = [];
    for (let i = 0; i < 12; i += 1) fresh.push(await buy(`late${i}`, 'hot'));
    const sold = again.filter((r) => r !== undefined).length + fresh.filter((r) => r !== undefined).length;
    expect(sold).toBe(12);
    expect((await readStock(redis, id)).skus.find((s) => s.skuId === 'hot')?.remaining).toBe(0);
    const perBuyer = await sql.query<{ n: string }>(
      `SELECT max(q)::text AS n FROM (SELECT sum(quantity) AS q FROM orders WHERE activity_id = $1 AND status <> 'CLOSED' GROUP BY user_id, sku_id) x`,
      [id],
    );
    expect(Number(perBuyer.rows[0]!.n)).toBeLessThanOrEqual(2);
    expect((await checkCache(redis, sql, id, row.epoch, 10)).kind).toBe('consistent');
  });

  test('a stock transfer taken before a restore never lands after it, and none starts while the restore holds', async () => {
    const id = uniqueId('rst');
    const BUCKETS = 4;
    const items: CatalogItem[] = [
      { skuId: 'hot', name: '茅台', price: '1499.00', stock: 20, limitPerUser: 2, buckets: BUCKETS },
    ];
    const { start, end } = await openSale(id, items);
    const layout = await bucketLayout(redis, id, { refresh: true });
    const [b0, b1, b2] = layout.bucketsOf('hot');
    const side = (b: NonNullable<typeof b0>, args: (string | number)[]) =>
      runScript(redis, 'transferStock', [b.meta, b.sku('hot'), b.transfers, b.counters], args);
    const stocks = async () =>
      Promise.all(layout.bucketsOf('hot').map(async (b) => Number(await redis.hget(b.sku('hot'), 'stock'))));

    // A refill's donor step from bucket 0 to 1; its process stops before the recipient's step.
    const out = await side(b0!, ['out', 'late', 2, 1, 'hot']);
    expect([Number(out[1]), String(out[2])]).toEqual([2, '0']);
    const record = await redis.hget(b0!.transfers, 'out:late');
    expect(record).toBe('2|1|0');

    // Meanwhile the operator restores the cache (here: behind by nothing, the units PostgreSQL
    // proves are the 20 loaded).
    const check = await checkCache(redis, sql, id, 0, 10);
    const row = await beginRestore(sql, id, 'CacheBehind', check.divergence);
    const t: RestoreTarget = {
      activityId: id,
      epoch: row.epoch,
      generation: 1,
      startMs: start.getTime(),
      endMs: end.getTime(),
      requireOrderCode: false,
      reopenOnRelease: true,
      ownerUid: 'uid-1',
      buckets: new Map([['hot', BUCKETS]]),
    };
    await holdForRestore(redis, t);
    // Held: no donor step starts (a bucket rewritten before its recipient would lose the units).
    await expect(side(b2!, ['out', 'held', 1, 3, 'hot'])).rejects.toMatchObject({ code: 'PAUSED' });
    await reloadFromPostgres(redis, sql, t);
    expect(await stocks()).toEqual([5, 5, 5, 5]);

    // The stopped process resumes with the donor's record as it read it: its recipient was rebuilt
    // since, and the 2 units are among the 20 the restore counted. Nothing lands.
    expect(Array.from(await side(b1!, ['in', 'late', 2, 0, 'hot', String(out[2])]))).toEqual([0, 0]);
    // As completeTransfers does with a pending list read before the restore.
    await redis.hset(b0!.transfers, 'out:late', record!);
    expect(await completeTransfers(redis, layout, 'hot')).toEqual({ landed: 0, unconfirmed: 0 });
    expect(await stocks()).toEqual([5, 5, 5, 5]);
    await redis.hdel(b0!.transfers, 'out:late');

    // Resumed: transfers move units again, recorded with the restore's epoch, and land.
    await setGate(redis, id, 'open');
    const again = await transferStock(redis, b2!, b1!, 3);
    expect(again).toMatchObject({ moved: 3, landed: true });
    expect(await redis.hget(b2!.transfers, `out:${again.transferId}`)).toBe(`3|1|${row.epoch}`);
    expect(await stocks()).toEqual([5, 8, 2, 5]);
    expect((await readStock(redis, id)).skus[0]?.remaining).toBe(20);
  });

  test('a cache back at an older generation is behind; the restore puts back the loaded generation and its window', async () => {
    const id = uniqueId('rsg');
    const start = new Date(Date.now() - 60_000);
    const end = new Date(Date.now() + 3_600_000);
    const later = new Date(end.getTime() + 1_800_000);
    const v1: CatalogItem[] = [{ skuId: 'a', name: '汤圆', price: '5.00', stock: 5, limitPerUser: 2 }];
    const v2: CatalogItem[] = [{ ...v1[0]!, stock: 8 }];
    const def = (generation: number, items: CatalogItem[], endAt: Date) => ({
      id,
      generation,
      startAt: start,
      endAt,
      requireOrderCode: false,
      reopenOnRelease: true,
      items,
    });
    // Generation 1 loaded and open; the snapshot Redis will come back from.
    await recordActivitySkus(sql, id, v1, 'spec');
    await loadActivity(redis, def(1, v1, end));
    await setGate(redis, id, 'open');
    const k = activityKeys(id);
    const keys = await redis.keys(k.scanPattern);
    const dumps = await Promise.all(keys.map(async (key) => [key, (await redis.dumpBuffer(key))!] as const));
    // Generation 2: more stock and a later end, loaded (as sync-spec does: PostgreSQL first).
    await recordActivitySkus(sql, id, v2, 'spec');
    await loadActivity(redis, def(2, v2, later));
    expect((await checkCache(redis, sql, id, 0, 10, 2)).kind).toBe('consistent');
    // Back from the snapshot: consistent by units and epoch, behind by its load mark.
    await redis.del(...(await redis.keys(k.scanPattern)));
    for (const [key, dump] of dumps) await redis.restore(key, 0, dump);
    expect(await redis.hmget(k.meta, 'gen', 'endMs')).toEqual(['1', String(end.getTime())]);
    expect((await checkCache(redis, sql, id, 0, 10)).kind).toBe('consistent');
    const check = await checkCache(redis, sql, id, 0, 10, 2);
    expect(check.kind).toBe('CacheBehind');
    expect(check.divergence.redis).toEqual({ present: true, generation: 1, epoch: 0 });

    const row = await beginRestore(sql, id, 'CacheBehind', check.divergence);
    const t: RestoreTarget = {
      activityId: id,
      epoch: row.epoch,
      generation: 2,
      startMs: start.getTime(),
      endMs: later.getTime(),
      requireOrderCode: false,
      reopenOnRelease: true,
      ownerUid: 'uid-1',
    };
    // The hold pauses the gate and puts back the loaded generation's window at once.
    expect(await holdForRestore(redis, t)).toBe('open');
    expect(await redis.hmget(k.meta, 'gate', 'gen', 'endMs')).toEqual([
      'paused',
      '1',
      String(later.getTime()),
    ]);
    await reloadFromPostgres(redis, sql, t);
    expect(await redis.hmget(k.meta, 'gate', 'gen', 'endMs', 'epoch')).toEqual([
      'paused',
      '2',
      String(later.getTime()),
      String(row.epoch),
    ]);
    expect(await redis.hmget(k.sku('a'), 'initial', 'stock')).toEqual(['8', '8']);
    expect((await checkCache(redis, sql, id, 0, 10, 2)).kind).toBe('consistent');
  });
  /** One pass of the operator's restore step (operator/reconcile/restore-cache.ts) for `fsa`. */
  const operatorPass = async (
    fsa: FlashSaleActivity,
    schedule: { startAt: Date; endAt: Date },
    opts: { restoreSettleMs?: number; pool?: Pool; deps?: Record<string, unknown> } = {},
  ): Promise<ReconcileContext> => {
    const log = createLogger('restore-step-test', 'silent');
    const deps = {
      redis,
      pool: opts.pool ?? sql,
      // The consumers' lag: nothing waits in Kafka here.
      kafka: { lag: async () => 0 },
      identity: 'restore-step-test',
      now: () => new Date(),
      log,
      config: {
        drainCheckMs: 200,
        restoreSettleMs: opts.restoreSettleMs ?? 60_000,
        trafficPolicy: DEFAULT_TRAFFIC_POLICY,
      } as OperatorConfig,
      metrics: createOperatorMetrics(),
      events: { record: async () => undefined },
      ...opts.deps,
    } as unknown as ReconcileDeps;
    const ctx = new ReconcileContext(deps, fsa, fsa.metadata.name!, schedule as EffectiveSchedule, log);
    ctx.ownsActivityId = true;
    await restoreCache(ctx);
    fsa.status = ctx.status;
    return ctx;
  };

  /** The resource of an Active sale whose generation 1 was loaded with `settings`. */
  const activeResource = (
    id: string,
    items: CatalogItem[],
    settings: { requireOrderCode: boolean; reopenOnRelease: boolean },
  ): FlashSaleActivity =>
    ({
      apiVersion: 'flashsale.io/v1alpha1',
      kind: 'FlashSaleActivity',
      metadata: { name: id, namespace: 'default', generation: 1, uid: id },
      spec: { paused: false, ...settings, items },
      status: {
        conditions: enterPhase(undefined, Phase.Active, 'test', 1, new Date()),
        cache: { loadedGeneration: 1 },
      },
    }) as unknown as FlashSaleActivity;

  /**
   * A one-SKU sale in `phase` whose Redis lost every key (the buyer `mallory` denied before), its
   * resource naming a deny-list ConfigMap that is gone (`gone`, a CoreV1Api that answers 404).
   */
  const emptiedWithoutDenyList = async (prefix: string, phase: Phase) => {
    const id = uniqueId(prefix);
    const items: CatalogItem[] = [{ skuId: 'a', name: '汤圆', price: '5.00', stock: 5, limitPerUser: 1 }];
    const settings = { requireOrderCode: false, reopenOnRelease: false };
    const { start: startAt, end: endAt } = await openSale(id, items, settings);
    await registerActivity(sql, {
      activityId: id,
      owner: `default/${id}`,
      ownerUid: id,
      startAt,
      endAt,
      ...settings,
    });
    await syncDenyList(redis, id, ['mallory']);
    const k = activityKeys(id);
    await redis.del(...(await redis.keys(k.scanPattern)));
    const fsa = activeResource(id, items, settings);
    fsa.status!.conditions = enterPhase(undefined, phase, 'test', 1, new Date());
    (fsa.spec as unknown as Record<string, unknown>).eligibility = { denyListRef: { name: 'deny' } };
    const gone = {
      readNamespacedConfigMap: async () => {
        throw Object.assign(new Error('configmaps "deny" not found'), { code: 404 });
      },
    };
    return { id, k, fsa, startAt, endAt, gone };
  };

  test("the operator's restore puts back the loaded generation's order-code and reopen settings, not a refused spec edit", async () => {
    const id = uniqueId('rss');
    const items: CatalogItem[] = [{ skuId: 'a', name: '汤圆', price: '5.00', stock: 5, limitPerUser: 2 }];
    const loaded = { requireOrderCode: false, reopenOnRelease: false };
    const { start: startAt, end: endAt } = await openSale(id, items, loaded);
    // What the operator records after loading generation 1 (operator/reconcile/sync-spec.ts register).
    await registerActivity(sql, {
      activityId: id,
      owner: 'default/rss',
      ownerUid: id,
      startAt,
      endAt,
      ...loaded,
    });
    // Redis loses the activity.
    const k = activityKeys(id);
    await redis.del(...(await redis.keys(k.scanPattern)));

    // The spec asks for order codes and reopened slots: an edit the operator refused once the sale
    // was live, which the CRD then keeps from being taken back.
    const now = new Date();
    const fsa = {
      apiVersion: 'flashsale.io/v1alpha1',
      kind: 'FlashSaleActivity',
      metadata: { name: id, namespace: 'default', generation: 2, uid: id },
      spec: { paused: false, requireOrderCode: true, reopenOnRelease: true, items },
      status: {
        conditions: enterPhase(undefined, Phase.Active, 'test', 1, now),
        cache: { loadedGeneration: 1 },
      },
    } as unknown as FlashSaleActivity;
    await operatorPass(fsa, { startAt, endAt });
    // Held for the restore with what was loaded: buyers without a code are not turned away.
    expect(await redis.hmget(k.meta, 'gate', 'requireCode', 'reopen', 'startMs', 'endMs')).toEqual([
      'paused',
      '0',
      '0',
      String(startAt.getTime()),
      String(endAt.getTime()),
    ]);
    expect((await openRestore(sql, id))?.step).toBe('paused');
  });
  test('a restore whose deny list ConfigMap is gone keeps the gate paused: the rebuilt cache readmits no denied buyer', async () => {
    const { id, k, fsa, startAt, endAt, gone } = await emptiedWithoutDenyList('rsd', Phase.Active);
    let ctx: ReconcileContext | undefined;
    for (let pass = 0; pass < 6; pass += 1)
      ctx = await operatorPass(fsa, { startAt, endAt }, { restoreSettleMs: 0, deps: { core: gone } });
    expect((await openRestore(sql, id))?.step).toBe('reloaded');
    expect(await redis.hget(k.meta, 'gate')).toBe('paused');
    expect(ctx!.status.conditions?.find((c) => c.type === 'CacheConsistent')?.message).toMatch(
      /waiting for the deny list .*the gate stays paused/,
    );
    // A hold mark no reload lifted (a hold repeated after the reload, as while this restore waits,
    // or an earlier version's reload): the resume lifts it, or the scope stays held for good.
    await redis.hset(k.meta, 'restoring', String(ctx!.status.cache?.loadedGeneration ?? 1));
    // The list back: the restore resumes with the buyer denied again.
    const back = { readNamespacedConfigMap: async () => ({ data: { denied: 'mallory\n' } }) };
    await operatorPass(fsa, { startAt, endAt }, { restoreSettleMs: 0, deps: { core: back } });
    expect(await openRestore(sql, id)).toBeUndefined();
    expect(await redis.hget(k.meta, 'gate')).toBe('open');
    expect(await redis.hexists(k.meta, 'restoring')).toBe(0);
    const denied = reserve(redis, {
      activityId: id,
      userId: 'mallory',
      skuId: 'a',
      quantity: 1,
      requestId: 'm',
      traceId: 't',
    });
    await expect(denied).rejects.toMatchObject({ code: 'BUYER_DENIED' });
  });
  test('a restore of a sale that has ended resumes closed without its deny list: the drain is not held', async () => {
    const { id, k, fsa, startAt, endAt, gone } = await emptiedWithoutDenyList('rsdd', Phase.Draining);
    for (let pass = 0; pass < 6 && (pass === 0 || (await openRestore(sql, id))); pass += 1)
      await operatorPass(fsa, { startAt, endAt }, { restoreSettleMs: 0, deps: { core: gone } });
    expect(await openRestore(sql, id)).toBeUndefined();
    expect(await redis.hget(k.meta, 'gate')).toBe('closed');
  });

  test("the operator's restore waits for the stock buckets' outboxes, not only the activity's", async () => {
    const id = uniqueId('rso');
    const items: CatalogItem[] = [
      { skuId: 'hot', name: '茅台', price: '1499.00', stock: 12, limitPerUser: 1, buckets: 3 },
    ];
    const settings = { requireOrderCode: false, reopenOnRelease: false };
    const { start: startAt, end: endAt } = await openSale(id, items, settings);
    await registerActivity(sql, {
      activityId: id,
      owner: 'default/rso',
      ownerUid: id,
      startAt,
      endAt,
      ...settings,
    });
    // Three reservations in their buyers' home buckets; no relay runs: their half messages wait in
    // the buckets' outboxes.
    for (const user of ['u1', 'u2', 'u3'])
      await reserve(redis, {
        activityId: id,
        userId: user,
        skuId: 'hot',
        quantity: 1,
        requestId: user,
        traceId: 't',
      });
    const layout = await bucketLayout(redis, id, { refresh: true });
    const waiting = await Promise.all(layout.allBuckets().map((b) => redis.xlen(b.outbox)));
    expect(waiting.reduce((n, l) => n + l, 0)).toBe(3);
    // Only the activity's own slot loses its data (one node of a cluster); the buckets' keep theirs.
    const k = activityKeys(id);
    await redis.del(...(await redis.keys(k.scanPattern)));
    forgetBucketLayout(id);

    const fsa = activeResource(id, items, settings);
    await operatorPass(fsa, { startAt, endAt }, { restoreSettleMs: 0 });
    expect((await openRestore(sql, id))?.step).toBe('paused');
    // The held meta names the buckets again: the relay (which re-reads its streams from it), the
    // half-message gauge and gap repair see the buckets' outboxes, which the restore waits for.
    expect((await outboxStreams(redis, id)).sort()).toEqual(
      [k.outbox, ...layout.allBuckets().map((b) => b.outbox)].sort(),
    );
    expect((await readOutbox(redis, id)).halfMessages).toBe(3);
    // Settled, consumer lag 0, the activity's outbox empty: still waiting for the buckets'.
    const ctx = await operatorPass(fsa, { startAt, endAt }, { restoreSettleMs: 0 });
    expect((await openRestore(sql, id))?.step).toBe('paused');
    expect(ctx.status.conditions?.find((c) => c.type === 'CacheConsistent')?.message).toMatch(
      /waiting for 3 half message\(s\) not yet in Kafka/,
    );
  });
  test('a restore whose reload is repeated (the operator died before recording it) resumes with no scope left held', async () => {
    const id = uniqueId('rsr');
    const items: CatalogItem[] = [
      { skuId: 'hot', name: '茅台', price: '1499.00', stock: 12, limitPerUser: 1, buckets: 3 },
      { skuId: 'cold', name: '粽子', price: '6.00', stock: 5, limitPerUser: 1 },
    ];
    const settings = { requireOrderCode: false, reopenOnRelease: false };
    const { start: startAt, end: endAt } = await openSale(id, items, settings);
    await registerActivity(sql, {
      activityId: id,
      owner: 'default/rsr',
      ownerUid: id,
      startAt,
      endAt,
      ...settings,
    });
    const k = activityKeys(id);
    const metas = [
      k.meta,
      ...(await bucketLayout(redis, id, { refresh: true })).allBuckets().map((b) => b.meta),
    ];
    expect(metas).toHaveLength(4);
    // Redis loses the sale: the activity's keys and its buckets'.
    await redis.del(...(await redis.keys(k.scanPattern)), ...(await redis.keys(k.bucketScanPattern)));
    forgetBucketLayout(id);
    const fsa = activeResource(id, items, settings);
    const schedule = { startAt, endAt };
    await operatorPass(fsa, schedule, { restoreSettleMs: 0 });
    expect((await openRestore(sql, id))?.step).toBe('paused');

    // The next pass reloads every scope; the operator dies before the reload is recorded.
    const dying = new Proxy(sql, {
      get(t, prop) {
        const v: unknown = Reflect.get(t, prop);
        if (prop === 'query')
          return async (...args: unknown[]) => {
            const params = args[1] as unknown[] | undefined;
            if (/UPDATE cache_restores SET step/.test(String(args[0])) && params?.[2] === 'drained')
              throw new Error('operator killed');
            return (v as (...a: unknown[]) => Promise<unknown>).apply(t, args);
          };
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
      },
    });
    await expect(operatorPass(fsa, schedule, { restoreSettleMs: 0, pool: dying })).rejects.toThrow(
      'operator killed',
    );
    expect((await openRestore(sql, id))?.step).toBe('drained');
    expect(await Promise.all(metas.map((m) => redis.hexists(m, 'restoring')))).toEqual([0, 0, 0, 0]);

    // A new operator repeats the step: the hold again, a reload that finds every scope done, the
    // resume. No scope may stay held: a held bucket refuses its transfers, a held activity its
    // late in-time payments.
    await operatorPass(fsa, schedule, { restoreSettleMs: 0 });
    expect(await openRestore(sql, id)).toBeUndefined();
    expect(await redis.hget(k.meta, 'gate')).toBe('open');
    expect(await Promise.all(metas.map((m) => redis.hexists(m, 'restoring')))).toEqual([0, 0, 0, 0]);
  });
  /**
   * `pool` that fails (as an operator killed there) the first query `kill` matches, whether it is
   * asked of the pool itself or of a client taken from it (a step recorded in a transaction).
   */
  const killedAt = (pool: pg.Pool, kill: (text: string, params: unknown[] | undefined) => boolean): Pool => {
    let fired = false;
    const guarded =
      <T extends object>(target: T) =>
      (prop: string | symbol): unknown => {
        const v: unknown = Reflect.get(target, prop);
        if (prop === 'query')
          return async (...args: unknown[]) => {
            if (!fired && kill(String(args[0]), args[1] as unknown[] | undefined)) {
              fired = true;
              throw new Error('operator killed');
            }
            return (v as (...a: unknown[]) => Promise<unknown>).apply(target, args);
          };
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
      };
    return new Proxy(pool, {
      get(t, prop) {
        if (prop === 'connect')
          return async () => {
            const client = await t.connect();
            return new Proxy(client, { get: (c, p) => guarded(c)(p) });
          };
        return guarded(t)(prop);
      },
    }) as unknown as Pool;
  };

  test('a cache lost again after the resume opened the gate (the operator died before recording it) is restored anew, drained first: the orders then in flight keep their units', async () => {
    const id = uniqueId('rsg');
    const items: CatalogItem[] = [{ skuId: 'a', name: '汤圆', price: '5.00', stock: 5, limitPerUser: 5 }];
    const settings = { requireOrderCode: false, reopenOnRelease: false };
    const { start: startAt, end: endAt } = await openSale(id, items, settings);
    await registerActivity(sql, {
      activityId: id,
      owner: 'default/rsg',
      ownerUid: id,
      startAt,
      endAt,
      ...settings,
    });
    const k = activityKeys(id);
    await redis.del(...(await redis.keys(k.scanPattern)));
    const fsa = activeResource(id, items, settings);
    const schedule = { startAt, endAt };
    await operatorPass(fsa, schedule, { restoreSettleMs: 0 });
    const first = await openRestore(sql, id);
    expect(first?.step).toBe('paused');

    // The reload, the gate opened, and the operator dies before the resume is recorded.
    const dying = killedAt(
      sql,
      (text, params) => /UPDATE cache_restores SET step/.test(text) && params?.[2] === 'reloaded',
    );
    await expect(operatorPass(fsa, schedule, { restoreSettleMs: 0, pool: dying })).rejects.toThrow(
      'operator killed',
    );
    expect((await openRestore(sql, id))?.step).toBe('reloaded');
    expect(await redis.hget(k.meta, 'gate')).toBe('open');

    // A buyer reserves on the open gate; the relay sends the half message to Kafka; then Redis
    // loses the sale again, the reservation with it. Its order is still on its way (lag 1).
    const r = await reserve(redis, {
      activityId: id,
      userId: 'u1',
      skuId: 'a',
      quantity: 1,
      requestId: 'q1',
      traceId: 't',
    });
    const message = orderMessageOf(id, (await readReservation(redis, id, r.reservationId))!);
    await redis.del(...(await redis.keys(k.scanPattern)));
    let lag = 1;
    const kafka = { lag: async () => lag };

    // A new operator finds the restore at `reloaded` and the reload gone. It may not reload now:
    // the order in Kafka is in neither PostgreSQL nor Redis. The sale stays paused until the
    // restore that follows has drained.
    await operatorPass(fsa, schedule, { restoreSettleMs: 0, deps: { kafka } });
    // Never a moment without an open restore: the next one is open as this one closes.
    expect((await openRestore(sql, id))?.epoch).toBe(first!.epoch + 1);
    await operatorPass(fsa, schedule, { restoreSettleMs: 0, deps: { kafka } });
    expect(await redis.hget(k.meta, 'gate')).toBe('paused');
    expect(await redis.hget(k.sku('a'), 'stock')).toBeNull();

    // The consumer writes the order; the lag is 0; the restore reloads and resumes.
    await insertOrders(sql, [message], 900);
    lag = 0;
    for (let pass = 0; pass < 4 && (await openRestore(sql, id)) !== undefined; pass += 1)
      await operatorPass(fsa, schedule, { restoreSettleMs: 0, deps: { kafka } });
    expect(await openRestore(sql, id)).toBeUndefined();
    expect(await redis.hget(k.meta, 'gate')).toBe('open');
    // Redis' stock plus PostgreSQL's live units is the sale's stock: the unit is sold once.
    expect(await redis.hget(k.sku('a'), 'stock')).toBe('4');
    expect(await lastReloadedEpoch(sql, id)).toBeGreaterThan(first!.epoch);
  });

  test("a buyer's cancellation that arrived before its submission outlives a restore: the late submission is still refused", async () => {
    const id = uniqueId('rsc');
    const items: CatalogItem[] = [
      { skuId: 'a', name: '汤圆', price: '5.00', stock: 5, limitPerUser: 2 },
      { skuId: 'hot', name: '茅台', price: '1499.00', stock: 12, limitPerUser: 1, buckets: 3 },
    ];
    const settings = { requireOrderCode: false, reopenOnRelease: false };
    const { start: startAt, end: endAt } = await openSale(id, items, settings);
    await registerActivity(sql, {
      activityId: id,
      owner: 'default/rsc',
      ownerUid: id,
      startAt,
      endAt,
      ...settings,
    });
    // The buyers' 202s were lost: they cancel by requestId before their submissions arrive.
    for (const [userId, requestId] of [
      ['u1', 'plain'],
      ['u2', 'bucketed'],
    ] as const)
      expect(
        (
          await cancelReservation(lifecycle(), {
            activityId: id,
            userId,
            target: { requestId },
            traceId: 't',
          })
        ).outcome,
      ).toBe('tombstoned');
    // Redis loses the sale; the restore runs.
    const k = activityKeys(id);
    await redis.del(...(await redis.keys(k.scanPattern)), ...(await redis.keys(k.bucketScanPattern)));
    forgetBucketLayout(id);
    const fsa = activeResource(id, items, settings);
    for (let pass = 0; pass < 4 && (pass === 0 || (await openRestore(sql, id)) !== undefined); pass += 1)
      await operatorPass(fsa, { startAt, endAt }, { restoreSettleMs: 0 });
    expect(await openRestore(sql, id)).toBeUndefined();
    expect(await redis.hget(k.meta, 'gate')).toBe('open');

    // The late submissions arrive: refused as before the loss, nothing reserved.
    const late = async (userId: string, requestId: string, skuId: string) =>
      reserve(redis, { activityId: id, userId, skuId, quantity: 1, requestId, traceId: 't' }).then(
        () => 'reserved',
        (err: unknown) => (err as { code?: string }).code,
      );
    expect([await late('u1', 'plain', 'a'), await late('u2', 'bucketed', 'hot')]).toEqual([
      'CANCELLED',
      'CANCELLED',
    ]);
    // Another buyer is not affected.
    expect(await late('u3', 'plain', 'a')).toBe('reserved');
  });

  /** The lifecycle's dependencies as the sweeper and the api give them. */
  const lifecycle = (): LifecycleDeps => ({
    pool: sql,
    redis,
    logger: createLogger('cache-restore-test', 'silent'),
    paymentTimeoutSeconds: 900,
  });

  /** The provider's notification that the order's whole amount was paid just now. */
  const payOrder = (
    o: LifecycleOrderRow,
    traceId: string,
    client: Redis = redis,
  ): ReturnType<typeof acceptPayment> =>
    acceptPayment(
      { pool: sql, redis: client, logger: lifecycle().logger },
      'hmac',
      {
        orderId: o.id,
        tradeNo: `t-${o.id}`,
        amount: o.amount,
        status: 'success',
        providerStatus: 'TRADE_SUCCESS',
        paidAt: new Date(),
        fields: {},
      },
      traceId,
    );

  /**
   * `pool` whose first query reading `activity_skus` runs `after` once it has answered, whether it
   * is asked of the pool itself or of a client taken from it: the reload's first PostgreSQL read.
   */
  const afterSkusRead = (pool: pg.Pool, after: () => Promise<void>): Pool => {
    let fired = false;
    const hooked =
      (target: object, query: (...args: unknown[]) => Promise<unknown>) =>
      async (...args: unknown[]): Promise<unknown> => {
        const result = await query.apply(target, args);
        if (!fired && /FROM activity_skus/.test(String(args[0]))) {
          fired = true;
          await after();
        }
        return result;
      };
    const wrap = <T extends object>(target: T, extra: Record<string | symbol, unknown> = {}): T =>
      new Proxy(target, {
        get(t, prop) {
          if (prop in extra) return extra[prop];
          const v: unknown = Reflect.get(t, prop);
          if (prop === 'query') return hooked(t, v as (...args: unknown[]) => Promise<unknown>);
          return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
        },
      });
    return wrap(pool, { connect: async () => wrap(await pool.connect()) });
  };

  /**
   * Empties the activity's cache and opens a restore, holding the cache, up to the reload. `open`
   * is given the restore's opening to run (the test's own moves around it).
   */
  const loseAndHold = async (
    id: string,
    start: Date,
    end: Date,
    open: (begin: () => Promise<CacheRestoreRow>) => Promise<CacheRestoreRow> = (begin) => begin(),
  ): Promise<{ t: RestoreTarget; epoch: number }> => {
    await redis.del(...(await redis.keys(activityKeys(id).scanPattern)));
    const check = await checkCache(redis, sql, id, 0, 10);
    expect(check.kind).toBe('CacheEmpty');
    const row = await open(() => beginRestore(sql, id, 'CacheEmpty', check.divergence));
    const t: RestoreTarget = {
      activityId: id,
      epoch: row.epoch,
      generation: 1,
      startMs: start.getTime(),
      endMs: end.getTime(),
      requireOrderCode: false,
      reopenOnRelease: true,
      ownerUid: 'uid-1',
    };
    await holdForRestore(redis, t);
    expect(await advanceRestore(sql, id, row.epoch, 'detected')).toBe(true);
    expect(await advanceRestore(sql, id, row.epoch, 'paused')).toBe(true);
    return { t, epoch: row.epoch };
  };

  /** An open sale of one SKU (10 units) where u1's reservation of one unit is an UNPAID order. */
  const saleWithOneOrder = async (
    prefix: string,
    limitPerUser: number,
  ): Promise<{ id: string; start: Date; end: Date; r: Awaited<ReturnType<typeof reserve>> }> => {
    const id = uniqueId(prefix);
    const items: CatalogItem[] = [{ skuId: 'a', name: '汤圆', price: '5.00', stock: 10, limitPerUser }];
    const { start, end } = await openSale(id, items);
    const r = await reserve(redis, {
      activityId: id,
      userId: 'u1',
      skuId: 'a',
      quantity: 1,
      requestId: 'q1',
      traceId: 't',
    });
    await insertOrders(sql, [orderMessageOf(id, (await readReservation(redis, id, r.reservationId))!)], 900);
    return { id, start, end, r };
  };

  test('an order the sweeper closes while the reload reads gets its unit back after the resume (one snapshot)', async () => {
    const { id, start, end, r } = await saleWithOneOrder('rss', 2);
    const order = (await findLifecycleByReservationId(sql, r.reservationId))!;
    expect(order.status).toBe('UNPAID');

    const { t, epoch } = await loseAndHold(id, start, end);
    // The reload has read each SKU's live count (the order UNPAID, counted) when the payment
    // timeout closes the order; its stock return waits for the resume (a restore is open).
    const deps = lifecycle();
    let closed: Awaited<ReturnType<typeof closeOrder>> | undefined;
    const reload = await reloadFromPostgres(
      redis,
      afterSkusRead(sql, async () => {
        closed = await closeOrder(deps, order.id, 'PAYMENT_TIMEOUT', 't-sweep');
      }),
      t,
    );
    expect(closed?.transition.applied).toBe(true);
    expect(closed?.settle).toMatchObject({ redis: 0, deferred: 1 });
    expect(await advanceRestore(sql, id, epoch, 'drained', reload)).toBe(true);
    expect(await advanceRestore(sql, id, epoch, 'reloaded')).toBe(true);
    await setGate(redis, id, 'open');

    // The sweeper's next pass after the resume returns the unit: the sale has all 10 again.
    const row = (await findLifecycleByReservationId(sql, r.reservationId))!;
    expect([row.status, row.stockReturnVia]).toEqual(['CLOSED', null]);
    expect(await settleStock(deps, [row])).toMatchObject({ redis: 1, deferred: 0 });
    const stock = await readStock(redis, id);
    expect(stock.skus.map((s) => [s.skuId, s.initial, s.remaining])).toEqual([['a', 10, 10]]);
    expect([stock.reserved, stock.released]).toEqual([1, 1]);
    expect(await redis.hget(activityKeys(id).buyer('u1'), 'a:qty')).toBe('0');
    expect((await checkCache(redis, sql, id, epoch, 10)).kind).toBe('consistent');
  });

  test('an order closed between a reload and its repeat (the operator died before recording it) gets its unit back: the repeat writes the stock of its own snapshot', async () => {
    const { id, start, end, r } = await saleWithOneOrder('rsx', 2);
    const order = (await findLifecycleByReservationId(sql, r.reservationId))!;
    const { t, epoch } = await loseAndHold(id, start, end);
    // The first reload counts the order live; the operator dies before recording the step.
    const first = await reloadFromPostgres(redis, sql, t);
    expect(first.skus.map((s) => s.remaining)).toEqual([9]);
    // The payment timeout closes the order meanwhile; its stock return waits for the resume.
    const deps = lifecycle();
    const closed = await closeOrder(deps, order.id, 'PAYMENT_TIMEOUT', 't-sweep');
    expect(closed.settle).toMatchObject({ redis: 0, deferred: 1 });
    // The next leader repeats the reload from a snapshot where the order is closed: its
    // reservation comes back RELEASED, so its stock must too (else no release ever returns it).
    const again = await reloadFromPostgres(redis, sql, t);
    expect(again.skus.map((s) => s.remaining)).toEqual([10]);
    expect(await redis.hget(activityKeys(id).reservation(r.reservationId), 'state')).toBe('RELEASED');
    expect(await advanceRestore(sql, id, epoch, 'drained', again)).toBe(true);
    expect(await advanceRestore(sql, id, epoch, 'reloaded')).toBe(true);
    await setGate(redis, id, 'open');

    const row = (await findLifecycleByReservationId(sql, r.reservationId))!;
    expect(await settleStock(deps, [row])).toMatchObject({ redis: 1, deferred: 0 });
    const stock = await readStock(redis, id);
    expect(stock.skus.map((s) => [s.skuId, s.initial, s.remaining])).toEqual([['a', 10, 10]]);
    expect((await checkCache(redis, sql, id, epoch, 10)).kind).toBe('consistent');
  });

  test('an order paid while the reload reads its snapshot comes back PAID: no release can return its unit', async () => {
    const { id, start, end, r } = await saleWithOneOrder('rsq', 1);
    const order = (await findLifecycleByReservationId(sql, r.reservationId))!;
    expect(order.status).toBe('UNPAID');

    const { t, epoch } = await loseAndHold(id, start, end);
    // The buyer pays after the reload's snapshot (the order UNPAID in it) and before the reload
    // writes the reservation: the payment commits, and its mark in Redis finds no reservation yet
    // (the cache is empty), which it takes as a cache PostgreSQL holds alone.
    let paid: Awaited<ReturnType<typeof acceptPayment>> | undefined;
    const reload = await reloadFromPostgres(
      redis,
      afterSkusRead(sql, async () => {
        paid = await payOrder(order, 'trace-paid');
      }),
      t,
    );
    expect([paid?.outcome, paid?.order.status]).toEqual(['PAID', 'PAID']);
    // The snapshot counted the order live (UNPAID); the reservation is marked as PostgreSQL has it now.
    expect(reload).toEqual({
      skus: [{ skuId: 'a', initial: 10, live: 1, inFlight: 0, remaining: 9 }],
      orders: 1,
      buyers: 1,
      paidDuringReload: 1,
    });
    const k = activityKeys(id);
    expect(await redis.hget(k.reservation(r.reservationId), 'state')).toBe('PAID');
    // Killed before its step was recorded: the repeat reads the order PAID and marks nothing more.
    expect(await reloadFromPostgres(redis, sql, t)).toEqual({ ...reload, paidDuringReload: 0 });
    expect(await redis.hget(k.reservation(r.reservationId), 'state')).toBe('PAID');

    expect(await advanceRestore(sql, id, epoch, 'drained', reload)).toBe(true);
    expect(await advanceRestore(sql, id, epoch, 'reloaded')).toBe(true);
    await setGate(redis, id, 'open');
    // Redis' own guard holds again: a release of the paid reservation (a cancellation or timeout
    // racing the payment) is refused, the unit stays sold.
    await expect(
      release(redis, {
        activityId: id,
        reservationId: r.reservationId,
        userId: 'u1',
        skuId: 'a',
        reason: 'CANCELLED',
      }),
    ).rejects.toMatchObject({ code: 'ALREADY_PAID' });
    expect((await readStock(redis, id)).skus.map((s) => s.remaining)).toEqual([9]);
    expect((await checkCache(redis, sql, id, epoch, 10)).kind).toBe('consistent');
  });

  test('a late in-time payment during a restore is refused with 503 and changes nothing; after the resume it pays', async () => {
    const { id, start, end, r } = await saleWithOneOrder('rsp', 1);
    const deps = lifecycle();
    const unpaid = (await findLifecycleByReservationId(sql, r.reservationId))!;
    // The payment timeout closed the order (its unit back in Redis) though the buyer paid in time.
    expect((await closeOrder(deps, unpaid.id, 'PAYMENT_TIMEOUT', 't-sweep')).settle).toMatchObject({
      redis: 1,
    });
    const order = (await findLifecycleByReservationId(sql, r.reservationId))!;
    const pay = (o: LifecycleOrderRow): ReturnType<typeof acceptPayment> => payOrder(o, 'trace-late');
    const untouched = async (): Promise<void> => {
      expect((await findLifecycleByReservationId(sql, r.reservationId))?.status).toBe('CLOSED');
      const payments = await sql.query(`SELECT 1 FROM payments WHERE order_id = $1`, [order.id]);
      expect(payments.rowCount).toBe(0);
    };

    // The cache came back empty; the restore holds it.
    const { t, epoch } = await loseAndHold(id, start, end);
    await expect(pay(order)).rejects.toMatchObject({ code: 'UNAVAILABLE', status: 503 });
    await untouched();
    // Redis itself refuses to take a unit back while a restore holds the cache.
    await expect(
      reclaimPaid(redis, {
        activityId: id,
        reservationId: r.reservationId,
        userId: 'u1',
        skuId: 'a',
        quantity: 1,
      }),
    ).rejects.toMatchObject({ code: 'PAUSED' });

    // Reloaded (the hold's mark gone from Redis), not resumed yet: still refused.
    const reload = await reloadFromPostgres(redis, sql, t);
    expect(reload.skus).toEqual([{ skuId: 'a', initial: 10, live: 0, inFlight: 0, remaining: 10 }]);
    expect(await advanceRestore(sql, id, epoch, 'drained', reload)).toBe(true);
    await expect(pay(order)).rejects.toMatchObject({ code: 'UNAVAILABLE', status: 503 });
    await untouched();
    expect(await redis.hget(activityKeys(id).reservation(r.reservationId), 'state')).toBe('RELEASED');

    // Resumed: the provider's retry pays the order, its unit taken back from the restored cache.
    expect(await advanceRestore(sql, id, epoch, 'reloaded')).toBe(true);
    await setGate(redis, id, 'open');
    const paid = await pay(order);
    expect([paid.outcome, paid.late, paid.order.status]).toEqual(['PAID', true, 'PAID']);
    expect((await readStock(redis, id)).skus.map((s) => s.remaining)).toEqual([9]);
    expect(await redis.hget(activityKeys(id).reservation(r.reservationId), 'state')).toBe('PAID');
    expect((await checkCache(redis, sql, id, epoch, 10)).kind).toBe('consistent');
  });
  test('a late payment whose unit Redis gave back before the cache was lost commits before the restore opens; the reload counts it PAID', async () => {
    const { id, start, end, r } = await saleWithOneOrder('rsf', 1);
    const deps = lifecycle();
    const unpaid = (await findLifecycleByReservationId(sql, r.reservationId))!;
    expect((await closeOrder(deps, unpaid.id, 'PAYMENT_TIMEOUT', 't-sweep')).settle).toMatchObject({
      redis: 1,
    });
    const order = (await findLifecycleByReservationId(sql, r.reservationId))!;
    // The payment's transaction stops right after reclaimPaid-5.lua took the unit back in Redis.
    let tookBack!: () => void;
    const reclaimed = new Promise<void>((resolve) => (tookBack = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const stalling = new Proxy(redis, {
      get(target, prop) {
        const v: unknown = Reflect.get(target, prop);
        if (typeof v !== 'function') return v;
        const f = (v as (...a: unknown[]) => unknown).bind(target);
        if (prop !== 'fs_reclaimPaid') return f;
        return async (...args: unknown[]): Promise<unknown> => {
          const reply = await f(...args);
          tookBack();
          await released;
          return reply;
        };
      },
    });
    const payment = payOrder(order, 'trace-late', stalling);
    await reclaimed;
    expect(await redis.hget(activityKeys(id).reservation(r.reservationId), 'state')).toBe('PAID');

    // Now Redis loses the sale and the operator opens a restore: the opening waits for the
    // payment's transaction (held off), which then commits; unfenced, it would open at once and
    // the reload would read PostgreSQL before the payment's commit.
    // Its own connection: the payment and the opening hold both of the pool's.
    const observer = new pg.Client({ connectionString: db.url });
    await observer.connect();
    const advisoryWaiters = async (): Promise<number> =>
      Number(
        (
          await observer.query<{ n: string }>(
            `SELECT count(*) AS n FROM pg_locks
              WHERE locktype = 'advisory' AND NOT granted
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          )
        ).rows[0]!.n,
      );
    const { t, epoch } = await loseAndHold(id, start, end, async (begin) => {
      let opened = false;
      const opening = begin();
      opening.then(
        () => (opened = true),
        () => (opened = true),
      );
      const first = await waitFor('the restore to open or to wait for a lock', async () =>
        opened ? 'opened' : (await advisoryWaiters()) > 0 ? 'waits' : undefined,
      );
      if (first === 'waits') release();
      return opening;
    }).finally(() => observer.end());
    const reload = await reloadFromPostgres(redis, sql, t);
    release();
    const paid = await payment;
    expect([paid.outcome, paid.late, paid.order.status]).toEqual(['PAID', true, 'PAID']);
    expect(reload.skus).toEqual([{ skuId: 'a', initial: 10, live: 1, inFlight: 0, remaining: 9 }]);
    expect(await advanceRestore(sql, id, epoch, 'drained', reload)).toBe(true);
    expect(await advanceRestore(sql, id, epoch, 'reloaded')).toBe(true);
    await setGate(redis, id, 'open');
    expect((await readStock(redis, id)).skus.map((s) => s.remaining)).toEqual([9]);
    expect((await checkCache(redis, sql, id, epoch, 10)).kind).toBe('consistent');
  });
});
