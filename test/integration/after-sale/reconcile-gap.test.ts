// Reconciliation detects injected Redis and PostgreSQL mismatches (report row, metric, log), live
// and after write-back; order-gap repair turns a reservation whose outbox entry was lost into
// exactly one order (re-published through Kafka to the real consumer, even when re-published
// twice) or exactly one compensation when it can never become an order.
import type { Admin, Kafka, Producer } from 'kafkajs';
import { cleanupActivity, readStock, setGate } from '../../../core/activity-cache.js';
import { recordActivityItems } from '../../../core/db/activity-items-store.js';
import { latestReports, purgeOldReports } from '../../../core/db/reconciliation-store.js';
import { writeBack } from '../../../core/db/stock-store.js';
import { gapRepairOf } from '../../../core/db/gap-repairs-store.js';
import { journalFor } from '../../../core/db/journal-store.js';
import { findLifecycleByReservationId } from '../../../core/db/orders-store.js';
import { createKafka, idempotentProducer, topicsFor } from '../../../core/kafka.js';
import { activityKeys } from '../../../core/keys.js';
import { closeOrder } from '../../../core/order-lifecycle.js';
import { readReservation } from '../../../core/reservations.js';
import type { OrderConsumer } from '../../../runtime/consumer/consumer.js';
import { checkOrderGap, GapPage } from '../../../runtime/jobs/gauges.js';
import { repairOrderGap } from '../../../runtime/jobs/gap-repair.js';
import type { GapRepairDeps } from '../../../runtime/jobs/gap-repair.js';
import { auditStock } from '../../../runtime/jobs/stock-audit.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import { cleanupKilledAtFirstDelete } from '../../fixtures/interrupted-cleanup.js';
import {
  counters,
  countRows,
  freezeAndWriteBack,
  materialize,
  notify,
  observedConsumer,
  openActivity,
  openActivityWithTopics,
  orderConsumerFor,
  reserveFor,
  setUp,
  skuStock,
  startApi,
  TIMEOUT_MS,
  type Fixture,
  until,
} from './fixture.js';

