// Fault window 18 (Kafka part): on a three-broker KRaft cluster (test/env/start-kafka-cluster.sh,
// private, so killing a broker disturbs no other test) with the activity's topics at replication
// factor 3 and min.insync.replicas=2, the broker leading an orders partition is SIGKILLed while
// buyers are in flight and orders are flowing. The relay's idempotent producer (acks=all) and the
// consumer group must carry on with the two brokers left (the partition's new leader is in sync,
// so nothing acknowledged is lost) and with retried sends deduplicated by the broker (producer id
// and sequence numbers) or by the unique keys, so: every 202 is exactly one order, no duplicate,
// no order gap, no half message left, invariants hold. The killed broker then restarts (as its pod
// would) and catches up. The suite's PostgreSQL and Redis are used.
// Light (default suite): 40 units, 80 buyers, one kill. FAULT_HEAVY=1 (`make faults`): 120 units,
// 240 buyers in two waves (60, then 180), a kill in each wave (of partition 0's leader at the time,
// so the second kill hits the first one's successor), each broker restarted after its wave.
import type { PartitionMetadata } from 'kafkajs';
import { growPartitions, waitForLeaders } from '../../../core/kafka.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import type { Violation } from '../../faults/harness/invariants.js';
import { recordRun } from '../../faults/harness/results.js';
import {
  Sale,
  answerLog,
  answersToOrders,
  buyers,
  endSale,
  recoverAndCheck,
  sleep,
  steadyBuyers,
  countOrders,
} from '../../faults/harness/sale.js';
import type { BuyerAnswer } from '../../faults/harness/sale.js';
import { kafkaClusterNodes, killKafkaNode, restartKafkaNode } from '../../faults/harness/servers.js';
import { privateKafkaSale } from '../../faults/harness/private-sale.js';
import { waitFor } from '../../../dev/roles.js';
import { uniqueId } from '../../../dev/servers.js';

const heavy = process.env.FAULT_HEAVY === '1';
const STOCK = heavy ? 120 : 40;
// Buyers per wave, twice the stock in all: every unit sold, half the buyers refused. In heavy mode
// the first wave takes half the stock, so the second one still sells while its broker dies.
const WAVES = heavy ? [60, 180] : [80];
const PARTITIONS = 3;
/** How long two of the three brokers stay down: long enough for every client's retries to back off. */
const OUTAGE_MS = 30_000;
/** Both brokers back to every order in PostgreSQL: their start, a re-election, and slack. */
const DRAIN_AFTER_OUTAGE_MS = 60_000;

