// Order events through a Kafka outage longer than the relay's send timeout (docs/order-events.md,
// "A send that times out"). The broker is a private one (test/env/start-kafka.sh), frozen with
// SIGSTOP while the relay has a send in flight and more events of the same orders wait, then
// resumed after the request timeout (core/kafka.ts KAFKA_REQUEST_TIMEOUT_MS) has expired (so a
// send left to itself reconnects and retries). Every order's events must arrive in order (a
// re-sent event repeats in place, never after a later one), and no producer may be left connected
// besides the relay's current one.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Kafka, Producer } from 'kafkajs';
import { unpublishedEvents } from '../../../core/db/order-events-store.js';
import {
  createKafka,
  ensureOrderEventsTopic,
  idempotentProducer,
  orderEventsTopic,
} from '../../../core/kafka.js';
import { requestOrderRefund } from '../../../core/refunds.js';
import { OrderEventRelay } from '../../../runtime/jobs/order-events.js';
import { readTopic } from '../../../runtime/dlq.js';
import { startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';
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

const SEND_TIMEOUT_MS = 2_000;
// Longer than the request timeout (10 s): the request in flight times out during the outage.
const PAUSE_MS = 40_000;
const ORDERS = 20;

/** Established TCP connections to 127.0.0.1:`port` (client side), whichever process holds them. */
function connectionsTo(port: number): number {
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  let n = 0;
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols.length < 4) continue;
      if (cols[2]!.endsWith(`:${hexPort}`) && cols[3] === '01') n += 1;
    }
  }
  return n;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('order events: a Kafka outage longer than the send timeout', () => {
  let f: Fixture;
  let api: Api;
  let priv: PrivateServers | undefined;
  let kafkaPid = 0;

  beforeAll(async () => {
    f = await setUp();
    api = await startApi(f);
    priv = await startPrivateServers(['kafka']);
    kafkaPid = Number(readFileSync(join(priv.state, 'kafka.pid'), 'utf8').split('\n')[0]);
  }, TIMEOUT_MS);

  afterAll(async () => {
    if (kafkaPid) {
      try {
        process.kill(kafkaPid, 'SIGCONT');
      } catch {
        // gone
      }
    }
    await api?.close();
    await f?.close();
    if (priv) await stopPrivateServers(priv);
  }, TIMEOUT_MS);

  it(
    'events arrive in order per order, no stale copy after a later event, no producer left connected',
    async () => {
      const broker = priv!.env.KAFKA_BROKERS!;
      const port = Number(broker.split(':').at(-1));
      const { activityId, skuId } = await openActivity(f.redis, { stock: ORDERS + 1, price: '19.90' });
      const kafka: Kafka = createKafka([broker], `test-${activityId}`);
      const topic = orderEventsTopic(`test-${activityId}`);
      const admin = kafka.admin();
      await admin.connect();
      await ensureOrderEventsTopic(admin, topic, 3, 1);
      await admin.disconnect();

      let created = 0;
      let live = 0;
      let maxLive = 0;
      const relay = new OrderEventRelay({
        cfg: {
          ORDER_EVENTS_BATCH_SIZE: 4,
          ORDER_EVENTS_POLL_MS: 50,
          ORDER_EVENTS_RETENTION_HOURS: 1,
          ORDER_EVENTS_TOPIC_RETRY_MS: 30_000,
          ORDER_EVENTS_BACKLOG_SAMPLE_MS: 200,
          ORDER_EVENTS_SEND_TIMEOUT_MS: SEND_TIMEOUT_MS,
        },
        activityId,
        topic,
        pool: f.pool,
        logger: f.logger,
        metrics: f.metrics,
        createProducer: (): Producer => {
          const p = idempotentProducer(kafka);
          created += 1;
          live += 1;
          maxLive = Math.max(maxLive, live);
          let disconnected = false;
          const disconnect = p.disconnect;
          p.disconnect = async () => {
            if (!disconnected) live -= 1;
            disconnected = true;
            await disconnect();
          };
          return p;
        },
      });

      // A first order published while Kafka is up: the relay's producer (and its metadata admin)
      // connected, the baseline of connections.
      const [first] = await reserveFor(f.redis, activityId, skuId, ['out-0']);
      await materialize(f.pool, f.redis, activityId, [first!]);
      await relay.start();
      let stopped = false;
      try {
        await until(
          'the first event published',
          async () => ((await unpublishedEvents(f.pool, activityId)) === 0 ? true : undefined),
          60_000,
        );
        const baseline = connectionsTo(port);
        expect(baseline).toBeGreaterThan(0);

        // Kafka frozen; then three events per order (created, paid, refund started) queue up, and
        // the relay's next send hangs.
        process.kill(kafkaPid, 'SIGSTOP');
        const users = Array.from({ length: ORDERS }, (_, i) => `out-${i + 1}`);
        const rids = await reserveFor(f.redis, activityId, skuId, users);
        const ids = await materialize(f.pool, f.redis, activityId, rids);
        const orderIds = rids.map((r) => ids.get(r)!);
        const deps = { pool: f.pool, logger: f.logger, metrics: f.metrics };
        for (const [i, orderId] of orderIds.entries()) {
          const paid = await notify(api, { orderId, tradeNo: `OUT-${activityId}-${i}`, amount: '19.90' });
          expect(paid.status).toBe(200);
          await requestOrderRefund(deps, {
            orderId,
            reason: 'test',
            requestedBy: 'operator:test',
            traceId: 't',
          });
        }
        await sleep(PAUSE_MS);
        // The backlog gauges come from PostgreSQL on their own timer: they show the outage while
        // every send hangs (they used to be set after a batch went out, so they read 0 here).
        const gauge = async (name: string): Promise<number | undefined> =>
          (await f.metrics.registry.getSingleMetric(name)?.get())?.values[0]?.value;
        const waiting = await unpublishedEvents(f.pool, activityId);
        expect(waiting).toBeGreaterThanOrEqual(ORDERS * 3);
        expect(await gauge('flashsale_order_events_unpublished')).toBe(waiting);
        expect(await gauge('flashsale_order_events_oldest_unpublished_age_seconds')).toBeGreaterThanOrEqual(
          PAUSE_MS / 2000,
        );
        process.kill(kafkaPid, 'SIGCONT');

        await until(
          'the outbox drained',
          async () => ((await unpublishedEvents(f.pool, activityId)) === 0 ? true : undefined),
          120_000,
        );
        // Long enough for any send still retrying (kafkajs backs off up to 5 s) to land.
        await sleep(10_000);
        const running = connectionsTo(port);

        await relay.stop();
        stopped = true;
        await sleep(8_000);
        const afterStop = connectionsTo(port);

        const seen = new Map<string, number[]>();
        for (const m of await readTopic(kafka, topic)) {
          const e = JSON.parse(m.value) as { orderId: string; seq: number };
          seen.set(e.orderId, [...(seen.get(e.orderId) ?? []), e.seq]);
        }
        let duplicates = 0;
        const outOfOrder: string[] = [];
        for (const id of orderIds) {
          const seqs = seen.get(id) ?? [];
          if (seqs.some((s, i) => i > 0 && s < seqs[i - 1]!)) outOfOrder.push(`${id}: ${seqs.join(',')}`);
          const unique = seqs.filter((s, i) => i === 0 || s !== seqs[i - 1]);
          duplicates += seqs.length - unique.length;
        }
        console.log(
          `order-events outage: ${JSON.stringify({ created, maxLive, baseline, running, afterStop, duplicates, outOfOrder })}`,
        );
        expect(outOfOrder).toEqual([]);
        for (const id of orderIds) {
          expect([id, [...new Set(seen.get(id))]]).toEqual([id, [1, 2, 3]]);
        }
        // One producer at a time, nothing left reconnecting.
        expect(maxLive).toBe(1);
        expect(running).toBeLessThanOrEqual(baseline);
        expect(afterStop).toBe(0);
      } finally {
        if (!stopped) await relay.stop();
      }
    },
    TIMEOUT_MS + 120_000,
  );
});
