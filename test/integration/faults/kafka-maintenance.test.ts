// Planned Kafka maintenance under a running sale: a rolling restart of a three-broker KRaft cluster
// (test/env/start-kafka-cluster.sh, private), one broker at a time as an operator's rolling update
// does it: SIGTERM (the broker's controlled shutdown moves its partitions' leadership and the
// consumer group's coordinator to the others first), wait for the exit, start it again on its data,
// wait until it is back in every in-sync replica set, next broker. Buyers keep buying throughout.
// Unlike a SIGKILLed broker (kafka-cluster.test.ts) nothing here is a failure: the relay and the
// consumer must ride each restart without a role restart, every 202 is exactly one order, and the
// orders keep reaching PostgreSQL while each broker is away. Then, on the same cluster, partitions
// are added to a sale's orders topic mid-sale (to spread it over more consumers): the relay must
// write to them and the consumer group read them within seconds. The suite's PostgreSQL and Redis
// are used.
import type { PartitionMetadata } from 'kafkajs';
import { AssignerProtocol } from 'kafkajs';
import { formatViolations } from '../../faults/harness/invariants.js';
import type { Violation } from '../../faults/harness/invariants.js';
import { recordRun } from '../../faults/harness/results.js';
import { Sale, answerLog, endSale, steadyBuyers, countOrders } from '../../faults/harness/sale.js';
import { kafkaClusterNodes, restartKafkaNode, stopKafkaNode } from '../../faults/harness/servers.js';
import { privateKafkaSale } from '../../faults/harness/private-sale.js';
import { waitFor } from '../../../dev/roles.js';
import { uniqueId } from '../../../dev/servers.js';

const PARTITIONS = 3;
// More than the buyers of the whole run can take: the load lasts exactly as long as the restarts.
const STOCK = 5_000;
const TEA = [{ skuId: 'tea', name: '龙井 明前 250g', price: '128.00', stock: STOCK, limitPerUser: 1 }];

