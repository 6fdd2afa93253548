// The order path's roles stopped while their Kafka does not answer (a private broker frozen with
// SIGSTOP). The relay, a send in flight: kafkajs retries an idempotent send for as long as it
// takes, and a stop that waited for it ran into SHUTDOWN_TIMEOUT_MS ("shutdown timed out;
// exiting", exit 1) on every rollout during a Kafka outage. The stop lets the send go after
// RELAY_STOP_GRACE_MS instead, and closes its clients: its entries stay pending in the outbox, and
// the next relay reclaims them, so every reservation still reaches Kafka (at least once; the
// consumer's unique keys absorb a repeat). The consumer: its group leave and offset commit wait on
// the broker likewise; what it had written to PostgreSQL stays, and an offset not committed only
// means a message read again.
import { createKafka, ensureTopics, topicsFor } from '../../../core/kafka.js';
import type { OrderMessage } from '../../../core/order-message.js';
import { readTopic } from '../../../runtime/dlq.js';
import { startRole } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import { pidOf, startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';
import {
  TIMEOUT_MS,
  countRows,
  openActivity,
  reserveFor,
  setUp,
  until,
  type Fixture,
} from '../after-sale/fixture.js';

describe('the order path stopped while Kafka does not answer', () => {
  let f: Fixture;
  let priv: PrivateServers | undefined;
  let kafkaPid = 0;
  const roles: RoleProcess[] = [];

  const resume = (): void => {
    try {
      if (kafkaPid) process.kill(kafkaPid, 'SIGCONT');
    } catch {
      // gone
    }
  };

  beforeAll(async () => {
    f = await setUp();
    priv = await startPrivateServers(['kafka']);
    kafkaPid = pidOf(priv, 'kafka');
  }, TIMEOUT_MS);

  afterAll(async () => {
    resume();
    await Promise.all(roles.map((r) => r.kill()));
    await f?.close();
    if (priv) await stopPrivateServers(priv);
  }, TIMEOUT_MS);

  it(
    'stops cleanly with a send in flight, and the next relay publishes what it held',
    async () => {
      const broker = priv!.env.KAFKA_BROKERS!;
      const { activityId, skuId } = await openActivity(f.redis, { stock: 20 });
      const topics = topicsFor(activityId);
      const kafka = createKafka([broker], `test-${activityId}`);
      const admin = kafka.admin();
      await admin.connect();
      await ensureTopics(admin, topics, 2, 1);
      await admin.disconnect();
      const reservationsOnKafka = async (): Promise<Set<string>> =>
        new Set(
          (await readTopic(kafka, topics.orders)).flatMap((m) =>
            m.value.split('\n').map((line) => (JSON.parse(line) as OrderMessage).reservationId),
          ),
        );
      const env = {
        KAFKA_BROKERS: broker,
        LOG_LEVEL: 'info', // the stop is read from the log
        RELAY_RECLAIM_IDLE_MS: '1000',
      };
      const relay = await startRole('relay', { activityId, databaseUrl: f.db.url, env });
      roles.push(relay);

      const before = await reserveFor(f.redis, activityId, skuId, ['rs-0', 'rs-1', 'rs-2']);
      await until(
        'the first reservations on Kafka',
        async () => {
          const seen = await reservationsOnKafka();
          return before.every((r) => seen.has(r)) ? true : undefined;
        },
        60_000,
      );

      // Kafka stops answering; the relay's next send waits on it.
      process.kill(kafkaPid, 'SIGSTOP');
      const held = await reserveFor(f.redis, activityId, skuId, ['rs-3', 'rs-4', 'rs-5']);
      await new Promise((r) => setTimeout(r, 1_500));
      const stopAt = Date.now();
      const code = await relay.stop();
      // A figure for the record (docs, CHANGELOG), not a timed assertion.
      console.log(`relay stop with Kafka frozen: exit ${String(code)} after ${Date.now() - stopAt} ms`);
      expect(code).toBe(0);
      expect(relay.output()).toContain('"msg":"stopped"');
      expect(relay.output()).not.toContain('shutdown timed out');
      expect(relay.output()).toContain('stopping with a batch still in flight');

      resume();
      const next = await startRole('relay', { activityId, databaseUrl: f.db.url, env });
      roles.push(next);
      const seen = await until(
        'the held reservations on Kafka through the next relay',
        async () => {
          const s = await reservationsOnKafka();
          return [...before, ...held].every((r) => s.has(r)) ? s : undefined;
        },
        120_000,
      );
      expect([...before, ...held].filter((r) => !seen.has(r))).toEqual([]);
      expect(await next.stop()).toBe(0);
    },
    TIMEOUT_MS,
  );

  it(
    'the consumer stops cleanly while the broker is frozen, keeping what it wrote',
    async () => {
      const broker = priv!.env.KAFKA_BROKERS!;
      const { activityId, skuId } = await openActivity(f.redis, { stock: 20 }, f.pool);
      const kafka = createKafka([broker], `test-${activityId}`);
      const admin = kafka.admin();
      await admin.connect();
      await ensureTopics(admin, topicsFor(activityId), 2, 1);
      await admin.disconnect();
      const env = { KAFKA_BROKERS: broker, LOG_LEVEL: 'info' };
      const [relay, consumer] = await Promise.all([
        startRole('relay', { activityId, databaseUrl: f.db.url, env }),
        startRole('consumer', { activityId, databaseUrl: f.db.url, env }),
      ]);
      roles.push(relay, consumer);
      await reserveFor(f.redis, activityId, skuId, ['cs-0', 'cs-1', 'cs-2']);
      const orders = (): Promise<number> =>
        countRows(f.pool, 'SELECT count(*) AS n FROM orders WHERE activity_id = $1', [activityId]);
      await until(
        'three orders in PostgreSQL',
        async () => ((await orders()) === 3 ? true : undefined),
        60_000,
      );

      process.kill(kafkaPid, 'SIGSTOP');
      await new Promise((r) => setTimeout(r, 1_500));
      const stopAt = Date.now();
      const codes = await Promise.all([
        consumer.stop().then((c) => {
          console.log(`consumer stop with Kafka frozen: exit ${String(c)} after ${Date.now() - stopAt} ms`);
          return c;
        }),
        relay.stop(),
      ]);
      resume();
      expect(codes).toEqual([0, 0]);
      for (const p of [consumer, relay]) {
        expect(p.output()).toContain('"msg":"stopped"');
        expect(p.output()).not.toContain('shutdown timed out');
      }
      expect(await orders()).toBe(3);
    },
    TIMEOUT_MS,
  );
});
