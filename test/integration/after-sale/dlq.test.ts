// DLQ tooling: a message that fails for a non-transient reason goes to the DLQ through the real
// consumer; once the cause is fixed, the `dlq` command (run as a real process) lists, inspects and
// replays it into the order topic, twice, and the order is created exactly once. Replaying and
// acknowledging move the DLQ's handled offset (flashsale_dlq_unhandled), which the depth never shows.
// The runbooks' own commands (docs/runbooks/FlashSaleDLQUnhandled.md, …NewDeadLetters.md) are run as
// written there, by the program's entry point (dev/runbook.ts).
import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import type { Admin, Kafka, Producer } from 'kafkajs';
import { journalFor } from '../../../core/db/journal-store.js';
import { findLifecycleByReservationId } from '../../../core/db/orders-store.js';
import {
  consumerLag,
  createKafka,
  dlqUnhandled,
  idempotentProducer,
  topicDepth,
  topicsFor,
} from '../../../core/kafka.js';
import type { OrderConsumer } from '../../../runtime/consumer/consumer.js';
import { runDlqCli } from '../../../runtime/dlq.js';
import { derivePhase, enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { settle } from '../../../operator/reconcile/settle.js';
import { runRuntimeCommand, runbookCommand } from '../../../dev/runbook.js';
import { stepContext } from '../../fixtures/step-context.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import {
  countRows,
  observedConsumer,
  openActivityWithTopics,
  orderConsumerFor,
  orderMessagesOf,
  reserveFor,
  setUp,
  TIMEOUT_MS,
  type Fixture,
  until,
} from './fixture.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const run = promisify(execFile);

