// The last guard in PostgreSQL: with Redis deliberately oversold (stock raised behind the guard's
// back, duplicate reservations injected into Kafka), the real consumer never lets PostgreSQL hold
// more live units than a SKU's stock or a buyer more than the limit; the excess is stored CLOSED
// with its reason, its reservation released with its unit withheld, and counted in
// flashsale_oversell_prevented_total.
import type { Admin, Kafka, Producer } from 'kafkajs';
import { readActivitySkus, recordActivitySkus } from '../../../core/db/activity-skus-store.js';
import { reservationIdFor } from '../../../core/reservations.js';
import { journalFor } from '../../../core/db/journal-store.js';
import {
  findLifecycleByReservationId,
  findUnsettledClosedOrders,
  transitionOrder,
} from '../../../core/db/orders-store.js';
import type { LifecycleOrderRow } from '../../../core/db/orders-store.js';
import { readResult, readStock, setGate } from '../../../core/activity-cache.js';
import { readStockRows, writeBack } from '../../../core/db/stock-store.js';
import { acceptPayment } from '../../../runtime/payments/apply.js';
import { createKafka, idempotentProducer, topicsFor } from '../../../core/kafka.js';
import type { TopicNames } from '../../../core/kafka.js';
import { activityKeys } from '../../../core/keys.js';
import type { OrderMessage } from '../../../core/model.js';
import { closeOrder, settleStock } from '../../../core/order-lifecycle.js';
import { readReservation, release, reserve, returnWithheld } from '../../../core/reservations.js';
import { createLogger } from '../../../core/logger.js';
import { auditStock } from '../../../runtime/jobs/stock-audit.js';
import type { OrderConsumer } from '../../../runtime/consumer/consumer.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import {
  counters,
  countRows,
  openActivityWithTopics,
  orderConsumerFor,
  orderMessagesOf,
  reserveFor,
  setUp,
  TIMEOUT_MS,
  type Fixture,
  until,
} from './fixture.js';

