// Failure window 16 (also a row of `make faults`): order events through the PostgreSQL outbox
// survive a SIGKILL of the event relay (the real jobs role, a child process, killed after Kafka acknowledged a batch and before
// it was marked published). Every state change of every order (created by the consumer's insert,
// paid, closed by the sweeper, inserted CLOSED by a cancellation in flight, refund started and
// finished) appears on <prefix>.order-events once or more, in order per order, with its event id.
import type { Kafka } from 'kafkajs';
import { findOrderById } from '../../../core/db/orders-store.js';
import { unpublishedEvents } from '../../../core/db/order-events-store.js';
import {
  createKafka,
  ensureOrderEventsTopic,
  ensureTopics,
  idempotentProducer,
  orderEventsTopic,
  topicsFor,
} from '../../../core/kafka.js';
import { cancelReservation } from '../../../core/order-lifecycle.js';
import { refundsForOrder } from '../../../core/db/refunds-store.js';
import { completeRefund, requestOrderRefund } from '../../../core/refunds.js';
import { OrderEventRelay } from '../../../runtime/jobs/order-events.js';
import { sweepExpiredOrders } from '../../../runtime/jobs/payment-timeout.js';
import { readTopic } from '../../../runtime/dlq.js';
import { testEnv } from '../../../dev/servers.js';
import { freePort, startRole } from '../../../dev/roles.js';
import { recorded } from '../../faults/harness/results.js';
import { sample } from '../../fixtures/metrics-text.js';
import {
  TIMEOUT_MS,
  materialize,
  notify,
  openActivity,
  reserveFor,
  setUp,
  startApi,
  until,
  type Api,
  type Fixture,
} from './fixture.js';

interface OrderEvent {
  eventId: string;
  type: string;
  seq: number;
  orderId: string;
  activityId: string;
  fromStatus: string | null;
  status: string;
}

const metricsOf = async (url: string): Promise<string> => (await fetch(`${url}/metrics`)).text();

/** `<orderId>:<seq>:<type>` of every event on the topic, sorted. */
async function creationsIn(kafka: Kafka, topic: string): Promise<string[]> {
  const published = (await readTopic(kafka, topic)).map((m) => JSON.parse(m.value) as OrderEvent);
  return published.map((e) => `${e.orderId}:${e.seq}:${e.type}`).sort();
}