describe('window 18 (Kafka): brokers of three SIGKILLed mid-sale (replication 3, min.insync.replicas 2)', () => {
  const f = privateKafkaSale();

  test('every 202 is exactly one order, no duplicate, no gap, with the leader of a partition killed', async () => {
    const t0 = Date.now();
    const p = f.priv;
    const servers = f.servers;
    const activityId = uniqueId('f-kbroker');
    const items = [
      { skuId: 'rice', name: '五常大米 稻花香 5kg', price: '89.90', stock: STOCK, limitPerUser: 1 },
    ];
    const { topics, admin, sql, close } = await f.activity(activityId, items, PARTITIONS);
    const killed: number[] = [];
    const answers: BuyerAnswer[] = [];
    let figures: Record<string, number | string> = {};
    const v: Violation[] = [];
    let roleOutput = '';
    let acceptedCount = -1;
    try {
      // Partition metadata of the orders topic, from whichever broker answers. Right after the topic
      // was created (or a broker died) a broker may not know it yet: asked again until one does.
      const partitions = async (): Promise<PartitionMetadata[]> => {
        let got: PartitionMetadata[] = [];
        await waitFor(
          'the orders topic metadata',
          async () => {
            got = await admin
              .fetchTopicMetadata({ topics: [topics.orders] })
              .then((m) => m.topics[0]?.partitions ?? [])
              .catch((): PartitionMetadata[] => []);
            return got.length === PARTITIONS;
          },
          60_000,
          200,
        );
        return got;
      };
      const orders = await partitions();
      // The topic really is what the settings promise (else the test would prove nothing).
      expect(orders.map((x) => x.replicas.length)).toEqual(Array.from({ length: PARTITIONS }, () => 3));
      // Asked again like the metadata: the broker kafkajs asks may not know the new topic yet.
      let minInsync: string | undefined;
      await waitFor(
        "the orders topic's min.insync.replicas",
        async () => {
          minInsync = await admin
            .describeConfigs({
              includeSynonyms: false,
              resources: [{ type: 2 /* TOPIC */, name: topics.orders, configNames: ['min.insync.replicas'] }],
            })
            .then((d) => d.resources[0]?.configEntries[0]?.configValue)
            .catch(() => undefined);
          return minInsync !== undefined;
        },
        60_000,
        200,
      );
      expect(minInsync).toBe('2');

      const ordersNow = (): Promise<number> => countOrders(sql, activityId);

      // The operator adds partitions for its consumer replicas (operator/reconcile/grow-partitions.ts),
      // mid-sale too. With one broker of three down (fenced), Kafka still adds them: KRaft places a
      // replica on the fenced broker when it must, the partition starts with two in sync and the
      // returning broker catches up (docs/operator.md "Kafka topics"). A topic of its own, so the
      // sale's topics keep their partitions.
      const spare = `${topics.orders}.spare`;
      await admin.createTopics({
        // kafkajs' own wait gives up on a broker that does not know the topic yet: ours asks again.
        waitForLeaders: false,
        topics: [{ topic: spare, numPartitions: 1, replicationFactor: 3 }],
      });
      await waitForLeaders(admin, [spare]);
      const sparePartitions = async (): Promise<PartitionMetadata[]> =>
        (await admin.fetchTopicMetadata({ topics: [spare] })).topics[0]?.partitions ?? [];
      const partitionsAddedWhileDown = async (down: number): Promise<void> => {
        // Fenced once its session expires (about 9 s): the cluster's metadata no longer lists it.
        await waitFor(
          `broker ${down} fenced`,
          async () =>
            (await admin.describeCluster().catch(() => undefined))?.brokers.every((b) => b.nodeId !== down) ??
            false,
          60_000,
          200,
        );
        await expect(growPartitions(admin, spare, 2)).resolves.toBe(1);
        // Every broker's metadata lists it in time; growPartitions waited for the one it asked.
        let added: PartitionMetadata | undefined;
        await waitFor(
          'the added partition in the metadata',
          async () => (added = (await sparePartitions()).find((x) => x.partitionId === 1)) !== undefined,
          30_000,
          200,
        );
        expect(added?.replicas).toHaveLength(3);
        expect(added?.isr).not.toContain(down);
      };

      f.sale = new Sale({ servers, activityId });
      const s = f.sale;
      await s.start();
      expect(kafkaClusterNodes(p)).toHaveLength(3);
      for (let w = 0; w < WAVES.length; w += 1) {
        const before = await ordersNow();
        const ids = Array.from({ length: WAVES[w]! }, (_, i) => `${activityId}-w${w}b${i}`);
        const load = buyers(s, activityId, ids, { skuId: 'rice', concurrency: 6, maxAttempts: 400 });
        // Mid-sale: orders are flowing through Kafka (some already in PostgreSQL) and buyers are
        // still arriving; then the leader of partition 0 dies without a word.
        await waitFor(
          'orders flowing through Kafka',
          async () => (await ordersNow()) >= before + 10,
          120_000,
          100,
        );
        const leader = (await partitions()).find((x) => x.partitionId === 0)!.leader;
        await killKafkaNode(p, leader);
        killed.push(leader);
        answers.push(...(await load));
        // With one broker of three down every partition still has two in-sync replicas: the
        // whole wave drains into PostgreSQL before the broker comes back.
        const rec = await recoverAndCheck(servers, activityId, 180_000);
        // (Not draining shows as half messages / order gap among the violations.)
        v.push(
          ...rec.violations.map((x) => ({ ...x, detail: `wave ${w}, broker ${leader} down: ${x.detail}` })),
        );
        if (w === 0) await partitionsAddedWhileDown(leader);
        await restartKafkaNode(p, leader);
      }
      // The restarted broker rejoins every partition's ISR (it caught up from the others).
      await waitFor(
        'the restarted broker(s) back in every ISR',
        async () => (await partitions()).every((x) => x.isr.length === 3),
        120_000,
        500,
      );
      // The broker back, the added partition is fully in sync; asked again, nothing is added.
      await waitFor(
        'the added partition in sync',
        async () => (await sparePartitions()).every((x) => x.isr.length === 3),
        120_000,
        500,
      );
      await expect(growPartitions(admin, spare, 2)).resolves.toBeUndefined();
      const rec = await recoverAndCheck(servers, activityId, 60_000);
      roleOutput = s.output();
      await s.stop();
      f.sale = undefined;
      v.push(...rec.violations);

      const got = await answersToOrders(sql, activityId, answers);
      v.push(...got.violations);
      figures = {
        brokers: 3,
        'brokers killed': killed.length,
        buyers: answers.length,
        '202': got.accepted,
        stock: STOCK,
        orders: got.orders,
        lost: got.lost,
        duplicated: got.duplicated,
        'role restarts': s.deaths.length,
      };
      acceptedCount = got.accepted;
    } finally {
      await close();
    }
    const text = formatViolations(v);
    console.log(`window 18 (Kafka broker) figures: ${JSON.stringify(figures)}`);
    recordRun({
      scenario: heavy ? 'window 18 (Kafka broker, heavy)' : 'window 18 (Kafka broker)',
      outcome: text === '' ? 'pass' : 'fail',
      ms: Date.now() - t0,
      figures,
      ...(text ? { detail: text } : {}),
    });
    if (text !== '') process.stderr.write(`window 18 role output:\n${roleOutput}\n`);
    expect(text).toBe('');
    expect(acceptedCount).toBe(STOCK); // oversubscribed: the whole stock, once
  }, 600_000);

  // Two brokers of three lost at once (a zone of a two-zone layout, a bad rollout): no partition
  // has min.insync.replicas in sync and the controllers have no quorum, so no write can be
  // acknowledged until one comes back. A reservation never waits for Kafka: buyers go on getting
  // their 202s, the outbox in Redis holds the half messages, and once both brokers are back (as
  // their pods restart) every one becomes exactly one order, within DRAIN_AFTER_OUTAGE_MS.
  test('two brokers of three lost: buyers still answered, every 202 one order once they are back', async () => {
    const t0 = Date.now();
    const p = f.priv;
    const servers = f.servers;
    const activityId = uniqueId('f-kmajority');
    const items = [{ skuId: 'tea', name: '龙井 明前 250g', price: '128.00', stock: 5_000, limitPerUser: 1 }];
    const { sql, close } = await f.activity(activityId, items, PARTITIONS);
    const v: Violation[] = [];
    const log = answerLog();
    let accepted202: number[] = [];
    let figures: Record<string, number> = {};
    let roleOutput = '';
    let deaths: string[] = ['(not run)'];
    try {
      const ordersNow = (): Promise<number> => countOrders(sql, activityId);
      const s = new Sale({ servers, activityId });
      f.sale = s;
      await s.start();
      const load = steadyBuyers(s, activityId, {
        skuId: 'tea',
        onAttempt: (a) => {
          log.onAttempt(a);
          if (a.status === 202) accepted202.push(Date.now());
        },
      });
      let downAt = 0;
      let backAt = 0;
      try {
        await waitFor('orders flowing through Kafka', async () => (await ordersNow()) >= 10, 120_000, 100);
        const lost = kafkaClusterNodes(p)
          .slice(1)
          .map((n) => n.node);
        downAt = Date.now();
        await Promise.all(lost.map((node) => killKafkaNode(p, node)));
        accepted202 = [];
        await sleep(OUTAGE_MS);
        const answeredDuringOutage = accepted202.length;
        const ordersAtReturn = await ordersNow();
        await Promise.all(lost.map((node) => restartKafkaNode(p, node)));
        backAt = Date.now();
        // Buyers keep coming after the return, so the roles are seen working again, not only draining.
        await waitFor(
          'orders flowing again',
          async () => (await ordersNow()) >= ordersAtReturn + 10,
          180_000,
          250,
        );
        figures = {
          'brokers lost': lost.length,
          'outage ms': backAt - downAt,
          '202 during the outage': answeredDuringOutage,
        };
      } finally {
        await load.stop();
      }
      const end = await endSale(s, servers, activityId, sql, load.answers, {
        drainMs: DRAIN_AFTER_OUTAGE_MS,
        log,
      });
      f.sale = undefined;
      ({ roleOutput, deaths } = end);
      const got = end.got;
      v.push(...end.violations);
      // The last order reserved during the outage reached PostgreSQL this long after the brokers were back.
      const { rows } = await sql.query<{ at: Date | null }>(
        'SELECT max(created_at) AS at FROM orders WHERE activity_id = $1 AND reserved_at BETWEEN $2 AND $3',
        [activityId, new Date(downAt), new Date(backAt)],
      );
      figures = {
        ...figures,
        buyers: load.answers.length,
        '202': got.accepted,
        orders: got.orders,
        lost: got.lost,
        duplicated: got.duplicated,
        'outage orders written after the return ms': rows[0]?.at ? rows[0].at.getTime() - backAt : -1,
      };
      expect(figures['202 during the outage']).toBeGreaterThan(0);
    } finally {
      await close();
    }
    const text = formatViolations(v);
    console.log(`window 18 (Kafka majority lost) figures: ${JSON.stringify(figures)}`);
    recordRun({
      scenario: 'window 18 (Kafka majority lost)',
      outcome: text === '' && deaths.length === 0 ? 'pass' : 'fail',
      ms: Date.now() - t0,
      figures,
      ...(text ? { detail: text } : {}),
    });
    if (text !== '') process.stderr.write(`window 18 (majority lost) role output:\n${roleOutput}\n`);
    expect(text).toBe('');
    expect(deaths).toEqual([]);
  }, 600_000);
});