describe('the PostgreSQL stock guard (real consumer, Kafka, PostgreSQL and Redis)', () => {
  let f: Fixture;
  let kafka: Kafka;
  let admin: Admin;
  let producer: Producer;
  const consumers: OrderConsumer[] = [];
  const prefix = uniqueId('guard');

  beforeAll(async () => {
    f = await setUp();
    kafka = createKafka(testEnv().kafkaBrokers, uniqueId('guard-test'));
    admin = kafka.admin();
    await admin.connect();
    producer = idempotentProducer(kafka);
    await producer.connect();
  }, TIMEOUT_MS);

  afterAll(async () => {
    for (const c of consumers) await c.stop();
    await producer?.disconnect();
    await admin?.disconnect();
    await f?.close();
  }, TIMEOUT_MS);

  const startConsumer = async (activityId: string, topics: TopicNames): Promise<void> => {
    const c = orderConsumerFor(f, kafka, activityId, topics, () =>
      kafka.consumer({ groupId: topics.consumerGroup, maxWaitTimeInMs: 200 }),
    );
    consumers.push(c);
    await c.start();
  };

  /** The SKU's stock as Redis counts it (unbucketed). */
  const redisStock = (activityId: string, skuId: string): Promise<string | null> =>
    f.redis.hget(activityKeys(activityId).sku(skuId), 'stock');

  const send = async (topics: TopicNames, messages: OrderMessage[]): Promise<void> => {
    await producer.send({
      topic: topics.orders,
      acks: -1,
      messages: messages.map((m) => ({ key: m.userId, value: JSON.stringify(m) })),
    });
  };

  const ordersOf = (activityId: string, n: number): Promise<true> =>
    until(`${n} orders`, async () =>
      (await countRows(f.pool, 'SELECT count(*) AS n FROM orders WHERE activity_id = $1', [activityId])) >= n
        ? true
        : undefined,
    );

  /** As the operator records a SKU before loading the cache (operator/reconcile/sync-spec.ts). */
  const recordStock = (activityId: string, skuId: string, stock: number, limitPerUser = 1): Promise<void> =>
    recordActivitySkus(
      f.pool,
      activityId,
      [{ skuId, name: '秒杀商品 flash item', price: '19.90', stock, limitPerUser }],
      'spec',
    );

  /** The order's buyer pays it in full, now (within its payment window). */
  const payInTime = (order: LifecycleOrderRow): ReturnType<typeof acceptPayment> =>
    acceptPayment(
      { pool: f.pool, redis: f.redis, logger: f.deps.logger },
      'hmac',
      {
        orderId: order.id,
        tradeNo: `t-${order.id}`,
        amount: order.amount,
        status: 'success',
        providerStatus: 'TRADE_SUCCESS',
        paidAt: new Date(),
        fields: {},
      },
      'trace-late',
    );

  const liveUnits = (activityId: string): Promise<number> =>
    countRows(
      f.pool,
      `SELECT coalesce(sum(quantity), 0) AS n FROM orders WHERE activity_id = $1 AND status <> 'CLOSED'`,
      [activityId],
    );

  const closedBy = (activityId: string, reason: string): Promise<number> =>
    countRows(f.pool, `SELECT count(*) AS n FROM orders WHERE activity_id = $1 AND close_reason = $2`, [
      activityId,
      reason,
    ]);

  const prevented = async (activityId: string): Promise<number> =>
    (await f.metrics.oversellPrevented.get()).values
      .filter((v) => v.labels.activity === activityId)
      .reduce((n, v) => n + v.value, 0);

  it(
    'Redis stock raised behind its back: PostgreSQL keeps the stock, the excess is CLOSED, its units withheld, counted',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 5 });
      await recordStock(activityId, skuId, 5);
      await f.redis.hincrby(activityKeys(activityId).sku(skuId), 'stock', 7);
      const buyers = Array.from({ length: 12 }, (_, i) => `buyer-${i}`);
      const rids = await reserveFor(f.redis, activityId, skuId, buyers);
      expect(rids).toHaveLength(12); // Redis sold 12 of a stock of 5
      const messages = await orderMessagesOf(f.redis, activityId, rids);
      await startConsumer(activityId, topics);

      // Two transactions: 4 orders, then 8 more and a redelivery of the first.
      await send(topics, messages.slice(0, 4));
      await ordersOf(activityId, 4);
      await send(topics, [...messages.slice(4), messages[0]!]);
      await ordersOf(activityId, 12);

      expect(await liveUnits(activityId)).toBe(5);
      expect(await closedBy(activityId, 'OVERSELL_PREVENTED')).toBe(7);
      expect((await readActivitySkus(f.pool, activityId))[0]).toMatchObject({ stock: 5, sold: 5 });
      expect(await prevented(activityId)).toBe(7);
      // The first four (an earlier transaction) all stand; of the second, only the oldest fits.
      const statuses = await Promise.all(
        rids.map(async (rid) => (await findLifecycleByReservationId(f.pool, rid))?.status),
      );
      expect(statuses.slice(0, 4)).toEqual(['UNPAID', 'UNPAID', 'UNPAID', 'UNPAID']);
      expect(statuses.slice(4).filter((s) => s === 'UNPAID')).toHaveLength(1);
      const closedRids = rids.filter((_, i) => statuses[i] === 'CLOSED');
      expect(closedRids).toHaveLength(7);
      for (const rid of closedRids) {
        const o = await until('the closed order settled', async () => {
          const row = await findLifecycleByReservationId(f.pool, rid);
          return row?.stockReturnVia ? row : undefined;
        });
        expect(o).toMatchObject({
          status: 'CLOSED',
          closeReason: 'OVERSELL_PREVENTED',
          stockReturnVia: 'withheld',
          stockReturned: false,
        });
        expect((await readReservation(f.redis, activityId, rid))?.state).toBe('RELEASED');
        const result = await until('the buyer result', () => readResult(f.redis, activityId, rid));
        expect(result.result).toEqual({ status: 'FAILED', reason: 'OVERSELL_PREVENTED' });
        const journal = await journalFor(f.pool, rid);
        expect(journal.map((j) => j.event)).toEqual(['ORDER_CREATED', 'ORDER_CLOSED', 'STOCK_WITHHELD']);
      }
      // The seven units Redis counted beyond PostgreSQL's stock stay taken: nothing to sell again.
      const sku = activityKeys(activityId).sku(skuId);
      expect(await f.redis.hget(sku, 'stock')).toBe('0');
      const counters = await f.redis.hmget(activityKeys(activityId).counters, 'reserved', 'released');
      expect(counters.map(Number)).toEqual([12, 0]);
      await expect(reserveFor(f.redis, activityId, skuId, ['too-late'])).rejects.toMatchObject({
        code: 'SOLD_OUT',
      });

      // A closed order's units leave `sold`: a buyer cancels, and the next order fits again.
      const first = (await findLifecycleByReservationId(f.pool, rids[0]!))!;
      await closeOrder(f.deps, first.id, 'CANCELLED', 'trace-cancel');
      expect((await readActivitySkus(f.pool, activityId))[0]).toMatchObject({ sold: 4 });
      const [late] = await reserveFor(f.redis, activityId, skuId, ['late-buyer']);
      await send(topics, await orderMessagesOf(f.redis, activityId, [late!]));
      await ordersOf(activityId, 13);
      expect((await findLifecycleByReservationId(f.pool, late!))?.status).toBe('UNPAID');
      expect(await f.redis.hget(sku, 'stock')).toBe('0');
      expect(await liveUnits(activityId)).toBe(5);
      expect((await readActivitySkus(f.pool, activityId))[0]).toMatchObject({ sold: 5 });
      expect(await prevented(activityId)).toBe(7);
    },
    TIMEOUT_MS,
  );

  it(
    'written back before the guard closed them: nothing goes to activity_stock, and a late payment is refunded',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 3 });
      await recordStock(activityId, skuId, 3);
      await f.redis.hincrby(activityKeys(activityId).sku(skuId), 'stock', 2);
      const rids = await reserveFor(f.redis, activityId, skuId, ['w0', 'w1', 'w2', 'w3', 'w4']);
      const messages = await orderMessagesOf(f.redis, activityId, rids);
      // The sale ends before the consumer sees the orders: frozen, Redis' remaining stock (0)
      // written back, as operator/reconcile/write-back.ts does.
      await setGate(f.redis, activityId, 'frozen');
      const stock = await readStock(f.redis, activityId);
      expect(stock.skus.map((x) => x.remaining)).toEqual([0]);
      await writeBack(f.pool, {
        activityId,
        generation: 1,
        skus: stock.skus,
        reserved: stock.reserved,
        released: stock.released,
        orders: 0,
        writtenBy: 'test',
      });
      await startConsumer(activityId, topics);
      await send(topics, messages);
      await ordersOf(activityId, 5);
      const closed = await until('the closed orders settled', async () => {
        const rows = await Promise.all(rids.map((rid) => findLifecycleByReservationId(f.pool, rid)));
        const c = rows.filter((o) => o?.status === 'CLOSED');
        return c.length === 2 && c.every((o) => o!.stockReturnVia === 'withheld') ? c : undefined;
      });
      // Not 2: those units were Redis' surplus, not the sale's.
      expect((await readStockRows(f.pool, activityId)).map((x) => x.remaining)).toEqual([0]);

      // The buyer of a closed order pays within the payment window: refunded, the order stays CLOSED.
      const order = closed[0]!;
      const paid = await payInTime(order);
      expect([paid.outcome, paid.refundReason, paid.order.status]).toEqual([
        'REFUND_PENDING',
        'ORDER_CLOSED',
        'CLOSED',
      ]);
      expect((await readStockRows(f.pool, activityId)).map((x) => x.remaining)).toEqual([0]);
    },
    TIMEOUT_MS,
  );

  it(
    'a late in-time payment cannot take a unit Redis counts beyond PostgreSQL: refunded, nothing oversold',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 3 });
      await recordStock(activityId, skuId, 3);
      await startConsumer(activityId, topics);
      const rids = await reserveFor(f.redis, activityId, skuId, ['p0', 'p1', 'p2']);
      await send(topics, await orderMessagesOf(f.redis, activityId, rids));
      await ordersOf(activityId, 3);
      // Redis forgets a reservation's decrement (one unit more than PostgreSQL allows), and the
      // timeout closes p0's order: its unit goes back to Redis, which now counts 2.
      await f.redis.hincrby(activityKeys(activityId).sku(skuId), 'stock', 1);
      const p0 = (await findLifecycleByReservationId(f.pool, rids[0]!))!;
      await closeOrder(f.deps, p0.id, 'PAYMENT_TIMEOUT', 'trace-timeout');
      expect(await redisStock(activityId, skuId)).toBe('2');
      // A new buyer takes p0's unit: PostgreSQL's three units are live again.
      const [p3] = await reserveFor(f.redis, activityId, skuId, ['p3']);
      await send(topics, await orderMessagesOf(f.redis, activityId, [p3!]));
      await ordersOf(activityId, 4);
      expect(await liveUnits(activityId)).toBe(3);

      // p0 paid in time: Redis still has a unit to give (the forgotten one), PostgreSQL has none.
      const paid = await payInTime(p0);
      expect([paid.outcome, paid.refundReason, paid.order.status]).toEqual([
        'REFUND_PENDING',
        'ORDER_CLOSED',
        'CLOSED',
      ]);
      expect(await liveUnits(activityId)).toBe(3);
      expect((await readActivitySkus(f.pool, activityId))[0]).toMatchObject({ stock: 3, sold: 3 });
    },
    TIMEOUT_MS,
  );

  it(
    'duplicate reservations injected into Kafka: a buyer is limited by quantity, not by slots',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, {
        stock: 10,
        limitPerUser: 2,
      });
      await recordStock(activityId, skuId, 10, 2);
      const [rid] = await reserveFor(f.redis, activityId, skuId, ['greedy'], 2);
      const [other] = await reserveFor(f.redis, activityId, skuId, ['modest']);
      const [real, modest] = await orderMessagesOf(f.redis, activityId, [rid!, other!]);
      // A second reservation of the same buyer that Redis no longer knows (as after a failover),
      // in the buyer's other slot: the slot key alone would let it become a second order.
      // A real submission of the buyer (its id derived from the buyer and a new requestId, as the
      // consumer's checks demand), not a made-up message.
      const again = `${real!.requestId}-again`;
      const forged: OrderMessage = {
        ...real!,
        requestId: again,
        reservationId: reservationIdFor(activityId, real!.userId, again),
        slot: 2,
        reservedAt: real!.reservedAt + 1,
      };
      await startConsumer(activityId, topics);
      await send(topics, [real!, forged, modest!]);
      await ordersOf(activityId, 3);

      expect((await findLifecycleByReservationId(f.pool, rid!))?.status).toBe('UNPAID');
      expect((await findLifecycleByReservationId(f.pool, other!))?.status).toBe('UNPAID');
      const closed = await until('the forged order settled', async () => {
        const row = await findLifecycleByReservationId(f.pool, forged.reservationId);
        return row?.stockReturnVia ? row : undefined;
      });
      // Redis never held this reservation: nothing to release there, and a guard-closed order's
      // unit is withheld in any case (never returned, so there is nothing to prove).
      expect(closed).toMatchObject({
        status: 'CLOSED',
        closeReason: 'BUYER_LIMIT_EXCEEDED',
        stockReturnVia: 'withheld',
      });
      const why = await f.pool.query<{ why: string }>(
        `SELECT detail->>'why' AS why FROM order_journal WHERE reservation_id = $1 AND event = 'STOCK_WITHHELD'`,
        [forged.reservationId],
      );
      expect(why.rows).toEqual([{ why: 'redis release: UNKNOWN_RESERVATION' }]);
      expect(await liveUnits(activityId)).toBe(3);
      expect((await readActivitySkus(f.pool, activityId))[0]).toMatchObject({ sold: 3 });
      expect(await prevented(activityId)).toBe(1);
    },
    TIMEOUT_MS,
  );

  it(
    'Redis forgot a reservation and its buyer came back: the slot conflict is stored CLOSED, its unit withheld, the slot kept',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 4 });
      await recordStock(activityId, skuId, 4);
      await startConsumer(activityId, topics);
      const [first] = await reserveFor(f.redis, activityId, skuId, ['twin']);
      await send(topics, await orderMessagesOf(f.redis, activityId, [first!]));
      await ordersOf(activityId, 1);
      // A failover to a replica that missed the reservation: the buyer's slot and the stock
      // decrement are forgotten with it.
      const k = activityKeys(activityId);
      await f.redis.del(k.buyer('twin'), k.reservation(first!));
      await f.redis.hincrby(k.sku(skuId), 'stock', 1);
      const again = (
        await reserve(f.redis, {
          activityId,
          userId: 'twin',
          skuId,
          quantity: 1,
          requestId: 'twin-again',
          traceId: 'trace-twin-again',
        })
      ).reservationId;
      expect(await redisStock(activityId, skuId)).toBe('3');
      await send(topics, await orderMessagesOf(f.redis, activityId, [again]));
      await ordersOf(activityId, 2);

      const closed = await until('the refused reservation settled', async () => {
        const row = await findLifecycleByReservationId(f.pool, again);
        return row?.stockReturnVia ? row : undefined;
      });
      expect(closed).toMatchObject({
        status: 'CLOSED',
        closeReason: 'BUYER_LIMIT_EXCEEDED',
        stockReturnVia: 'withheld',
      });
      const result = await until('the buyer result', () => readResult(f.redis, activityId, again));
      expect(result.result).toEqual({ status: 'FAILED', reason: 'BUYER_LIMIT_EXCEEDED' });
      expect(await prevented(activityId)).toBe(1);
      // Redis is PostgreSQL's again: 3 units left of 4 with one live order, and the buyer, who holds
      // one live order of a limit of 1, keeps the slot.
      expect(await redisStock(activityId, skuId)).toBe('3');
      expect(await f.redis.hget(k.buyer('twin'), `${skuId}:slot:1`)).toBe(again);
      await expect(
        reserve(f.redis, {
          activityId,
          userId: 'twin',
          skuId,
          quantity: 1,
          requestId: 'twin-third',
          traceId: 'trace-twin-third',
        }),
      ).rejects.toMatchObject({ code: 'LIMIT_REACHED' });
      expect(await liveUnits(activityId)).toBe(1);
    },
    TIMEOUT_MS,
  );

  /**
   * Redis forgets a reservation, as a failover to a replica that had not received it does: the
   * buyer's state, the reservation, its ledger entry, its stock decrement and its counter.
   */
  const forget = async (activityId: string, skuId: string, buyer: string, rid: string): Promise<void> => {
    const k = activityKeys(activityId);
    await f.redis.del(k.buyer(buyer), k.reservation(rid));
    await f.redis.zrem(k.ledger, rid);
    await f.redis.hincrby(k.sku(skuId), 'stock', 1);
    await f.redis.hincrby(k.counters, 'reserved', -1);
  };

  /** One reservation of a unit per buyer named, one after another, under the request ids given. */
  const reserveEach = async (
    activityId: string,
    skuId: string,
    buyers: string[],
    requestId: (buyer: string, i: number) => string,
  ): Promise<string[]> => {
    const ids: string[] = [];
    for (const [i, buyer] of buyers.entries()) {
      const r = await reserve(f.redis, {
        activityId,
        userId: buyer,
        skuId,
        quantity: 1,
        requestId: requestId(buyer, i),
        traceId: `trace-${requestId(buyer, i)}`,
      });
      ids.push(r.reservationId);
    }
    return ids;
  };

  /**
   * A sale whose first buyers' orders reach PostgreSQL before Redis forgets their reservations;
   * then the second buyers reserve (a first buyer again under a new requestId). A buyer named
   * twice in a wave reserves twice (within `limitPerUser`). Returns both waves' orders once the
   * second wave's are in PostgreSQL and the guard's closures settled.
   */
  const forgottenSale = async (
    spec: { stock: number; reopenOnRelease?: boolean; limitPerUser?: number },
    first: string[],
    second: string[],
  ): Promise<{
    activityId: string;
    skuId: string;
    firstWave: LifecycleOrderRow[];
    secondWave: LifecycleOrderRow[];
  }> => {
    const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, spec);
    await recordStock(activityId, skuId, spec.stock, spec.limitPerUser);
    await startConsumer(activityId, topics);
    /** A buyer's second reservation of a wave and later ones: `-2`, `-3`…, the first none. */
    const nth = (buyers: string[], i: number): string => {
      const n = buyers.slice(0, i).filter((b) => b === buyers[i]).length;
      return n === 0 ? '' : `-${n + 1}`;
    };
    const firstIds = first.some((b, i) => nth(first, i) !== '')
      ? await reserveEach(activityId, skuId, first, (buyer, i) => `req-${buyer}${nth(first, i)}`)
      : await reserveFor(f.redis, activityId, skuId, first);
    await send(topics, await orderMessagesOf(f.redis, activityId, firstIds));
    await ordersOf(activityId, first.length);
    for (const [i, buyer] of first.entries()) await forget(activityId, skuId, buyer, firstIds[i]!);
    const secondIds = await reserveEach(
      activityId,
      skuId,
      second,
      (buyer, i) => `${buyer}-again${nth(second, i)}`,
    );
    await send(topics, await orderMessagesOf(f.redis, activityId, secondIds));
    const rowsOf = (ids: string[]): Promise<(LifecycleOrderRow | undefined)[]> =>
      Promise.all(ids.map((rid) => findLifecycleByReservationId(f.pool, rid)));
    const secondWave = await until('the second wave in PostgreSQL, its closures settled', async () => {
      const rows = await rowsOf(secondIds);
      return rows.every((r) => r && (r.status !== 'CLOSED' || r.stockReturnVia))
        ? (rows as LifecycleOrderRow[])
        : undefined;
    });
    return { activityId, skuId, firstWave: (await rowsOf(firstIds)) as LifecycleOrderRow[], secondWave };
  };

  /** One buyer's reservation forgotten and the buyer back: the stand-in closed for the limit. */
  const forgetAndComeBack = async (
    spec: { stock: number; reopenOnRelease?: boolean },
    buyer: string,
  ): Promise<{
    activityId: string;
    skuId: string;
    forgotten: LifecycleOrderRow;
    standIn: LifecycleOrderRow;
  }> => {
    const sale = await forgottenSale(spec, [buyer], [buyer]);
    const [forgotten] = sale.firstWave;
    const [standIn] = sale.secondWave;
    expect(standIn).toMatchObject({ closeReason: 'BUYER_LIMIT_EXCEEDED', stockReturnVia: 'withheld' });
    const k = activityKeys(sale.activityId);
    expect(await f.redis.hget(k.reservation(standIn!.reservationId), 'withheld')).toBe('1');
    return { ...sale, forgotten: forgotten!, standIn: standIn! };
  };

  const withheldReturnedFor = async (orderId: string): Promise<string | null> =>
    (
      await f.pool.query<{ f: string | null }>(
        `SELECT withheld_returned_for AS f FROM orders WHERE id = $1`,
        [orderId],
      )
    ).rows[0]!.f;

  const audit = (activityId: string): ReturnType<typeof auditStock> =>
    auditStock({ activityId, redis: f.redis, pool: f.pool, logger: createLogger('audit', 'silent') });

  it(
    'the forgotten order times out: the unit withheld in its place goes back to the sale with the slot, once',
    async () => {
      const { activityId, skuId, forgotten, standIn } = await forgetAndComeBack(
        { stock: 4, reopenOnRelease: true },
        'late',
      );
      const k = activityKeys(activityId);
      expect(await redisStock(activityId, skuId)).toBe('3');
      // Before: one live order in PostgreSQL, one unit held in Redis (the stand-in's).
      expect((await audit(activityId)).figures).toMatchObject({ held: 1, accounted: 1 });

      const closed = await closeOrder(f.deps, forgotten.id, 'PAYMENT_TIMEOUT', 'trace-timeout');
      expect(closed.settle).toEqual({ redis: 1, postgres: 0, unresolved: 0, withheld: 0, deferred: 0 });
      expect(await findLifecycleByReservationId(f.pool, forgotten.reservationId)).toMatchObject({
        status: 'CLOSED',
        stockReturnVia: 'redis',
      });
      expect(await withheldReturnedFor(standIn.id)).toBe(forgotten.id);
      // The stand-in's unit and slot are back: 4 of 4 units, the buyer free to buy again.
      expect(await redisStock(activityId, skuId)).toBe('4');
      expect(await f.redis.hget(k.buyer('late'), `${skuId}:slot:1`)).toBeNull();
      expect(await f.redis.hget(k.reservation(standIn.reservationId), 'withheldReturnedFor')).toBe(
        forgotten.id,
      );
      const report = await audit(activityId);
      expect(report).toMatchObject({ ok: true, mismatches: [] });
      expect(report.figures).toMatchObject({ held: 0, accounted: 0, closedUnresolved: 0 });
      expect((await journalFor(f.pool, standIn.reservationId)).map((j) => j.event)).toEqual([
        'ORDER_CLOSED',
        'STOCK_WITHHELD',
        'WITHHELD_STOCK_RETURNED',
      ]);

      // Settling again, or asking Redis again for the same order, changes nothing.
      expect(await settleStock(f.deps, [forgotten])).toEqual({
        redis: 0,
        postgres: 0,
        unresolved: 0,
        withheld: 0,
        deferred: 0,
      });
      await expect(returnWithheld(f.redis, { ...standIn, forOrderId: forgotten.id })).resolves.toEqual({
        kind: 'returned-earlier',
        forOrderId: forgotten.id,
      });
      expect(await redisStock(activityId, skuId)).toBe('4');
      expect(await counters(f.redis, activityId)).toMatchObject({ reserved: 1, released: 1 });

      const back = await reserve(f.redis, {
        activityId,
        userId: 'late',
        skuId,
        quantity: 1,
        requestId: 'late-third',
        traceId: 'trace-late-third',
      });
      expect(back).toMatchObject({ kind: 'reserved', stockLeft: 3 });
    },
    TIMEOUT_MS,
  );

  it(
    'a settler killed after Redis gave the withheld unit back: the next sweep records it and gives nothing twice',
    async () => {
      const { activityId, skuId, forgotten, standIn } = await forgetAndComeBack({ stock: 4 }, 'killed');
      const k = activityKeys(activityId);
      // What a settler that died between its Redis call and its PostgreSQL transaction left: the
      // order CLOSED and unsettled in PostgreSQL, the unit given back in Redis.
      expect((await transitionOrder(f.pool, forgotten.id, 'CLOSE', 'PAYMENT_TIMEOUT')).applied).toBe(true);
      await expect(returnWithheld(f.redis, { ...standIn, forOrderId: forgotten.id })).resolves.toEqual({
        kind: 'returned',
        stockAfter: 4,
      });
      const [unsettled] = await findUnsettledClosedOrders(f.pool, activityId, 0, 10);
      expect(unsettled?.id).toBe(forgotten.id);

      expect(await settleStock(f.deps, [unsettled!])).toMatchObject({ redis: 1, unresolved: 0 });
      // The settlement found the script's record; asking the script again changes nothing either.
      await expect(returnWithheld(f.redis, { ...standIn, forOrderId: forgotten.id })).resolves.toEqual({
        kind: 'returned-earlier',
        forOrderId: forgotten.id,
      });
      expect(await redisStock(activityId, skuId)).toBe('4');
      // This sale does not reopen on release: the slot stays taken, as the order's own release
      // would have left it.
      expect(await f.redis.hget(k.buyer('killed'), `${skuId}:slot:1`)).toBe(standIn.reservationId);
      expect(await withheldReturnedFor(standIn.id)).toBe(forgotten.id);
      expect(await audit(activityId)).toMatchObject({ ok: true, mismatches: [] });

      // A reservation that withheld nothing is refused, and so is another buyer's.
      const [plain] = await reserveFor(f.redis, activityId, skuId, ['plain']);
      await release(f.redis, {
        activityId,
        reservationId: plain!,
        userId: 'plain',
        skuId,
        reason: 'CANCELLED',
      });
      await expect(
        returnWithheld(f.redis, {
          activityId,
          reservationId: plain!,
          userId: 'plain',
          skuId,
          forOrderId: '1',
        }),
      ).rejects.toMatchObject({ code: 'NOT_WITHHELD' });
      await expect(
        returnWithheld(f.redis, { ...standIn, userId: 'plain', forOrderId: '1' }),
      ).rejects.toMatchObject({ code: 'MISMATCH' });
      expect(await redisStock(activityId, skuId)).toBe('4');
    },
    TIMEOUT_MS,
  );

  it(
    'the forgotten order closes before its stand-in is settled: it waits, then settles through it',
    async () => {
      const { activityId, skuId, forgotten, standIn } = await forgetAndComeBack({ stock: 4 }, 'early');
      // The stand-in's release ran in Redis, its settlement's transaction did not (killed).
      await f.pool.query(`UPDATE orders SET stock_return_via = NULL WHERE id = $1`, [standIn.id]);

      const closed = await closeOrder(f.deps, forgotten.id, 'CANCELLED', 'trace-cancel');
      expect(closed.settle).toEqual({ redis: 0, postgres: 0, unresolved: 0, withheld: 0, deferred: 1 });
      expect(await redisStock(activityId, skuId)).toBe('3');
      expect(
        (await findLifecycleByReservationId(f.pool, forgotten.reservationId))?.stockReturnVia,
      ).toBeNull();

      // The sweeper settles the stand-in (withheld), then the forgotten order through it.
      expect(await settleStock(f.deps, [standIn])).toMatchObject({ withheld: 1 });
      expect(await settleStock(f.deps, [forgotten])).toMatchObject({ redis: 1, unresolved: 0, deferred: 0 });
      expect(await redisStock(activityId, skuId)).toBe('4');
      expect(await withheldReturnedFor(standIn.id)).toBe(forgotten.id);
      expect(await audit(activityId)).toMatchObject({ ok: true, mismatches: [] });
    },
    TIMEOUT_MS,
  );

  it(
    "two of a buyer's orders forgotten, two stand-ins: each forgotten order gives back one stand-in's unit, not both",
    async () => {
      // 4 units, limit 2: m's two orders reach PostgreSQL (slots 1 and 2), then Redis forgets
      // both; m buys twice again and both are closed BUYER_LIMIT_EXCEEDED (the forgotten orders
      // hold m's limit in PostgreSQL), their units withheld: each stands in for one of them.
      const sale = await forgottenSale({ stock: 4, limitPerUser: 2 }, ['m', 'm'], ['m', 'm']);
      const { activityId, skuId } = sale;
      const [f1, f2] = sale.firstWave;
      const [s1, s2] = [...sale.secondWave].sort((x, y) => Number(BigInt(x.id) - BigInt(y.id)));
      for (const w of [s1, s2])
        expect(w).toMatchObject({ closeReason: 'BUYER_LIMIT_EXCEEDED', stockReturnVia: 'withheld' });
      expect(await redisStock(activityId, skuId)).toBe('2');
      expect(await liveUnits(activityId)).toBe(2);

      // f1 times out: one unit goes back for it; the other stand-in's stays withheld for f2,
      // still live in PostgreSQL (3 free in Redis as in PostgreSQL, not 4).
      const first = await closeOrder(f.deps, f1!.id, 'PAYMENT_TIMEOUT', 'trace-m1');
      expect(await redisStock(activityId, skuId)).toBe('3');
      expect(first.settle).toEqual({ redis: 1, postgres: 0, unresolved: 0, withheld: 0, deferred: 0 });
      expect([await withheldReturnedFor(s1!.id), await withheldReturnedFor(s2!.id)]).toEqual([f1!.id, null]);
      expect(await audit(activityId)).toMatchObject({ ok: true, mismatches: [] });
      // Settling f1 again gives nothing more.
      expect(await settleStock(f.deps, [f1!])).toMatchObject({ redis: 0, unresolved: 0 });
      expect(await redisStock(activityId, skuId)).toBe('3');

      // f2 is cancelled: the second stand-in's unit goes back for it, nothing flagged.
      const second = await closeOrder(f.deps, f2!.id, 'CANCELLED', 'trace-m2');
      expect(second.settle).toEqual({ redis: 1, postgres: 0, unresolved: 0, withheld: 0, deferred: 0 });
      expect(await redisStock(activityId, skuId)).toBe('4');
      expect(await withheldReturnedFor(s2!.id)).toBe(f2!.id);
      const report = await audit(activityId);
      expect(report).toMatchObject({ ok: true, mismatches: [] });
      expect(report.figures).toMatchObject({ held: 0, accounted: 0, closedUnresolved: 0 });
    },
    TIMEOUT_MS,
  );

  it(
    "forgotten orders without a buyer's stand-in: a unit the guard withheld goes back only once Redis holds it beyond them",
    async () => {
      // 3 units; a and b reach PostgreSQL, then Redis forgets both; c and d buy again: one of them
      // is the third live unit, the other (d below) is closed OVERSELL_PREVENTED, its unit withheld.
      const sale = await forgottenSale({ stock: 3 }, ['a', 'b'], ['c', 'd']);
      const { activityId, skuId } = sale;
      const [a, b] = sale.firstWave;
      // Whichever of the two the guard closed (the newest by its order).
      const d = sale.secondWave.find((r) => r.status === 'CLOSED');
      expect(d).toMatchObject({ closeReason: 'OVERSELL_PREVENTED', stockReturnVia: 'withheld' });
      expect(await redisStock(activityId, skuId)).toBe('1');

      // a times out: b is still live and forgotten, and Redis' free unit is the one b left, so
      // Redis and PostgreSQL agree (1 free each) and nothing goes back: 'unresolved', as before.
      expect((await closeOrder(f.deps, a!.id, 'PAYMENT_TIMEOUT', 'trace-a')).settle).toMatchObject({
        redis: 0,
        unresolved: 1,
      });
      expect(await redisStock(activityId, skuId)).toBe('1');
      expect(await withheldReturnedFor(d!.id)).toBeNull();

      // b times out: now d's withheld unit is one Redis holds beyond everything: it goes back.
      expect((await closeOrder(f.deps, b!.id, 'PAYMENT_TIMEOUT', 'trace-b')).settle).toMatchObject({
        redis: 1,
        unresolved: 0,
      });
      expect(await redisStock(activityId, skuId)).toBe('2');
      expect(await withheldReturnedFor(d!.id)).toBe(b!.id);
      expect(await settleStock(f.deps, [b!])).toMatchObject({ redis: 0, unresolved: 0 });
      expect(await redisStock(activityId, skuId)).toBe('2');
      // 2 free in Redis and in PostgreSQL (3 less the second wave's live unit); a stays flagged.
      const report = await audit(activityId);
      expect(report.figures).toMatchObject({ held: 1, accounted: 1, closedUnresolved: 1 });
      expect(report.mismatches.map((m) => m.check)).toEqual(['unresolved-returns']);
      expect((await readActivitySkus(f.pool, activityId))[0]).toMatchObject({ sold: 1 });
    },
    TIMEOUT_MS,
  );

  /**
   * 2 units; h reaches PostgreSQL and Redis forgets it; i and j buy: i is the second live unit,
   * j is closed OVERSELL_PREVENTED with its unit withheld. Redis has taken 2 (i and j), PostgreSQL
   * holds h and i: once h is closed, j's unit is beyond everything and due back.
   */
  const oneForgottenOneWithheld = async (): Promise<{
    activityId: string;
    skuId: string;
    h: LifecycleOrderRow;
    i: LifecycleOrderRow;
    j: LifecycleOrderRow;
  }> => {
    const sale = await forgottenSale({ stock: 2 }, ['h'], ['i', 'j']);
    const i = sale.secondWave.find((r) => r.status !== 'CLOSED');
    const j = sale.secondWave.find((r) => r.status === 'CLOSED');
    expect(j).toMatchObject({ closeReason: 'OVERSELL_PREVENTED', stockReturnVia: 'withheld' });
    expect(await redisStock(sale.activityId, sale.skuId)).toBe('0');
    return { activityId: sale.activityId, skuId: sale.skuId, h: sale.firstWave[0]!, i: i!, j: j! };
  };

  it(
    'an order in PostgreSQL whose ledger entry is not removed yet is counted once: the withheld unit goes back',
    async () => {
      const { activityId, skuId, h, i, j } = await oneForgottenOneWithheld();
      const k = activityKeys(activityId);
      // The consumer inserted i and was killed before removing its ledger entry.
      expect(await f.redis.zadd(k.ledger, Date.now(), i.reservationId)).toBe(1);

      expect((await closeOrder(f.deps, h.id, 'PAYMENT_TIMEOUT', 'trace-h')).settle).toMatchObject({
        redis: 1,
        unresolved: 0,
      });
      expect(await redisStock(activityId, skuId)).toBe('1');
      expect(await withheldReturnedFor(j.id)).toBe(h.id);
      expect((await journalFor(f.pool, j.reservationId)).map((e) => e.event)).toContain(
        'WITHHELD_STOCK_RETURNED',
      );
      // The next consumer confirms i: 1 free in Redis and in PostgreSQL, nothing flagged.
      await f.redis.zrem(k.ledger, i.reservationId);
      expect(await audit(activityId)).toMatchObject({ ok: true, mismatches: [] });
    },
    TIMEOUT_MS,
  );

  it(
    'a closed order whose release Redis has run, its settlement not recorded yet, holds nothing there: the withheld unit goes back',
    async () => {
      const { activityId, skuId, h, i, j } = await oneForgottenOneWithheld();
      // i is cancelled; its release ran in Redis, its settlement's transaction did not (killed).
      expect((await closeOrder(f.deps, i.id, 'CANCELLED', 'trace-i')).settle).toMatchObject({ redis: 1 });
      await f.pool.query(`UPDATE orders SET stock_returned = false, stock_return_via = NULL WHERE id = $1`, [
        i.id,
      ]);
      expect(await redisStock(activityId, skuId)).toBe('1');

      expect((await closeOrder(f.deps, h.id, 'PAYMENT_TIMEOUT', 'trace-h')).settle).toMatchObject({
        redis: 1,
        unresolved: 0,
      });
      expect(await redisStock(activityId, skuId)).toBe('2');
      expect(await withheldReturnedFor(j.id)).toBe(h.id);
      // The sweeper records i's settlement (its release answers "already released").
      expect(await settleStock(f.deps, [i])).toMatchObject({ redis: 1, unresolved: 0 });
      expect(await redisStock(activityId, skuId)).toBe('2');
      expect(await audit(activityId)).toMatchObject({ ok: true, mismatches: [] });
    },
    TIMEOUT_MS,
  );

  it(
    'a guard closure not settled yet holds nothing in PostgreSQL: its unit is counted withheld and another goes back',
    async () => {
      // 2 units; h and h2 reach PostgreSQL, Redis forgets both; i and j buy and are both closed
      // OVERSELL_PREVENTED. j's release withheld its unit in Redis; its settlement's transaction
      // did not run (killed).
      const sale = await forgottenSale({ stock: 2 }, ['h', 'h2'], ['i', 'j']);
      const { activityId, skuId } = sale;
      const [h] = sale.firstWave;
      const [i, j] = sale.secondWave;
      for (const w of [i, j])
        expect(w).toMatchObject({ closeReason: 'OVERSELL_PREVENTED', stockReturnVia: 'withheld' });
      await f.pool.query(`UPDATE orders SET stock_return_via = NULL WHERE id = $1`, [j!.id]);
      expect(await redisStock(activityId, skuId)).toBe('0');

      // h times out: i and j stand in for h and h2, so one of them is due back; j's own release
      // is not recorded yet, so it is i's.
      expect((await closeOrder(f.deps, h!.id, 'PAYMENT_TIMEOUT', 'trace-h')).settle).toMatchObject({
        redis: 1,
        unresolved: 0,
      });
      expect(await redisStock(activityId, skuId)).toBe('1');
      expect(await withheldReturnedFor(i!.id)).toBe(h!.id);
      // The sweeper records j's settlement: still withheld, standing in for h2.
      expect(await settleStock(f.deps, [j!])).toMatchObject({ withheld: 1 });
      expect(await redisStock(activityId, skuId)).toBe('1');
      expect(await audit(activityId)).toMatchObject({ ok: true, mismatches: [] });
    },
    TIMEOUT_MS,
  );

  it(
    'a reservation in flight took the unit a forgotten order left free: nothing goes back for it',
    async () => {
      // 2 units; h and h2 reach PostgreSQL, then Redis forgets both; i buys and is closed
      // OVERSELL_PREVENTED (its unit withheld, standing in for one of them); k buys the other
      // unit Redis shows free, its reservation not in PostgreSQL yet.
      const sale = await forgottenSale({ stock: 2 }, ['h', 'h2'], ['i']);
      const { activityId, skuId } = sale;
      const [h] = sale.firstWave;
      const [i] = sale.secondWave;
      expect(i).toMatchObject({ closeReason: 'OVERSELL_PREVENTED', stockReturnVia: 'withheld' });
      const [k] = await reserveFor(f.redis, activityId, skuId, ['k']);
      expect(await redisStock(activityId, skuId)).toBe('0');

      // h times out: its unit is k's now and i's stands in for h2, still live: nothing goes back.
      expect((await closeOrder(f.deps, h!.id, 'PAYMENT_TIMEOUT', 'trace-h')).settle).toMatchObject({
        redis: 0,
        unresolved: 1,
      });
      expect(await redisStock(activityId, skuId)).toBe('0');
      expect(await withheldReturnedFor(i!.id)).toBeNull();
      // k reaches PostgreSQL live, in the unit h freed there: 0 free on either side.
      const topics = topicsFor(activityId, prefix);
      await send(topics, await orderMessagesOf(f.redis, activityId, [k!]));
      const row = await until('k in PostgreSQL', () => findLifecycleByReservationId(f.pool, k!));
      expect(row.status).toBe('UNPAID');
      expect((await readActivitySkus(f.pool, activityId))[0]).toMatchObject({ stock: 2, sold: 2 });
    },
    TIMEOUT_MS,
  );

  it(
    'two settlers of one forgotten order at once: one unit goes back, not one each',
    async () => {
      // 2 units; e1 and e2 reach PostgreSQL, Redis forgets both; g1 and g2 buy and are both
      // closed OVERSELL_PREVENTED, standing in for e1 and e2.
      const sale = await forgottenSale({ stock: 2 }, ['e1', 'e2'], ['g1', 'g2']);
      const { activityId, skuId } = sale;
      const [e1, e2] = sale.firstWave;
      const [g1, g2] = sale.secondWave;
      for (const w of [g1, g2])
        expect(w).toMatchObject({ closeReason: 'OVERSELL_PREVENTED', stockReturnVia: 'withheld' });
      // e1 is closed; two sweepers settle it at the same moment. The one that measures second
      // must not find the other's given-back unit as a second one beyond (e1 no longer unsettled).
      expect((await transitionOrder(f.pool, e1!.id, 'CLOSE', 'PAYMENT_TIMEOUT')).applied).toBe(true);
      const [a, b] = await Promise.all([settleStock(f.deps, [e1!]), settleStock(f.deps, [e1!])]);
      expect(a.redis + b.redis).toBe(1);
      expect(a.unresolved + b.unresolved).toBe(0);
      expect(await redisStock(activityId, skuId)).toBe('1');
      const returnedFor = [await withheldReturnedFor(g1!.id), await withheldReturnedFor(g2!.id)];
      expect(returnedFor.filter((x) => x === e1!.id)).toHaveLength(1);
      expect(returnedFor.filter((x) => x === null)).toHaveLength(1);
      expect(await audit(activityId)).toMatchObject({ ok: true, mismatches: [] });

      // e2 times out: the other closure's unit goes back.
      expect((await closeOrder(f.deps, e2!.id, 'PAYMENT_TIMEOUT', 'trace-e2')).settle).toMatchObject({
        redis: 1,
        unresolved: 0,
      });
      expect(await redisStock(activityId, skuId)).toBe('2');
      expect(await audit(activityId)).toMatchObject({ ok: true, mismatches: [] });
    },
    TIMEOUT_MS,
  );

  it(
    'a settler killed after Redis gave back a unit the guard withheld beyond the stock: the next one records it',
    async () => {
      const { activityId, skuId, firstWave, secondWave } = await forgottenSale({ stock: 1 }, ['e'], ['g']);
      const [forgotten] = firstWave;
      const [closure] = secondWave;
      expect(closure).toMatchObject({ closeReason: 'OVERSELL_PREVENTED', stockReturnVia: 'withheld' });
      // What the settler left: the order closed in PostgreSQL, the unit given back in Redis.
      expect((await transitionOrder(f.pool, forgotten!.id, 'CLOSE', 'PAYMENT_TIMEOUT')).applied).toBe(true);
      await expect(
        returnWithheld(f.redis, { ...closure!, forOrderId: forgotten!.id }),
      ).resolves.toMatchObject({
        kind: 'returned',
      });
      expect(await settleStock(f.deps, [forgotten!])).toMatchObject({ redis: 1, unresolved: 0 });
      expect(await redisStock(activityId, skuId)).toBe('1');
      expect(await withheldReturnedFor(closure!.id)).toBe(forgotten!.id);
      expect(await audit(activityId)).toMatchObject({ ok: true, mismatches: [] });
    },
    TIMEOUT_MS,
  );

  it(
    'an activity whose stock the operator did not record is guarded from the stock the cache was loaded with',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 3 });
      await f.redis.hincrby(activityKeys(activityId).sku(skuId), 'stock', 2);
      const rids = await reserveFor(f.redis, activityId, skuId, ['c0', 'c1', 'c2', 'c3', 'c4']);
      await startConsumer(activityId, topics);
      await send(topics, await orderMessagesOf(f.redis, activityId, rids));
      await ordersOf(activityId, 5);

      expect(await readActivitySkus(f.pool, activityId)).toEqual([
        expect.objectContaining({ skuId, stock: 3, sold: 3, limitPerUser: 1, seededFrom: 'cache' }),
      ]);
      expect(await liveUnits(activityId)).toBe(3);
      expect(await closedBy(activityId, 'OVERSELL_PREVENTED')).toBe(2);
    },
    TIMEOUT_MS,
  );
});