describe('order events: transactional outbox -> Kafka, at least once and in order per order', () => {
  let f: Fixture;
  let api: Api;

  beforeAll(async () => {
    f = await setUp();
    api = await startApi(f);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.close();
    await f?.close();
  }, TIMEOUT_MS);

  /**
   * The jobs role of `activityId`, creating its order-events topic with `replicas` replicas; it
   * checks the topic and samples the backlog often.
   */
  const jobsCheckingTopic = (activityId: string, prefix: string, replicas: number) =>
    startRole('jobs', {
      activityId,
      databaseUrl: f.db.url,
      env: {
        KAFKA_TOPIC_PREFIX: prefix,
        KAFKA_REPLICATION_FACTOR: String(replicas),
        ORDER_EVENTS_POLL_MS: '50',
        ORDER_EVENTS_TOPIC_RETRY_MS: '300',
        ORDER_EVENTS_BACKLOG_SAMPLE_MS: '200',
        RECONCILIATION_CRON: '0 0 0 1 1 *',
      },
    });

  it(
    'every order event arrives once or more, in order, after the relay is SIGKILLed mid-stream',
    () =>
      recorded('window 16', undefined, async () => {
        const { activityId, skuId } = await openActivity(f.redis, { stock: 60, price: '19.90' });
        const kafka = createKafka(testEnv().kafkaBrokers, `test-${activityId}`);
        const admin = kafka.admin();
        await admin.connect();
        await ensureTopics(admin, topicsFor(activityId), 1, 1);
        await admin.disconnect();

        const users = Array.from({ length: 40 }, (_, i) => `ev-${i}`);
        const rids = await reserveFor(f.redis, activityId, skuId, users);
        const ids = await materialize(f.pool, f.redis, activityId, rids);
        const orderIds = rids.map((r) => ids.get(r)!);
        // 15 paid, 10 closed by the sweeper, one cancelled in flight (inserted CLOSED), 15 unpaid.
        for (const [i, orderId] of orderIds.slice(0, 15).entries()) {
          expect(
            (await notify(api, { orderId, tradeNo: `EV-${activityId}-${i}`, amount: '19.90' })).status,
          ).toBe(200);
        }
        await f.pool.query(
          `UPDATE orders SET expires_at = now() - interval '1 second' WHERE id = ANY($1::bigint[])`,
          [orderIds.slice(15, 25)],
        );
        const swept = await sweepExpiredOrders({
          ...f.deps,
          activityId,
          batchSize: 4,
          maxBatches: 10,
          settleGraceSeconds: 30,
        });
        expect(swept.closed).toBe(10);
        const [inFlight] = await reserveFor(f.redis, activityId, skuId, ['ev-in-flight']);
        const cancelled = await cancelReservation(f.deps, {
          activityId,
          userId: 'ev-in-flight',
          target: { reservationId: inFlight! },
          traceId: 'trace-in-flight',
        });
        expect(cancelled).toMatchObject({ outcome: 'cancelled', inFlight: true });
        const cancelledOrder = cancelled.outcome === 'cancelled' ? cancelled.orderId : undefined;
        expect(cancelledOrder).toMatch(/^\d+$/);

        const env = {
          ORDER_EVENTS_BATCH_SIZE: '8',
          ORDER_EVENTS_POLL_MS: '50',
          RECONCILIATION_CRON: '0 0 0 1 1 *',
        };
        const doomed = await startRole('jobs', {
          activityId,
          databaseUrl: f.db.url,
          waitReady: false,
          env: { ...env, FLASHSALE_CRASH_POINT: 'order-events-after-kafka-ack', FLASHSALE_CRASH_AFTER: '3' },
        });
        await doomed.exited;
        expect(doomed.proc.signalCode).toBe('SIGKILL');
        expect(await unpublishedEvents(f.pool, activityId)).toBeGreaterThan(0);

        // More changes while no relay runs: refunds started (5) and finished (2).
        const deps = { pool: f.pool, logger: f.logger, metrics: f.metrics };
        for (const orderId of orderIds.slice(0, 5)) {
          const r = await requestOrderRefund(deps, {
            orderId,
            reason: 'test',
            requestedBy: 'operator:test',
            traceId: 't',
          });
          if (orderId === orderIds[0] || orderId === orderIds[1]) {
            await completeRefund(
              deps,
              r.refund.refundId,
              { providerStatus: 'REFUND_SUCCESS', providerRefundNo: null },
              't',
            );
          }
        }

        const relay = await startRole('jobs', { activityId, databaseUrl: f.db.url, env });
        try {
          await until(
            'the outbox drained',
            async () => ((await unpublishedEvents(f.pool, activityId)) === 0 ? true : undefined),
            90_000,
          );
        } finally {
          expect(await relay.stop()).toBe(0);
        }

        const messages = (await readTopic(kafka, orderEventsTopic())).filter(
          (m) => m.headers['activity-id'] === activityId,
        );
        const byOrder = new Map<string, OrderEvent[]>();
        for (const m of messages) {
          const e = JSON.parse(m.value) as OrderEvent;
          expect(m.key).toBe(e.orderId);
          expect(e.eventId).toBe(`${e.orderId}-${e.seq}`);
          expect(m.headers['event-id']).toBe(e.eventId);
          byOrder.set(e.orderId, [...(byOrder.get(e.orderId) ?? []), e]);
        }
        const all = [...orderIds, cancelledOrder!];
        expect([...byOrder.keys()].sort()).toEqual([...all].sort());
        let duplicates = 0;
        const expectedTypes = (id: string): string[] => {
          const i = orderIds.indexOf(id);
          if (id === cancelledOrder) return ['ORDER_CLOSED'];
          if (i < 2) return ['ORDER_CREATED', 'ORDER_PAID', 'ORDER_REFUNDING', 'ORDER_REFUNDED'];
          if (i < 5) return ['ORDER_CREATED', 'ORDER_PAID', 'ORDER_REFUNDING'];
          if (i < 15) return ['ORDER_CREATED', 'ORDER_PAID'];
          if (i < 25) return ['ORDER_CREATED', 'ORDER_CLOSED'];
          return ['ORDER_CREATED'];
        };
        for (const id of all) {
          const events = byOrder.get(id)!;
          const seqs = events.map((e) => e.seq);
          // In order: never an older event after a newer one (a re-sent event repeats in place).
          expect([id, seqs]).toEqual([id, [...seqs].sort((a, b) => a - b)]);
          const unique = events.filter((e, i) => i === 0 || e.seq !== events[i - 1]!.seq);
          duplicates += events.length - unique.length;
          const order = await findOrderById(f.pool, id);
          expect([id, unique.map((e) => e.seq)]).toEqual([
            id,
            Array.from({ length: unique.length }, (_, i) => i + 1),
          ]);
          expect([id, unique.map((e) => e.type)]).toEqual([id, expectedTypes(id)]);
          expect([id, unique.at(-1)!.status]).toEqual([id, order!.status]);
          for (let i = 1; i < unique.length; i += 1)
            expect(unique[i]!.fromStatus).toBe(unique[i - 1]!.status);
        }
        // The kill came after Kafka acknowledged a batch that was not marked published: re-sent.
        expect(duplicates).toBeGreaterThan(0);
      }),
    TIMEOUT_MS,
  );

  it(
    'several relays at once publish each order in order (an event waits for its predecessor)',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 60, price: '19.90' });
      const kafka = createKafka(testEnv().kafkaBrokers, `test-${activityId}`);
      const topic = orderEventsTopic(`test-${activityId}`);
      const admin = kafka.admin();
      await admin.connect();
      await ensureOrderEventsTopic(admin, topic, 2, 1);
      await admin.disconnect();
      const users = Array.from({ length: 30 }, (_, i) => `evc-${i}`);
      const rids = await reserveFor(f.redis, activityId, skuId, users);
      const orderIds: string[] = [];
      // Three pending events per order before any relay runs (created, paid, refund started),
      // order after order, so one order's events are adjacent in the outbox: relays taking one
      // event each would race on them without the predecessor rule.
      const deps = { pool: f.pool, logger: f.logger, metrics: f.metrics };
      for (const [i, rid] of rids.entries()) {
        const orderId = (await materialize(f.pool, f.redis, activityId, [rid])).get(rid)!;
        orderIds.push(orderId);
        const paid = await notify(api, { orderId, tradeNo: `EVC-${activityId}-${i}`, amount: '19.90' });
        expect(paid.status).toBe(200);
        await requestOrderRefund(deps, {
          orderId,
          reason: 'test',
          requestedBy: 'operator:test',
          traceId: 't',
        });
      }
      const relays = [0, 1, 2].map(
        () =>
          new OrderEventRelay({
            cfg: {
              ORDER_EVENTS_BATCH_SIZE: 1,
              ORDER_EVENTS_POLL_MS: 20,
              ORDER_EVENTS_RETENTION_HOURS: 1,
              ORDER_EVENTS_TOPIC_RETRY_MS: 30_000,
              ORDER_EVENTS_BACKLOG_SAMPLE_MS: 200,
              ORDER_EVENTS_SEND_TIMEOUT_MS: 30_000,
            },
            activityId,
            topic,
            pool: f.pool,
            logger: f.logger,
            metrics: f.metrics,
            createProducer: () => idempotentProducer(kafka),
          }),
      );
      await Promise.all(relays.map((r) => r.start()));
      try {
        // Changes keep coming while the relays run: half of the refunds finish.
        for (const orderId of orderIds.slice(0, 15)) {
          const [r] = await refundsForOrder(f.pool, orderId);
          await completeRefund(
            deps,
            r!.refundId,
            { providerStatus: 'REFUND_SUCCESS', providerRefundNo: null },
            't',
          );
        }
        await until(
          'the outbox drained',
          async () => ((await unpublishedEvents(f.pool, activityId)) === 0 ? true : undefined),
          90_000,
        );
      } finally {
        await Promise.all(relays.map((r) => r.stop()));
      }
      const seen = new Map<string, number[]>();
      for (const m of await readTopic(kafka, topic)) {
        const e = JSON.parse(m.value) as OrderEvent;
        seen.set(e.orderId, [...(seen.get(e.orderId) ?? []), e.seq]);
      }
      for (const [i, id] of orderIds.entries()) {
        expect([id, seen.get(id)]).toEqual([id, i < 15 ? [1, 2, 3, 4] : [1, 2, 3]]);
      }
      const published = await f.metrics.registry
        .getSingleMetric('flashsale_order_events_published_total')
        ?.get();
      expect(published?.values.find((v) => v.labels.activity === activityId)?.value).toBe(30 * 3 + 15);
    },
    TIMEOUT_MS,
  );
  it(
    'a missing topic the brokers cannot create with the configured replicas holds the events, says so once, and they are published once it can be created',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 10, price: '19.90' });
      const prefix = `test-${activityId}`;
      const topic = orderEventsTopic(prefix);
      const kafka = createKafka(testEnv().kafkaBrokers, prefix);
      const topicExists = async (): Promise<boolean> => {
        const admin = kafka.admin();
        await admin.connect();
        try {
          await ensureTopics(admin, topicsFor(activityId, prefix), 1, 1);
          return (await admin.listTopics()).includes(topic);
        } finally {
          await admin.disconnect();
        }
      };
      expect(await topicExists()).toBe(false);
      const rids = await reserveFor(f.redis, activityId, skuId, ['few-0', 'few-1']);
      const ids = await materialize(f.pool, f.redis, activityId, rids);

      // Three replicas asked of the suite's single broker, as of a three-broker cluster with two
      // down. Before: "order-event batch failed; retrying: Topic creation errors" every 500 ms.
      const refused = await jobsCheckingTopic(activityId, prefix, 3);
      try {
        const held = await until(
          'the events waiting on /metrics',
          async () => {
            const text = await metricsOf(refused.metricsUrl);
            return sample(text, 'flashsale_order_events_oldest_unpublished_age_seconds') >= 2
              ? text
              : undefined;
          },
          60_000,
        );
        expect(sample(held, 'flashsale_order_events_unpublished')).toBe(2);
        // Not a topic with less replication: that alert stays silent.
        expect(sample(held, 'flashsale_order_events_topic_under_replicated', { topic })).not.toBe(1);
        expect(refused.output()).toContain(
          `Kafka topic(s) ${topic} cannot be created with 3 replicas: 1 broker(s) available`,
        );
        expect(refused.output().split('order events not published').length - 1).toBe(1);
        expect(refused.output()).not.toContain('order-event batch failed');
      } finally {
        await refused.stop();
      }
      expect(await topicExists()).toBe(false);

      // As many brokers as replicas (here: the setting brought to the cluster's one broker).
      const created = await jobsCheckingTopic(activityId, prefix, 1);
      try {
        await until(
          'the events published',
          async () =>
            sample(await metricsOf(created.metricsUrl), 'flashsale_order_events_unpublished') === 0
              ? true
              : undefined,
          60_000,
        );
      } finally {
        await created.stop();
      }
      expect(await creationsIn(kafka, topic)).toEqual(
        rids.map((r) => `${ids.get(r)!}:1:ORDER_CREATED`).sort(),
      );
    },
    TIMEOUT_MS,
  );

  it(
    'an existing topic with fewer replicas than configured holds the events in PostgreSQL, says so, and they are published once it is accepted',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 10, price: '19.90' });
      const prefix = `test-${activityId}`;
      const topic = orderEventsTopic(prefix);
      const kafka = createKafka(testEnv().kafkaBrokers, prefix);
      const admin = kafka.admin();
      await admin.connect();
      await ensureTopics(admin, topicsFor(activityId, prefix), 1, 1);
      // As a topic made by hand or by the brokers' auto-creation is: one replica.
      await admin.createTopics({
        waitForLeaders: true,
        topics: [{ topic, numPartitions: 2, replicationFactor: 1 }],
      });
      await admin.disconnect();
      const rids = await reserveFor(f.redis, activityId, skuId, ['rep-0', 'rep-1', 'rep-2']);
      const ids = await materialize(f.pool, f.redis, activityId, rids);

      const refused = await jobsCheckingTopic(activityId, prefix, 3);
      try {
        const held = await until(
          'the refusal and the age of the oldest waiting event on /metrics',
          async () => {
            const text = await metricsOf(refused.metricsUrl);
            return sample(text, 'flashsale_order_events_topic_under_replicated', { topic }) === 1 &&
              sample(text, 'flashsale_order_events_oldest_unpublished_age_seconds') >= 3
              ? text
              : undefined;
          },
          60_000,
        );
        expect(sample(held, 'flashsale_order_events_unpublished')).toBe(3);
        expect(await unpublishedEvents(f.pool, activityId)).toBe(3);
        // Checked again every 300 ms, logged once.
        expect(refused.output()).toContain(`${topic} has 1 replica(s) per partition, configured 3`);
        expect(refused.output().split('order events not published').length - 1).toBe(1);
      } finally {
        await refused.stop();
      }
      expect(await readTopic(kafka, topic)).toEqual([]);

      // The way out that needs no broker: accept the topic as it is (docs/runbooks).
      const accepted = await jobsCheckingTopic(activityId, prefix, 1);
      try {
        const drained = await until(
          'the events published and the gauges back to 0',
          async () => {
            const text = await metricsOf(accepted.metricsUrl);
            return sample(text, 'flashsale_order_events_topic_under_replicated', { topic }) === 0 &&
              sample(text, 'flashsale_order_events_unpublished') === 0 &&
              sample(text, 'flashsale_order_events_oldest_unpublished_age_seconds') === 0
              ? text
              : undefined;
          },
          60_000,
        );
        expect(drained).toBeDefined();
      } finally {
        await accepted.stop();
      }
      expect(await unpublishedEvents(f.pool, activityId)).toBe(0);
      expect(await creationsIn(kafka, topic)).toEqual(
        rids.map((r) => `${ids.get(r)!}:1:ORDER_CREATED`).sort(),
      );
    },
    TIMEOUT_MS,
  );
  it(
    'the after-sale role starts and runs its refund worker with Kafka away; the events wait and are counted',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 5, price: '19.90' });
      const rids = await reserveFor(f.redis, activityId, skuId, ['away-0', 'away-1']);
      await materialize(f.pool, f.redis, activityId, rids);
      const nowhere = await freePort(); // nothing listens there
      const env = {
        KAFKA_BROKERS: `127.0.0.1:${nowhere}`,
        REFUND_WORKER_CRON: '* * * * * *',
        ORDER_EVENTS_BACKLOG_SAMPLE_MS: '200',
      };
      // Beside it, an after-sale pod without the relay: it must export no backlog series at all
      // (an unlabelled gauge would say "0 waiting" for it; FlashSaleOrderEventsRelayMissing reads
      // the absence).
      const [role, noRelay] = await Promise.all([
        // At info: its stop is read from the log below.
        startRole('after-sale', { databaseUrl: f.db.url, env: { ...env, LOG_LEVEL: 'info' } }),
        startRole('after-sale', { databaseUrl: f.db.url, env: { ...env, ORDER_EVENTS_RELAY: 'false' } }),
      ]);
      const relayed = { component: 'runtime-after-sale', topic: orderEventsTopic() };
      let exitCodes: (number | null)[] = [];
      try {
        const text = await until(
          'refund worker runs and the waiting events on /metrics',
          async () => {
            const t = await metricsOf(role.metricsUrl);
            return sample(t, 'flashsale_job_runs_total', { task: 'refunds', result: 'ok' }) >= 2 &&
              sample(t, 'flashsale_order_events_unpublished', relayed) >= 2 &&
              sample(t, 'flashsale_order_events_oldest_unpublished_age_seconds', relayed) > 0
              ? t
              : undefined;
          },
          60_000,
        );
        expect(sample(text, 'flashsale_order_events_published_total', { activity: activityId })).toBeNaN();
        // The last sample is recent, and it moves on with the next one (every 200 ms).
        const sampledAt = sample(text, 'flashsale_order_events_last_sample_timestamp_seconds', relayed);
        expect(Date.now() / 1000 - sampledAt).toBeLessThan(30);
        await until(
          'a later backlog sample',
          async () =>
            sample(
              await metricsOf(role.metricsUrl),
              'flashsale_order_events_last_sample_timestamp_seconds',
              relayed,
            ) > sampledAt || undefined,
          30_000,
        );

        const quiet = await until(
          'the relay-less pod running its refund worker',
          async () => {
            const t = await metricsOf(noRelay.metricsUrl);
            return sample(t, 'flashsale_job_runs_total', { task: 'refunds', result: 'ok' }) >= 2
              ? t
              : undefined;
          },
          60_000,
        );
        for (const name of [
          'flashsale_order_events_unpublished',
          'flashsale_order_events_oldest_unpublished_age_seconds',
          'flashsale_order_events_last_sample_timestamp_seconds',
        ])
          expect([name, sample(quiet, name)]).toEqual([name, NaN]);
      } finally {
        exitCodes = await Promise.all([role.stop(), noRelay.stop()]);
      }
      // A SIGTERM with Kafka away is a clean stop: the relay does not wait for the topic
      // preparation kafkajs keeps retrying (before: "shutdown timed out", exit 1 after 20 s).
      expect(exitCodes).toEqual([0, 0]);
      expect(role.output()).toContain('"msg":"stopped"');
      expect(role.output()).not.toContain('shutdown timed out');
      // kafkajs' lines come through the role's pino logger, each kind of failure once within its
      // minute (core/kafka-log.ts), however many times kafkajs retried the topic preparation's
      // connection meanwhile (after 0.2, 0.6, 1.4, 3 s, …). The output kept is its tail: the first
      // line may be cut.
      const kafkajsLines = role
        .output()
        .split('\n')
        .slice(1)
        .filter((l) => l.includes('kafkajs'))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      const refusedConnections = kafkajsLines.filter((l) => String(l.msg).includes('ECONNREFUSED'));
      expect(refusedConnections.length).toBeGreaterThan(0);
      expect(kafkajsLines.every((l) => l.lib === 'kafkajs' && l.component === 'runtime-after-sale')).toBe(
        true,
      );
      const kinds = refusedConnections.map(
        (l) => `${String(l.namespace)} ${String(l.broker)} ${String(l.msg)}`,
      );
      expect(kinds.length).toBe(new Set(kinds).size);
      expect(await unpublishedEvents(f.pool, activityId)).toBe(2);
    },
    TIMEOUT_MS,
  );
});
