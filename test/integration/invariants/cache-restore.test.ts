// A cache restore's steps at their boundaries (core/cache-restore.ts, core/db/cache-restores-store.ts,
// ARCHITECTURE.md "a cache that came back empty or behind..."): each step repeated, as after an
// operator SIGKILL between its side effect and its recorded step, leaves exactly the same state;
// the reload writes initial − live orders − proven in-flight reservations, each order's
// reservation in the state PostgreSQL decides, and each buyer's held quantity and slots; the
// restore's step only moves forward, one open restore per activity.
import { Redis } from 'ioredis';
import pg from 'pg';
import { loadActivity, readMeta, readStock, setGate } from '../../../core/activity-cache.js';
import { checkCache, holdForRestore, reloadFromPostgres } from '../../../core/cache-restore.js';
import type { RestoreTarget } from '../../../core/cache-restore.js';
import { recordActivityItems } from '../../../core/db/activity-items-store.js';
import { recordActivitySkus } from '../../../core/db/activity-skus-store.js';
import {
  advanceRestore,
  beginRestore,
  lastReloadedEpoch,
  openRestore,
} from '../../../core/db/cache-restores-store.js';
import { insertOrders } from '../../../core/db/orders-store.js';
import { activityKeys } from '../../../core/keys.js';
import type { CatalogItem, OrderMessage } from '../../../core/model.js';
import { registerScripts } from '../../../core/scripts.js';
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

  /** Every key of the activity with its whole value, for comparing two states. */
  async function snapshot(activityId: string): Promise<Record<string, unknown>> {
    const out: Record<string, unknown> = {};
    const keys = (await redis.keys(activityKeys(activityId).scanPattern)).sort();
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
    const start = new Date(Date.now() - 60_000);
    const end = new Date(Date.now() + 3_600_000);
    await recordActivityItems(sql, id, 1, items);
    await recordActivitySkus(sql, id, items, 'spec');
    await loadActivity(redis, {
      id,
      generation: 1,
      startAt: start,
      endAt: end,
      requireOrderCode: false,
      reopenOnRelease: true,
      items,
    });
    await setGate(redis, id, 'open');
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
});