describe('DLQ list / inspect / replay / ack', () => {
  let f: Fixture;
  let kafka: Kafka;
  let admin: Admin;
  let producer: Producer;
  let consumer: OrderConsumer | undefined;
  const prefix = uniqueId('dlq');

  beforeAll(async () => {
    f = await setUp();
    kafka = createKafka(testEnv().kafkaBrokers, uniqueId('dlq-test'));
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

  const dlqCommand = async (activityId: string, ...args: string[]): Promise<string> => {
    const { stdout } = await run(
      process.execPath,
      ['--import', 'tsx', join(root, 'runtime', 'dlq.ts'), ...args, '--activity', activityId],
      {
        cwd: root,
        env: { ...process.env, KAFKA_BROKERS: testEnv().kafkaBrokers.join(','), KAFKA_TOPIC_PREFIX: prefix },
        timeout: 120_000,
      },
    );
    return stdout;
  };

  /** A command of a runbook page, as written there (dev/runbook.ts), run by the program's entry point. */
  const runbook = async (activityId: string, page: string, what: string): Promise<string> => {
    const args = runbookCommand(page, what, { ID: activityId, 'P:O': '0:0' });
    const r = await runRuntimeCommand(args, {
      KAFKA_BROKERS: testEnv().kafkaBrokers.join(','),
      KAFKA_TOPIC_PREFIX: prefix,
    });
    expect({ args, code: r.code, stderr: r.stderr }).toEqual({ args, code: 0, stderr: '' });
    return r.stdout;
  };

  /** The settle step of the operator (Settling) for the activity, with the real Kafka counts. */
  const settling = (activityId: string, events: string[] = []) =>
    stepContext(
      {
        activityId,
        now: new Date(),
        spec: {},
        status: { conditions: enterPhase(undefined, Phase.Settling, 'test', 1, new Date()) },
        deps: {
          pool: f.pool,
          kafka: {
            dlqUnhandled: (id: string) => dlqUnhandled(admin, topicsFor(id, prefix)),
            lag: (id: string) =>
              consumerLag(admin, topicsFor(id, prefix).consumerGroup, topicsFor(id, prefix).orders),
          },
          config: { settleCheckMs: 30_000 },
        },
      },
      events,
    );

  it(
    'a fixed poison message replayed twice creates its order exactly once',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 5 });
      const [rid] = await reserveFor(f.redis, activityId, skuId, ['poisoned-buyer']);
      const message = (await orderMessagesOf(f.redis, activityId, [rid!]))[0]!;

      // A defect that makes exactly this message fail for a non-transient reason (check violation).
      await f.pool.query(
        `ALTER TABLE orders ADD CONSTRAINT dlq_test_defect CHECK (reservation_id <> '${rid}')`,
      );
      await producer.send({
        topic: topics.orders,
        acks: -1,
        messages: [
          { key: message.userId, value: JSON.stringify(message), headers: { 'reservation-id': rid! } },
        ],
      });
      const observed = observedConsumer(
        kafka.consumer({ groupId: topics.consumerGroup, maxWaitTimeInMs: 200 }),
      );
      consumer = orderConsumerFor(f, kafka, activityId, topics, () => observed.consumer);
      await consumer.start();
      await until('the message in the DLQ', async () =>
        (await topicDepth(admin, topics.dlq)) === 1 ? true : undefined,
      );
      expect(await findLifecycleByReservationId(f.pool, rid!)).toBeUndefined();

      // The defect is fixed.
      await f.pool.query('ALTER TABLE orders DROP CONSTRAINT dlq_test_defect');

      // The runbooks' diagnosis (docs/runbooks/FlashSaleDLQUnhandled.md), as written there.
      const list = await runbook(activityId, 'FlashSaleDLQUnhandled.md', 'dlq list');
      expect(list).toContain(`1 message(s) in ${topics.dlq}, 1 not handled`);
      expect(list).toMatch(
        new RegExp(
          `^0:0\\tUNHANDLED\\t\\S+\\treservation=${rid}\\tattempts=2\\terror=.*dlq_test_defect`,
          'm',
        ),
      );
      expect(await dlqUnhandled(admin, topics)).toBe(1);

      const lines: string[] = [];
      expect(
        await runDlqCli(
          ['inspect', '0:0', '--activity', activityId],
          { KAFKA_BROKERS: testEnv().kafkaBrokers.join(','), KAFKA_TOPIC_PREFIX: prefix },
          (l) => lines.push(l),
        ),
      ).toBe(0);
      const inspected = JSON.parse(lines.join('\n')) as {
        value: { reservationId: string };
        headers: Record<string, string>;
      };
      expect(inspected.value.reservationId).toBe(rid);
      expect(inspected.headers['dlq-original-topic']).toBe(topics.orders);
      expect(
        JSON.parse(await runbook(activityId, 'FlashSaleDLQNewDeadLetters.md', 'dlq inspect')) as unknown,
      ).toEqual(inspected);

      // The runbook's mitigation: every message not handled yet.
      const replayed = await runbook(activityId, 'FlashSaleDLQUnhandled.md', 'dlq replay --all');
      expect(replayed).toContain('replayed 1 message(s)');
      expect(replayed).toContain('handled offsets 0:1; 0 message(s) not handled');
      // The replay is what the alert sees: the depth (high - low) stays, the unhandled count drops.
      expect(await dlqUnhandled(admin, topics)).toBe(0);
      expect(await dlqCommand(activityId, 'list')).toMatch(/^0:0\thandled\t/m);
      // A message named by its reference is replayed again, handled as it is; --all has none left.
      expect(await dlqCommand(activityId, 'replay', '0:0')).toContain('replayed 1 message(s)');
      expect(await dlqCommand(activityId, 'replay', '--all')).toContain('replayed 0 message(s)');
      // The runbook's "Done when" line.
      expect(await runbook(activityId, 'FlashSaleDLQUnhandled.md', 'dlq list')).toContain(
        `1 message(s) in ${topics.dlq}, 0 not handled`,
      );

      // Offsets 1 and 2 are the replays: both processed, one order.
      await until('both replays consumed', async () =>
        (observed.processed().get(0) ?? -1) >= 2 ? true : undefined,
      );
      expect(
        await countRows(f.pool, 'SELECT count(*) AS n FROM orders WHERE activity_id = $1', [activityId]),
      ).toBe(1);
      expect((await findLifecycleByReservationId(f.pool, rid!))?.status).toBe('UNPAID');
      expect((await journalFor(f.pool, rid!)).filter((j) => j.event === 'ORDER_CREATED')).toHaveLength(1);
      expect(await topicDepth(admin, topics.dlq)).toBe(1); // nothing new dead-lettered
      expect(await dlqUnhandled(admin, topics)).toBe(0);

      // Two more dead letters (offsets 1 and 2). Acknowledging the later one alone is refused, since
      // it could not be recorded (it would be counted, and sent again by --all, as if unhandled);
      // acknowledging both is done (nothing is replayed by ack).
      await producer.send({
        topic: topics.dlq,
        acks: -1,
        messages: [{ value: '{"broken":1}' }, { value: '{"broken":2}' }],
      });
      await until('the new dead letters counted', async () =>
        (await dlqUnhandled(admin, topics)) === 2 ? true : undefined,
      );
      const refusedAck: string[] = [];
      expect(
        await runDlqCli(
          ['ack', '0:2', '--activity', activityId],
          { KAFKA_BROKERS: testEnv().kafkaBrokers.join(','), KAFKA_TOPIC_PREFIX: prefix },
          () => undefined,
          (t) => refusedAck.push(t),
        ),
      ).toBe(1);
      expect(refusedAck.join('')).toContain('nothing done: 0:2 comes after 0:1, not handled yet');
      expect(await dlqUnhandled(admin, topics)).toBe(2);
      expect(await dlqCommand(activityId, 'ack', '0:1', '0:2')).toContain(
        'handled offsets 0:3; 0 message(s) not handled',
      );
      expect(await dlqUnhandled(admin, topics)).toBe(0);
      expect(observed.processed().get(0)).toBe(2); // ack produced nothing into the order topic
      // Acknowledged (here: refused, not orders), so --all does not send them again: they would
      // be refused and dead-lettered anew, a new copy on every later --all.
      expect(await dlqCommand(activityId, 'replay', '--all')).toContain('replayed 0 message(s)');
      expect(await topicDepth(admin, topics.dlq)).toBe(3);
      expect(observed.processed().get(0)).toBe(2);

      // Bad usage is refused with exit code 2 and nothing produced.
      expect(
        await runDlqCli(['replay', '--activity', activityId], { KAFKA_BROKERS: 'x:1' }, () => undefined),
      ).toBe(2);
    },
    TIMEOUT_MS,
  );

  it(
    'a dead letter with no consumer to read its replay is refused and stays counted; the activity waits in Settling until it is handled',
    async () => {
      const { activityId, skuId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 5 });
      const [rid] = await reserveFor(f.redis, activityId, skuId, ['orphan-buyer']);
      const message = (await orderMessagesOf(f.redis, activityId, [rid!]))[0]!;
      // Dead-lettered by the activity's consumer, which is gone now (scaled to zero).
      await producer.send({
        topic: topics.dlq,
        acks: -1,
        messages: [
          {
            key: message.userId,
            value: JSON.stringify(message),
            headers: { 'reservation-id': rid!, 'dlq-error': 'a defect since fixed', 'dlq-attempts': '2' },
          },
        ],
      });
      await until('the dead letter counted', async () =>
        (await dlqUnhandled(admin, topics)) === 1 ? true : undefined,
      );

      // Settling, nothing unsettled in PostgreSQL: the dead letter alone keeps it from Completed.
      const events: string[] = [];
      const waiting = settling(activityId, events);
      await settle(waiting);
      expect(waiting.transitioned).toBe(false);
      expect(waiting.status.settlement).toMatchObject({ unsettled: 0, deadLetters: 1 });
      expect(events).toEqual([]);

      // No member in the activity's consumer group: the replay is refused, nothing is produced,
      // and the dead letter stays counted (its alert stays up).
      const refused: string[] = [];
      const env = { KAFKA_BROKERS: testEnv().kafkaBrokers.join(','), KAFKA_TOPIC_PREFIX: prefix };
      expect(
        await runDlqCli(
          ['replay', '--all', '--activity', activityId],
          env,
          () => undefined,
          (t) => refused.push(t),
        ),
      ).toBe(1);
      expect(refused.join('')).toContain(`no consumer reads ${topics.orders}`);
      expect(await topicDepth(admin, topics.orders)).toBe(0);
      expect(await dlqUnhandled(admin, topics)).toBe(1);

      // With the consumer running, as Settling keeps it: replayed, and the order is written.
      const running = orderConsumerFor(f, kafka, activityId, topics, () =>
        kafka.consumer({ groupId: topics.consumerGroup, maxWaitTimeInMs: 200 }),
      );
      await running.start();
      try {
        await until('the consumer in its group', async () => {
          const { groups } = await admin.describeGroups([topics.consumerGroup]);
          return (groups[0]?.members.length ?? 0) > 0 ? true : undefined;
        });
        const out: string[] = [];
        expect(await runDlqCli(['replay', '--all', '--activity', activityId], env, (l) => out.push(l))).toBe(
          0,
        );
        expect(out.join('\n')).toContain('replayed 1 message(s)');
        await until('the replayed order written', async () =>
          (await findLifecycleByReservationId(f.pool, rid!))?.status === 'UNPAID' ? true : undefined,
        );
      } finally {
        await running.stop();
      }
      const handled = settling(activityId, events);
      await settle(handled);
      expect(handled.status.settlement).toMatchObject({ unsettled: 1, unpaid: 1, deadLetters: 0 });
    },
    TIMEOUT_MS,
  );

  it(
    'an order still in the topic (a replay the consumer has not written yet) keeps the activity in Settling',
    async () => {
      const { activityId, topics } = await openActivityWithTopics(f, admin, prefix, { stock: 5 });
      // Replayed (handled), not read by the consumer yet: no order, no dead letter, no lag read 0.
      await producer.send({ topic: topics.orders, acks: -1, messages: [{ key: 'k', value: '{}' }] });
      const waiting = settling(activityId);
      await settle(waiting);
      expect(waiting.status.settlement).toMatchObject({ unsettled: 0, deadLetters: 0 });
      expect(waiting.transitioned).toBe(false);
      // The consumer read it (its group's offset at the end): Completed.
      await admin.setOffsets({
        groupId: topics.consumerGroup,
        topic: topics.orders,
        partitions: [{ partition: 0, offset: '1' }],
      });
      const done = settling(activityId);
      await settle(done);
      expect(done.transitioned).toBe(true);
      expect(derivePhase(done.status.conditions)).toBe(Phase.Completed);
    },
    TIMEOUT_MS,
  );
});