describe('reconciliation', () => {
  let f: Fixture;

  beforeAll(async () => {
    f = await setUp();
  }, TIMEOUT_MS);
  afterAll(async () => {
    await f?.close();
  }, TIMEOUT_MS);

  const reconcile = (activityId: string) => auditStock({ ...f.deps, activityId, remeasureDelayMs: 20 });
  const mismatchGauge = async (activityId: string) =>
    (await f.metrics.reconciliationMismatch.get()).values.find((v) => v.labels.activity === activityId)
      ?.value;

  it(
    'a consistent activity (paid, closed, unpaid and in-flight) reconciles; injected mismatches are reported',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 50, price: '3.00' });
      const users = Array.from({ length: 12 }, (_, i) => `rec-${i}`);
      const rids = await reserveFor(f.redis, activityId, skuId, users);
      const ids = await materialize(f.pool, f.redis, activityId, rids.slice(0, 9)); // 3 stay in flight
      const api = await startApi(f);
      try {
        for (const rid of rids.slice(0, 3)) {
          await notify(api, { orderId: ids.get(rid)!, tradeNo: `rec-${rid}`, amount: '3.00' });
        }
      } finally {
        await api.close();
      }
      for (const rid of rids.slice(3, 6)) await closeOrder(f.deps, ids.get(rid)!, 'CANCELLED', 'test');

      const ok = await reconcile(activityId);
      expect([ok.basis, ok.ok, ok.mismatches]).toEqual(['redis', true, []]);
      expect(ok.figures).toMatchObject({
        held: 9,
        accounted: 9,
        liveOrderQuantity: 6,
        inFlightQuantity: 3,
        paid: 3,
        closedViaRedis: 3,
        appliedPayments: 3,
      });
      expect(await mismatchGauge(activityId)).toBe(0);

      // Redis: stock appears from nowhere (a bad manual fix, a replayed script, ...).
      await f.redis.hincrby(activityKeys(activityId).sku(skuId), 'stock', 2);
      const bad = await reconcile(activityId);
      expect(bad.ok).toBe(false);
      expect(bad.mismatches.map((m) => [m.check, m.expected, m.actual])).toEqual([
        ['redis-counters', 7, 9],
        ['stock-held', 7, 9],
      ]);
      expect(await mismatchGauge(activityId)).toBe(2);
      const [report] = await latestReports(f.pool, activityId, 1);
      expect([report?.id, report?.ok, report?.basis]).toEqual([bad.reportId, false, 'redis']);
      expect(report?.mismatches.map((m) => m.check)).toEqual(['redis-counters', 'stock-held']);
      await f.redis.hincrby(activityKeys(activityId).sku(skuId), 'stock', -2);
      expect((await reconcile(activityId)).ok).toBe(true);

      // PostgreSQL: an order's quantity differs from its reservation.
      await f.pool.query(`UPDATE orders SET quantity = 2 WHERE reservation_id = $1`, [rids[6]]);
      const pg = await reconcile(activityId);
      expect(pg.mismatches.map((m) => [m.check, m.expected, m.actual])).toEqual([['stock-held', 9, 10]]);
      await f.pool.query(`UPDATE orders SET quantity = 1 WHERE reservation_id = $1`, [rids[6]]);

      // A paid order without its payment row.
      await f.pool.query(`DELETE FROM payments WHERE reservation_id = $1`, [rids[0]]);
      const pay = await reconcile(activityId);
      expect(pay.mismatches.map((m) => m.check)).toEqual(['paid-without-payment']);
    },
    TIMEOUT_MS,
  );

  it(
    'orders written while the audit reads PostgreSQL are no mismatch: every PostgreSQL figure comes from one snapshot',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 50, price: '3.00' });
      const rids = await reserveFor(
        f.redis,
        activityId,
        skuId,
        Array.from({ length: 6 }, (_, i) => `flow-${i}`),
      );
      await materialize(f.pool, f.redis, activityId, rids.slice(0, 2));
      // The consumer writes the order of an in-flight reservation just after the audit has read the
      // orders' quantities, on each of its measurements.
      const waiting = rids.slice(2);
      const pool = new Proxy(f.pool, {
        get(t, prop) {
          const hook =
            <T extends object>(target: T) =>
            (p: string | symbol): unknown => {
              const v: unknown = Reflect.get(target, p);
              if (p !== 'query')
                return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
              return async (...args: unknown[]) => {
                const result = await (v as (...a: unknown[]) => Promise<unknown>).apply(target, args);
                const next = waiting[0];
                if (/GROUP BY 1, 2, 3/.test(String(args[0])) && next) {
                  waiting.shift();
                  await materialize(f.pool, f.redis, activityId, [next]);
                }
                return result;
              };
            };
          if (prop === 'connect')
            return async () => {
              const client = await t.connect();
              return new Proxy(client, { get: (c, p) => hook(c)(p) });
            };
          return hook(t)(prop);
        },
      });
      const audit = await auditStock({ ...f.deps, pool, activityId, remeasureDelayMs: 20 });
      expect(waiting.length).toBeLessThan(4); // the hook ran
      expect([audit.ok, audit.mismatches]).toEqual([true, []]);
      expect(audit.figures).toMatchObject({ held: 6, accounted: 6 });
    },
    TIMEOUT_MS,
  );

  it(
    'after write-back PostgreSQL is the basis; an activity_stock mismatch is reported',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 20 });
      const rids = await reserveFor(f.redis, activityId, skuId, ['wb-1', 'wb-2', 'wb-3']);
      await materialize(f.pool, f.redis, activityId, rids);
      await setGate(f.redis, activityId, 'frozen');
      const frozenNoWriteBack = await reconcile(activityId);
      expect(frozenNoWriteBack.basis).toBe('skipped');
      const s = await readStock(f.redis, activityId);
      await writeBack(f.pool, {
        activityId,
        generation: 1,
        skus: s.skus,
        reserved: s.reserved,
        released: s.released,
        orders: 3,
        writtenBy: 'test',
      });
      const ok = await reconcile(activityId);
      expect([ok.basis, ok.ok, ok.figures.held, ok.figures.accounted]).toEqual(['postgres', true, 3, 3]);
      await f.pool.query(`UPDATE activity_stock SET remaining = remaining + 1 WHERE activity_id = $1`, [
        activityId,
      ]);
      const bad = await reconcile(activityId);
      expect(bad.mismatches.map((m) => [m.check, m.expected, m.actual])).toEqual([['stock-held', 2, 3]]);
    },
    TIMEOUT_MS,
  );
  it(
    'a cleanup stopped half-way leaves partial keys: the audit reads PostgreSQL only, no false mismatch',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 20 });
      const k = activityKeys(activityId);
      const rids = await reserveFor(f.redis, activityId, skuId, ['cl-1', 'cl-2', 'cl-3']);
      await materialize(f.pool, f.redis, activityId, rids);
      // The relay sent the half messages (their orders are in PostgreSQL): cleanup may run.
      await f.redis.del(k.outbox);
      await freezeAndWriteBack(f, activityId, 3);
      const before = await reconcile(activityId);
      expect([before.basis, before.ok, before.figures.redisReserved]).toEqual(['postgres', true, 3]);

      // The operator dies at cleanup's first delete (a client whose UNLINK never arrives).
      await cleanupKilledAtFirstDelete(f.redis, activityId);
      expect(await f.redis.hexists(k.meta, 'cleanupBegan')).toBe(1);
      // A cleanup that got further deletes keys in SCAN's order, the counters hash perhaps
      // before the SKUs' hashes: Redis' own figures disagree until the meta hash goes last.
      expect(await f.redis.del(k.counters)).toBe(1);
      const partial = await reconcile(activityId);
      expect([partial.basis, partial.ok, partial.mismatches]).toEqual(['postgres', true, []]);
      expect([partial.figures.held, partial.figures.accounted]).toEqual([3, 3]);
      expect(partial.figures.redisReserved).toBeUndefined();
      expect(partial.figures.cleanupBegan).toEqual(expect.any(String));
      expect(await mismatchGauge(activityId)).toBe(0);

      // The cleanup run again completes; the audit still reads PostgreSQL alone.
      await cleanupActivity(f.redis, activityId, 60);
      expect(await f.redis.exists(k.meta)).toBe(0);
      const after = await reconcile(activityId);
      expect([after.basis, after.ok, after.figures.gate]).toEqual(['postgres', true, 'absent']);
    },
    TIMEOUT_MS,
  );
  it(
    "reports older than the retention are deleted after a run: never an activity's newest, never another activity's",
    async () => {
      const { activityId } = await openActivity(f.redis, { stock: 5 });
      const other = uniqueId('rec-other');
      const finished = uniqueId('rec-finished');
      const aged = async (activity: string, daysAgo: number): Promise<string> =>
        (
          await f.pool.query<{ id: string }>(
            `INSERT INTO reconciliation_reports (activity_id, basis, ok, created_at)
             VALUES ($1, 'skipped', true, now() - make_interval(days => $2)) RETURNING id`,
            [activity, daysAgo],
          )
        ).rows[0]!.id;
      const ids = async (activity: string): Promise<string[]> =>
        (
          await f.pool.query<{ id: string }>(
            'SELECT id FROM reconciliation_reports WHERE activity_id = $1 ORDER BY id',
            [activity],
          )
        ).rows.map((r) => r.id);
      await aged(activityId, 45);
      await aged(activityId, 31);
      const recent = await aged(activityId, 29);
      const otherOld = await aged(other, 45);

      // Retention 0 keeps every report.
      const kept = await auditStock({ ...f.deps, activityId, remeasureDelayMs: 20, reportRetentionDays: 0 });
      expect(await ids(activityId)).toHaveLength(4);
      const run = await auditStock({ ...f.deps, activityId, remeasureDelayMs: 20, reportRetentionDays: 30 });
      expect(await ids(activityId)).toEqual([recent, kept.reportId, run.reportId]);
      expect(await ids(other)).toEqual([otherOld]);

      // An activity whose reports are all old (its jobs stopped long ago) keeps its last verdict.
      await aged(finished, 60);
      const last = await aged(finished, 50);
      expect(await purgeOldReports(f.pool, finished, 30 * 86_400)).toBe(1);
      expect(await ids(finished)).toEqual([last]);
      expect(await purgeOldReports(f.pool, finished, 30 * 86_400)).toBe(0);
    },
    TIMEOUT_MS,
  );
});

