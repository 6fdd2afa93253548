// A consumer group hands out whole partitions, so consumer replicas beyond the orders topic's
// partitions sit idle. The operator gives the orders topic a partition per consumer replica the
// spec asks for (operator/reconcile/grow-partitions.ts): before the sale opens for the largest
// count of any phase, and again when the consumer replicas are raised while Active; never fewer.
// The relay and the consumers use added partitions within seconds
// (test/integration/faults/kafka-maintenance.test.ts).
import type { Admin as KafkaAdmin } from 'kafkajs';
import { createKafka, topicsFor } from '../../../core/kafka.js';
import { deploymentName } from '../../../operator/api/v1alpha1/funcs.js';
import { GROUP, PLURAL, Phase, VERSION } from '../../../operator/api/v1alpha1/types.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import {
  admin,
  createActivity,
  eventsOf,
  forceRemoveFinalizers,
  startOperator,
  waitFor,
  waitForPhase,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess } from '../../../dev/operator-harness.js';
import { operatorWorld, saleWithThreeActiveConsumers } from './setup.js';
import type { OperatorWorld } from './setup.js';

const TIMEOUT_MS = 240_000;

describe('operator: the orders topic has a partition per consumer replica', () => {
  const a = admin();
  const activityId = uniqueId('parts');
  const name = 'sale';
  let world: OperatorWorld | undefined;
  let db: FreshDatabase;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;
  let kafka: KafkaAdmin | undefined;

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-parts', record: false });
    ({ db, ns } = world);
    kafka = createKafka(testEnv().kafkaBrokers, `${ns.namespace}-check`).admin();
    await kafka.connect();
  }, TIMEOUT_MS);

  afterAll(async () => {
    if (ns) await forceRemoveFinalizers(a, ns.namespace).catch(() => undefined);
    await operator?.kill('SIGTERM');
    await kafka?.disconnect();
    await world?.close();
  }, TIMEOUT_MS);

  const partitions = async (): Promise<number> =>
    (await kafka!.fetchTopicMetadata({ topics: [topicsFor(activityId).orders] })).topics[0]?.partitions
      .length ?? 0;
  const partitionEvents = async (): Promise<string[]> =>
    (await eventsOf(a, ns.namespace, name))
      .filter((e) => e.reason === 'PartitionsAdded')
      .map((e) => e.message);
  const setActiveConsumers = (n: number) =>
    a.custom.patchNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: ns.namespace,
      plural: PLURAL,
      name,
      body: [{ op: 'replace', path: '/spec/runtime/replicas/active/consumer', value: n }],
    });

  it(
    'adds partitions before the sale opens and when consumers are raised while Active, never removes any',
    async () => {
      operator = await startOperator({ ns, databaseUrl: db.url, env: { KAFKA_TOPIC_PARTITIONS: '2' } });
      await createActivity(a, saleWithThreeActiveConsumers(ns.namespace, name, activityId, 15_000));
      // Created with KAFKA_TOPIC_PARTITIONS (2), raised to the Active phase's 3 consumers before
      // the gate opens.
      const ready = await waitForPhase(a, ns.namespace, name, [Phase.Ready, Phase.Active], 90_000);
      await waitFor('3 partitions', async () => (await partitions()) === 3, 60_000);
      const firstEvents = await waitFor('the PartitionsAdded event', async () => {
        const got = await partitionEvents();
        return got.length > 0 ? got : undefined;
      });
      expect(firstEvents).toEqual([
        `Kafka topic ${topicsFor(activityId).orders}: 2 -> 3 partitions, one per consumer replica`,
      ]);
      expect(ready.status?.phase === Phase.Ready || ready.status?.phase === Phase.Active).toBe(true);

      // Raised while Active: 5 consumers, 5 partitions.
      await waitForPhase(a, ns.namespace, name, Phase.Active, 60_000);
      await setActiveConsumers(5);
      await waitFor('5 partitions', async () => (await partitions()) === 5, 60_000);
      await waitFor('the second PartitionsAdded event', async () => (await partitionEvents()).length === 2);
      expect((await partitionEvents())[1]).toBe(
        `Kafka topic ${topicsFor(activityId).orders}: 3 -> 5 partitions, one per consumer replica`,
      );

      // Lowered again: Kafka cannot take partitions away, and the operator does not try.
      await setActiveConsumers(1);
      await waitFor('the edit applied', async () => {
        const d = await a.apps.readNamespacedDeployment({
          name: deploymentName(name, 'consumer'),
          namespace: ns.namespace,
        });
        return d.spec?.replicas === 1;
      });
      expect(await partitions()).toBe(5);
      expect(await partitionEvents()).toHaveLength(2);
    },
    TIMEOUT_MS,
  );
});
