// Returning a closed order's stock exactly once (core/order-lifecycle.ts settleStock) on the real
// Redis and PostgreSQL, when two settlers hold the same stale row (two sweepers, a sweeper and a
// cancellation): the conditional `orders.stock_return_via` update lets one of them settle, both
// while the cache is live (Redis release) and after write-back (PostgreSQL remaining).
import { Redis } from 'ioredis';
import { readStock, setGate } from '../../../core/activity-cache.js';
import { journalFor } from '../../../core/db/journal-store.js';
import {
  findLifecycleByReservationId,
  insertOrders,
  transitionOrder,
} from '../../../core/db/orders-store.js';
import type { LifecycleOrderRow } from '../../../core/db/orders-store.js';
import { createPool } from '../../../core/db/pool.js';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows, writeBack } from '../../../core/db/stock-store.js';
import { createLogger } from '../../../core/logger.js';
import { settleStock } from '../../../core/order-lifecycle.js';
import type { LifecycleDeps } from '../../../core/order-lifecycle.js';
import { orderMessageOf, readReservation, reservationIdFor, reserve } from '../../../core/reservations.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { loadOpenSale } from '../../fixtures/open-sale.js';

const TIMEOUT_MS = 60_000;

describe('stock of a closed order settled exactly once (real Redis and PostgreSQL)', () => {
  let db: FreshDatabase;
  let pool: Pool;
  let redis: Redis;
  let deps: LifecycleDeps;
  beforeAll(async () => {
    db = await freshDatabase();
    pool = createPool(db.url, 4, 'settle-test');
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 2 });
    deps = { pool, redis, logger: createLogger('settle-test', 'silent'), paymentTimeoutSeconds: 900 };
  }, TIMEOUT_MS);
  afterAll(async () => {
    await pool.end();
    redis.disconnect();
    await db.drop();
  }, TIMEOUT_MS);

  /** A reservation of 2 units whose order is in PostgreSQL and CLOSED (stock not settled yet). */
  async function closedOrder(): Promise<{ id: string; order: LifecycleOrderRow }> {
    const id = uniqueId('settle');
    await loadOpenSale(redis, id, [{ skuId: 's', name: 'item', price: '2.50', stock: 10, limitPerUser: 2 }], {
      reopenOnRelease: true,
    });
    await reserve(redis, {
      activityId: id,
      userId: 'u',
      skuId: 's',
      quantity: 2,
      requestId: 'r',
      traceId: 't',
    });
    const rsv = (await readReservation(redis, id, reservationIdFor(id, 'u', 'r')))!;
    const ins = await insertOrders(pool, [orderMessageOf(id, rsv)], 900);
    const t = await transitionOrder(pool, ins.inserted.get(rsv.reservationId)!, 'CLOSE', 'PAYMENT_TIMEOUT');
    if (!t.applied) throw new Error('setup: the order did not close');
    return { id, order: t.order };
  }

  const returned = async (rid: string): Promise<number> =>
    (await journalFor(pool, rid)).filter((j) => j.event === 'STOCK_RETURNED').length;

  test(
    'while the cache is live: two settlers of the same row, one release and one STOCK_RETURNED',
    async () => {
      const { id, order } = await closedOrder();
      const [a, b] = await Promise.all([settleStock(deps, [order]), settleStock(deps, [order])]);
      expect(a.redis + b.redis).toBe(1);
      const again = await settleStock(deps, [order]);
      expect(again.redis).toBe(0);
      expect(await returned(order.reservationId)).toBe(1);
      expect((await readStock(redis, id)).remaining).toBe(10);
      expect((await findLifecycleByReservationId(pool, order.reservationId))?.stockReturnVia).toBe('redis');
    },
    TIMEOUT_MS,
  );

  test(
    'after write-back: the stale row settled again adds nothing to PostgreSQL remaining',
    async () => {
      const { id, order } = await closedOrder();
      await setGate(redis, id, 'frozen');
      const stock = await readStock(redis, id);
      await writeBack(pool, {
        activityId: id,
        generation: 1,
        skus: stock.skus,
        reserved: stock.reserved,
        released: stock.released,
        orders: 1,
        writtenBy: 'settle-test',
      });
      expect(await readStockRows(pool, id)).toEqual([{ skuId: 's', initial: 10, remaining: 8 }]);
      const first = await settleStock(deps, [order]);
      expect(first.postgres).toBe(1);
      const second = await settleStock(deps, [order]);
      expect(second.postgres).toBe(0);
      expect(await readStockRows(pool, id)).toEqual([{ skuId: 's', initial: 10, remaining: 10 }]);
      expect(await returned(order.reservationId)).toBe(1);
    },
    TIMEOUT_MS,
  );
});