describe('order-gap repair', () => {
  let f: Fixture;
  let kafka: Kafka;
  let admin: Admin;
  let producer: Producer;
  let consumer: OrderConsumer | undefined;
  const prefix = uniqueId('gap');

  beforeAll(async () => {
    f = await setUp();
    kafka = createKafka(testEnv().kafkaBrokers, uniqueId('gap-test'));
    admin = kafka.admin();
    await admin.connect();
    producer = idempotentProducer(kafka);
    await producer.connect();
  }, TIMEOUT_MS);

  afterAll(async () => {
    await consumer?.stop();
    await producer?.disconnect();
    await admin?.disconnect();
    await f?.close();
  }, TIMEOUT_MS);

  const deps = (activityId: string): GapRepairDeps => ({
    ...f.deps,
    activityId,
    topic: topicsFor(activityId, prefix).orders,
    producer,
    republishIntervalSeconds: 0,
    maxRepublish: 5,
  });

  it(
    'reservations the repair holds back do not hide later ones from it: the check turns the page',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 10 }, f.pool);
      // Four reservations without an order (no consumer runs): as if the oldest three were held
      // back for good (refused, re-published the most times), with a page of three.
      const rids = await reserveFor(f.redis, activityId, skuId, ['held-0', 'held-1', 'held-2', 'later']);
      const page = new GapPage(3);
      const check = async () =>
        (
          await checkOrderGap(
            { activityId, redis: f.redis, pool: f.pool, gapThresholdSeconds: 0 },
            Date.now() + 1,
            page,
          )
        ).missing;
      const first = await check();
      const second = await check();
      expect([first.length, second.length]).toEqual([3, 1]);
      expect([...first, ...second].sort()).toEqual([...rids].sort());
      // A short page starts again from the oldest.
      expect(await check()).toEqual(first);
    },
    TIMEOUT_MS,
  );

  it(
    'an invalid ledger entry found after the freeze: its unit back in activity_stock once written back, exactly once, and cleanup runs',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 10 }, f.pool);
      const [rid] = await reserveFor(f.redis, activityId, skuId, ['frozen-invalid']);
      const k = activityKeys(activityId);
      // An entry that cannot form a valid order (an empty item name); its half message is gone.
      await f.redis.hset(k.reservation(rid!), 'name', '');
      await f.redis.del(k.outbox);
      // The drain timed out before the entry was compensated: the operator freezes the gate.
      await setGate(f.redis, activityId, 'frozen');
      const gap = await checkOrderGap(
        { activityId, redis: f.redis, pool: f.pool, gapThresholdSeconds: 0 },
        Date.now() + 1,
      );
      expect(gap.missing).toEqual([rid]);
      // Redis refuses the release, and the snapshot is not committed yet: retried next run.
      const early = await repairOrderGap(deps(activityId), gap.missing);
      expect([early.failed, early.compensated]).toEqual([[rid], []]);
      expect(await f.redis.zscore(k.ledger, rid!)).not.toBeNull();

      await freezeAndWriteBack(f, activityId, 0);
      const pgRemaining = () =>
        countRows(f.pool, `SELECT remaining AS n FROM activity_stock WHERE activity_id = $1`, [activityId]);
      expect(await pgRemaining()).toBe(9);
      // Two job replicas at once: the unit goes back once.
      const [a, b] = await Promise.all([
        repairOrderGap(deps(activityId), [rid!]),
        repairOrderGap(deps(activityId), [rid!]),
      ]);
      expect([...a.compensated, ...b.compensated]).toEqual([rid]);
      expect(await pgRemaining()).toBe(10);
      expect(await f.redis.zscore(k.ledger, rid!)).toBeNull();
      expect((await journalFor(f.pool, rid!)).map((j) => j.event)).toEqual(['GAP_COMPENSATED']);
      const after = await checkOrderGap(
        { activityId, redis: f.redis, pool: f.pool, gapThresholdSeconds: 0 },
        Date.now() + 1,
      );
      expect([after.gap, after.missing]).toEqual([0, []]);
      expect((await repairOrderGap(deps(activityId), [rid!])).compensated).toEqual([]);
      expect(await pgRemaining()).toBe(10);

      // Nothing in flight any more: cleanup runs, and the audit finds PostgreSQL consistent.
      await cleanupActivity(f.redis, activityId, 60);
      const audit = await auditStock({ ...f.deps, activityId, remeasureDelayMs: 20 });
      expect([audit.basis, audit.ok, audit.figures.held, audit.figures.accounted]).toEqual([
        'postgres',
        true,
        0,
        0,
      ]);
    },
    TIMEOUT_MS,
  );

  it(
    'two replicas repairing one invalid entry: the one whose release comes second (already released, or refused by the freeze) returns nothing and journals nothing',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 10 }, f.pool);
      const rids = await reserveFor(f.redis, activityId, skuId, ['raced-open', 'raced-frozen']);
      const k = activityKeys(activityId);
      for (const rid of rids) await f.redis.hset(k.reservation(rid), 'name', '');
      await f.redis.del(k.outbox);
      /** Replica X: reads the entry RESERVED, then its release waits until `go()`. */
      const slowReplica = () => {
        let go: () => void = () => undefined;
        const gate = new Promise<void>((resolve) => (go = resolve));
        let waiting = false;
        const redis = new Proxy(f.redis, {
          get(t, prop) {
            const v: unknown = Reflect.get(t, prop);
            if (prop === 'fs_release')
              return async (...args: unknown[]) => {
                waiting = true;
                await gate;
                return (v as (...a: unknown[]) => Promise<unknown>).apply(t, args);
              };
            return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
          },
        });
        return { redis, go: () => go(), waiting: () => waiting };
      };
      const journalled = async (rid: string) =>
        (await journalFor(f.pool, rid)).filter((j) => j.event === 'GAP_COMPENSATED').length;

      // While selling: Y releases first; X's release then finds it released.
      const x1 = slowReplica();
      const first = repairOrderGap({ ...deps(activityId), redis: x1.redis }, [rids[0]!]);
      await until('X reads the entry and waits', async () => x1.waiting());
      expect((await repairOrderGap(deps(activityId), [rids[0]!])).compensated).toEqual([rids[0]]);
      x1.go();
      expect((await first).compensated).toEqual([]);
      expect(await journalled(rids[0]!)).toBe(1);

      // Across the freeze: Y releases the unit to Redis, the write-back counts it, then X's release
      // is refused FROZEN. The unit is in activity_stock once.
      const x2 = slowReplica();
      const second = repairOrderGap({ ...deps(activityId), redis: x2.redis }, [rids[1]!]);
      await until('X reads the entry and waits', async () => x2.waiting());
      expect((await repairOrderGap(deps(activityId), [rids[1]!])).compensated).toEqual([rids[1]]);
      await freezeAndWriteBack(f, activityId, 0);
      const remaining = () =>
        countRows(f.pool, `SELECT remaining AS n FROM activity_stock WHERE activity_id = $1`, [activityId]);
      expect(await remaining()).toBe(10);
      x2.go();
      expect((await second).compensated).toEqual([]);
      expect(await remaining()).toBe(10);
      expect(await journalled(rids[1]!)).toBe(1);
    },
    TIMEOUT_MS,
  );

  it(
    'a reservation whose outbox entry was deleted becomes exactly one order, even when re-published twice',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 10 });
      const [rid] = await reserveFor(f.redis, activityId, skuId, ['lost-1']);
      // The half message is lost (e.g. the stream was trimmed by hand): only the ledger knows it.
      const k = activityKeys(activityId);
      const entries = await f.redis.xrange(k.outbox, '-', '+');
      expect(entries).toHaveLength(1);
      await f.redis.xdel(k.outbox, entries[0]![0]);

      const gap = await checkOrderGap(
        { activityId, redis: f.redis, pool: f.pool, gapThresholdSeconds: 0 },
        Date.now() + 1,
      );
      expect(gap.missing).toEqual([rid]);
      const first = await repairOrderGap(deps(activityId), gap.missing);
      const second = await repairOrderGap(deps(activityId), gap.missing);
      expect([first.republished, second.republished]).toEqual([[rid], [rid]]);

      const observed = observedConsumer(
        kafka.consumer({ groupId: topics.consumerGroup, maxWaitTimeInMs: 200 }),
      );
      consumer = orderConsumerFor(f, kafka, activityId, topics, () => observed.consumer);
      await consumer.start();
      // Both copies (offsets 0 and 1) processed, then exactly one order.
      await until('both copies consumed', async () =>
        (observed.processed().get(0) ?? -1) >= 1 ? true : undefined,
      );
      expect(
        await countRows(f.pool, 'SELECT count(*) AS n FROM orders WHERE reservation_id = $1', [rid]),
      ).toBe(1);
      expect((await findLifecycleByReservationId(f.pool, rid!))?.status).toBe('UNPAID');
      const after = await checkOrderGap(
        { activityId, redis: f.redis, pool: f.pool, gapThresholdSeconds: 0 },
        Date.now() + 1,
      );
      expect(after.gap).toBe(0);
      expect((await journalFor(f.pool, rid!)).map((j) => j.event)).toEqual([
        'GAP_REPUBLISHED',
        'GAP_REPUBLISHED',
        'ORDER_CREATED',
      ]);
      expect(
        (await f.metrics.orderGapRepairs.get()).values.find((v) => v.labels.activity === activityId)?.value,
      ).toBe(2);
      // Re-publication is bounded: with the interval not elapsed nothing is sent again.
      const bounded = await repairOrderGap({ ...deps(activityId), republishIntervalSeconds: 3600 }, [rid!]);
      expect(bounded.waiting).toEqual([rid]);
    },
    TIMEOUT_MS,
  );

  it(
    'a send that fails (brokers away) does not use up the re-publication cap',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 10 });
      const [rid] = await reserveFor(f.redis, activityId, skuId, ['outage']);
      await f.redis.del(activityKeys(activityId).outbox);
      // The real producer, failing as it does while no broker answers.
      const away = {
        ...producer,
        send: async () => {
          throw new Error('Connection error: connect ECONNREFUSED (test: brokers away)');
        },
      } as Producer;
      const capped = { ...deps(activityId), maxRepublish: 2 };
      for (let run = 0; run < 4; run++) {
        const r = await repairOrderGap({ ...capped, producer: away }, [rid!]);
        expect([r.failed, r.abandoned, r.republished]).toEqual([[rid], [], []]);
      }
      expect(await gapRepairOf(f.pool, activityId, rid!)).toEqual({ attempts: 0, lastAction: 'send-failed' });
      // The brokers back: re-published, as its first attempt, and sent once.
      const back = await repairOrderGap(capped, [rid!]);
      expect(back.republished).toEqual([rid]);
      expect(await gapRepairOf(f.pool, activityId, rid!)).toEqual({ attempts: 1, lastAction: 'republished' });
      expect((await admin.fetchTopicOffsets(topics.orders)).reduce((n, p) => n + Number(p.high), 0)).toBe(1);
      expect((await journalFor(f.pool, rid!)).map((j) => j.event)).toEqual(['GAP_REPUBLISHED']);
    },
    TIMEOUT_MS,
  );

  it(
    'a reservation the consumer would refuse is not re-published (no dead letter per attempt) until its item is corrected',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, {
        stock: 10,
        price: '19.90',
      });
      const [rid] = await reserveFor(f.redis, activityId, skuId, ['priced']);
      await f.redis.del(activityKeys(activityId).outbox);
      // PostgreSQL's item no longer matches the ledger's price: the consumer refuses the message
      // (dead-lettered once, when the relay sent it). Re-publishing would dead-letter it again.
      const item = (name = '秒杀商品 flash item', price = '25.00') => ({
        skuId,
        name,
        price,
        limitPerUser: 1,
      });
      await recordActivityItems(f.pool, activityId, 1, [item()], { replace: true });
      const gapNow = async () =>
        (
          await checkOrderGap(
            { activityId, redis: f.redis, pool: f.pool, gapThresholdSeconds: 0 },
            Date.now() + 1,
          )
        ).missing;
      expect(await gapNow()).toEqual([rid]);
      const sent = async () =>
        (await admin.fetchTopicOffsets(topics.orders)).reduce((n, p) => n + Number(p.high), 0);

      for (let run = 0; run < 3; run++) {
        const r = await repairOrderGap(deps(activityId), [rid!]);
        expect([r.refused, r.republished]).toEqual([[rid], []]);
      }
      expect(await sent()).toBe(0);
      expect(
        await countRows(f.pool, 'SELECT count(*) AS n FROM order_gap_repairs WHERE reservation_id = $1', [
          rid,
        ]),
      ).toBe(0);
      expect(
        (await f.metrics.orderGapRepairs.get()).values.find(
          (v) => v.labels.activity === activityId && v.labels.action === 'refused',
        )?.value,
      ).toBe(3);

      // The item corrected: the next run re-publishes it, once.
      await recordActivityItems(f.pool, activityId, 1, [item(undefined, '19.90')], { replace: true });
      const fixed = await repairOrderGap(deps(activityId), [rid!]);
      expect([fixed.refused, fixed.republished]).toEqual([[], [rid]]);
      expect(await sent()).toBe(1);
    },
    TIMEOUT_MS,
  );

  it(
    'a reservation that can never become an order (buyer slot held by a live order) is compensated exactly once',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 10, limitPerUser: 1 });
      const [first] = await reserveFor(f.redis, activityId, skuId, ['twin']);
      await materialize(f.pool, f.redis, activityId, [first!]);
      // Redis forgot the first reservation (a failover to a replica that missed it; Redis loses a
      // suffix of its writes): the buyer's slot and the stock decrement with it. A second
      // reservation takes slot 1 again, and the forgotten unit.
      const k = activityKeys(activityId);
      await f.redis.del(k.buyer('twin'));
      await f.redis.hincrby(k.sku(skuId), 'stock', 1);
      const { reserve } = await import('../../../core/reservations.js');
      const second = (
        await reserve(f.redis, {
          activityId,
          userId: 'twin',
          skuId,
          quantity: 1,
          requestId: 'again',
          traceId: 't2',
        })
      ).reservationId;
      expect((await readReservation(f.redis, activityId, second))?.slot).toBe(1);
      await f.redis.del(k.outbox);
      const stock = await skuStock(f.redis, activityId, skuId);

      const gap = await checkOrderGap(
        { activityId, redis: f.redis, pool: f.pool, gapThresholdSeconds: 0 },
        Date.now() + 1,
      );
      expect(gap.missing).toEqual([second]);
      const r = await repairOrderGap(deps(activityId), gap.missing);
      expect([r.compensated, r.republished]).toEqual([[second], []]);
      const again = await repairOrderGap(deps(activityId), [second]);
      expect(again.compensated).toEqual([]);
      const order = await findLifecycleByReservationId(f.pool, second);
      // Its unit was the forgotten one, which the first order holds in PostgreSQL: withheld, so
      // Redis counts 10 - 1 again; the buyer's slot stays taken (the first order holds it).
      expect([order?.status, order?.closeReason, order?.stockReturned, order?.stockReturnVia]).toEqual([
        'CLOSED',
        'GAP_COMPENSATED',
        false,
        'withheld',
      ]);
      expect(await skuStock(f.redis, activityId, skuId)).toBe(stock);
      expect(stock).toBe(9);
      expect((await counters(f.redis, activityId)).released ?? 0).toBe(0);
      expect((await readReservation(f.redis, activityId, second))?.state).toBe('RELEASED');
      expect(await f.redis.hget(k.buyer('twin'), `${skuId}:slot:1`)).toBe(second);
      expect((await journalFor(f.pool, second)).map((j) => j.event)).toEqual([
        'ORDER_CLOSED',
        'STOCK_WITHHELD',
        'GAP_COMPENSATED',
      ]);
      expect(
        await countRows(
          f.pool,
          `SELECT count(*) AS n FROM orders WHERE user_id = 'twin' AND activity_id = $1 AND status <> 'CLOSED'`,
          [activityId],
        ),
      ).toBe(1);
    },
    TIMEOUT_MS,
  );
});