describe('Kafka maintenance: a rolling restart of three brokers under a running sale', () => {
  const f = privateKafkaSale();

  test('every 202 is one order, no role restarts, orders keep flowing while each broker restarts', async () => {
    const t0 = Date.now();
    const p = f.priv;
    const servers = f.servers;
    const activityId = uniqueId('f-kroll');
    const { topics, admin, sql, close } = await f.activity(activityId, TEA, PARTITIONS);
    const v: Violation[] = [];
    const log = answerLog();
    const restarts: Record<string, number>[] = [];
    let roleOutput = '';
    let deaths: string[] = ['(not run)'];
    try {
      const partitions = async (): Promise<PartitionMetadata[]> =>
        admin
          .fetchTopicMetadata({ topics: [topics.orders] })
          .then((m) => m.topics[0]?.partitions ?? [])
          .catch((): PartitionMetadata[] => []);
      const allInSync = async (): Promise<boolean> => {
        const got = await partitions();
        return got.length === PARTITIONS && got.every((x) => x.isr.length === 3);
      };
      await waitFor('the orders topic fully in sync', allInSync, 60_000, 200);
      const s = new Sale({ servers, activityId });
      f.sale = s;
      await s.start();
      const load = steadyBuyers(s, activityId, { skuId: 'tea', onAttempt: log.onAttempt });
      try {
        for (const { node } of kafkaClusterNodes(p)) {
          const before = await countOrders(sql, activityId);
          await waitFor(
            'orders flowing',
            async () => (await countOrders(sql, activityId)) >= before + 10,
            120_000,
            100,
          );
          const stopAt = new Date();
          const t = Date.now();
          await stopKafkaNode(p, node);
          const stopped = Date.now();
          await restartKafkaNode(p, node);
          const started = Date.now();
          await waitFor(`broker ${node} back in every ISR`, allInSync, 180_000, 250);
          const inSync = Date.now();
          // Orders written while the broker was away or catching up, and the slowest of those reserved
          // meanwhile (reservation to order in PostgreSQL).
          const { rows } = await sql.query<{ written: string; max_ms: string | null }>(
            `SELECT count(*) FILTER (WHERE created_at BETWEEN $2 AND $3)::text AS written,
                    max(extract(epoch FROM created_at - reserved_at) * 1000)
                      FILTER (WHERE reserved_at BETWEEN $2 AND $3)::bigint::text AS max_ms
               FROM orders WHERE activity_id = $1`,
            [activityId, stopAt, new Date(inSync)],
          );
          restarts.push({
            node,
            'shutdown ms': stopped - t,
            'start ms': started - stopped,
            'back in sync ms': inSync - started,
            'orders written meanwhile': Number(rows[0]!.written),
            'slowest of them, reservation to order ms': Number(rows[0]!.max_ms ?? -1),
          });
        }
      } finally {
        await load.stop();
      }
      const end = await endSale(s, servers, activityId, sql, load.answers, { drainMs: 120_000, log });
      f.sale = undefined;
      ({ roleOutput, deaths } = end);
      const got = end.got;
      v.push(...end.violations);
      console.log(
        `kafka rolling restart: ${JSON.stringify({ buyers: load.answers.length, '202': got.accepted, orders: got.orders, restarts })}`,
      );
      recordRun({
        scenario: 'Kafka rolling restart',
        outcome: v.length === 0 && deaths.length === 0 ? 'pass' : 'fail',
        ms: Date.now() - t0,
        figures: {
          buyers: load.answers.length,
          '202': got.accepted,
          orders: got.orders,
          lost: got.lost,
          duplicated: got.duplicated,
        },
      });
    } finally {
      await close();
    }
    const text = formatViolations(v);
    if (text !== '') process.stderr.write(`kafka rolling restart role output:\n${roleOutput}\n`);
    expect(text).toBe('');
    // A planned restart is no failure: no role died of it ...
    expect(deaths).toEqual([]);
    // ... and orders reached PostgreSQL while each broker was away or catching up.
    expect(restarts.map((r) => r['orders written meanwhile']! > 0)).toEqual([true, true, true]);
  }, 900_000);

  test('partitions added to the orders topic mid-sale carry orders, and the consumer group reads them', async () => {
    const t0 = Date.now();
    const servers = f.servers;
    const activityId = uniqueId('f-kparts');
    const { topics, admin, sql, close } = await f.activity(activityId, TEA, PARTITIONS);
    const log = answerLog();
    const v: Violation[] = [];
    let figures: Record<string, number> = {};
    let roleOutput = '';
    let deaths: string[] = ['(not run)'];
    const added = Array.from({ length: PARTITIONS }, (_, i) => PARTITIONS + i);
    try {
      const s = new Sale({ servers, activityId });
      f.sale = s;
      await s.start();
      const load = steadyBuyers(s, activityId, { skuId: 'tea', onAttempt: log.onAttempt });
      let usedAfterMs = -1;
      let readAfterMs = -1;
      let sharedAfterMs = -1;
      const committedOffsets = async (): Promise<Map<number, number>> =>
        admin
          .fetchOffsets({ groupId: topics.consumerGroup, topics: [topics.orders] })
          .then((t) => new Map((t[0]?.partitions ?? []).map((o) => [o.partition, Number(o.offset)])))
          .catch(() => new Map<number, number>());
      let addedAt = new Date();
      try {
        const before = await countOrders(sql, activityId);
        await waitFor(
          'orders flowing',
          async () => (await countOrders(sql, activityId)) >= before + 10,
          120_000,
          100,
        );
        // As a platform team scales a sale's consumers beyond its partitions: 3 -> 6.
        addedAt = new Date();
        await admin.createPartitions({ topicPartitions: [{ topic: topics.orders, count: 2 * PARTITIONS }] });
        // The relay spreads new orders over the added partitions too ...
        await waitFor(
          'orders in every added partition',
          async () => {
            const offsets = await admin.fetchTopicOffsets(topics.orders).catch(() => []);
            return added.every((n) => Number(offsets.find((o) => o.partition === n)?.high ?? 0) > 0);
          },
          120_000,
          250,
        );
        usedAfterMs = Date.now() - addedAt.getTime();
        // ... and the consumer group reads them (offsets committed once their orders are written).
        await waitFor(
          'the consumer group committing in every added partition',
          async () => {
            const committed = await committedOffsets();
            return added.every((n) => (committed.get(n) ?? -1) > 0);
          },
          120_000,
          250,
        );
        readAfterMs = Date.now() - addedAt.getTime();
        // What the partitions were added for: a second consumer process joining the group (its
        // Deployment scaled out) takes half of them, and both write orders.
        const joinedAt = Date.now();
        await s.addInstance('consumer', 'consumer-2');
        await waitFor(
          'two consumers sharing the six partitions',
          async () => {
            const group = await admin
              .describeGroups([topics.consumerGroup])
              .then((d) => d.groups[0])
              .catch(() => undefined);
            const shares = (group?.members ?? []).map(
              (m) =>
                AssignerProtocol.MemberAssignment.decode(m.memberAssignment)?.assignment[topics.orders]
                  ?.length,
            );
            return group?.state === 'Stable' && shares.length === 2 && shares.every((n) => n === PARTITIONS);
          },
          120_000,
          250,
        );
        const shared = await committedOffsets();
        await waitFor(
          'offsets committed in all six partitions after the re-balance',
          async () => {
            const now = await committedOffsets();
            return [...Array(2 * PARTITIONS).keys()].every((n) => (now.get(n) ?? -1) > (shared.get(n) ?? -1));
          },
          120_000,
          250,
        );
        sharedAfterMs = Date.now() - joinedAt;
      } finally {
        await load.stop();
      }
      const end = await endSale(s, servers, activityId, sql, load.answers, { drainMs: 120_000, log });
      f.sale = undefined;
      ({ roleOutput, deaths } = end);
      const got = end.got;
      v.push(...end.violations);
      const { rows } = await sql.query<{ max_ms: string | null }>(
        `SELECT max(extract(epoch FROM created_at - reserved_at) * 1000)::bigint::text AS max_ms
           FROM orders WHERE activity_id = $1 AND reserved_at >= $2`,
        [activityId, addedAt],
      );
      figures = {
        buyers: load.answers.length,
        '202': got.accepted,
        orders: got.orders,
        'added partitions used after ms': usedAfterMs,
        'added partitions read after ms': readAfterMs,
        'a second consumer writing its half after ms': sharedAfterMs,
        'slowest order reserved after the change, reservation to order ms': Number(rows[0]!.max_ms ?? -1),
      };
      console.log(`kafka partitions added: ${JSON.stringify(figures)}`);
    } finally {
      await close();
    }
    const text = formatViolations(v);
    recordRun({
      scenario: 'Kafka partitions added mid-sale',
      outcome: text === '' && deaths.length === 0 ? 'pass' : 'fail',
      ms: Date.now() - t0,
      figures,
      ...(text ? { detail: text } : {}),
    });
    if (text !== '') process.stderr.write(`kafka partitions added, role output:\n${roleOutput}\n`);
    expect(text).toBe('');
    expect(deaths).toEqual([]);
  }, 600_000);
});
