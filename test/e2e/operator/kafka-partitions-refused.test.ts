// Partitions Kafka refuses to add. The operator's Kafka principal may create, read and write the
// sale's topics but lacks `Alter` on them (an ACL set up for a topic-per-sale platform that forgot
// CreatePartitions): the consumers asked for beyond the orders topic's partitions would sit idle.
// A private Kafka with the standard authorizer refuses for real; the sale goes on with the
// partitions it has, Degraded says why in terms to act on, and the grant docs/operator.md gives
// (`kafka-acls --add … --operation Alter`) adds them and clears it.
import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import type { Admin as KafkaAdmin } from 'kafkajs';
import { createKafka, topicsFor } from '../../../core/kafka.js';
import { findCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import {
  admin,
  createActivity,
  eventsOf,
  forceRemoveFinalizers,
  getActivity,
  startOperator,
  waitFor,
  waitForPhase,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess } from '../../../dev/operator-harness.js';
import { startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';
import { operatorWorld, saleWithThreeActiveConsumers } from './setup.js';
import type { OperatorWorld } from './setup.js';

const run = promisify(execFile);
const TIMEOUT_MS = 300_000;

// Kafka's own authorizer; a resource without ACLs stays open to everyone, so only the orders
// topics' prefix below is restricted.
const AUTHORIZER = [
  'authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer',
  'allow.everyone.if.no.acl.found=true',
].join('\n');
// PLAINTEXT clients (the operator here) are this principal.
const PRINCIPAL = 'User:ANONYMOUS';

describe('operator: partitions Kafka refuses to add', () => {
  const a = admin();
  const activityId = uniqueId('parts-acl');
  const name = 'sale';
  let world: OperatorWorld | undefined;
  let priv: PrivateServers | undefined;
  let db: FreshDatabase;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;
  let kafka: KafkaAdmin | undefined;

  /** kafka-acls.sh is `kafka-run-class.sh kafka.admin.AclCommand "$@"`: the same, on this node. */
  const kafkaAcls = async (...args: string[]): Promise<void> => {
    await run(
      'bash',
      [
        join(dirname(priv!.env.KAFKA_CONFIG!), 'run.sh'),
        'kafka.admin.AclCommand',
        '--bootstrap-server',
        priv!.env.KAFKA_BROKERS!,
        ...args,
      ],
      { timeout: 60_000 },
    );
  };

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-parts-acl', record: false });
    ({ db, ns } = world);
    priv = await startPrivateServers(['kafka'], { KAFKA_EXTRA_PROPERTIES: AUTHORIZER });
    // Everything on the sales' topics but Alter.
    await kafkaAcls(
      '--add',
      '--allow-principal',
      PRINCIPAL,
      ...['Read', 'Write', 'Create', 'Describe', 'DescribeConfigs', 'AlterConfigs', 'Delete'].flatMap(
        (op) => ['--operation', op],
      ),
      '--topic',
      'flashsale.orders.',
      '--resource-pattern-type',
      'prefixed',
    );
    kafka = createKafka([priv.env.KAFKA_BROKERS!], `${ns.namespace}-check`).admin();
    await kafka.connect();
  }, TIMEOUT_MS);

  afterAll(async () => {
    if (ns) await forceRemoveFinalizers(a, ns.namespace).catch(() => undefined);
    await operator?.kill('SIGTERM');
    await kafka?.disconnect();
    if (priv) await stopPrivateServers(priv);
    await world?.close();
  }, TIMEOUT_MS);

  const partitions = async (): Promise<number> =>
    (await kafka!.fetchTopicMetadata({ topics: [topicsFor(activityId).orders] })).topics[0]?.partitions
      .length ?? 0;
  const eventsFor = async (reason: string): Promise<{ type?: string; message?: string }[]> =>
    (await eventsOf(a, ns.namespace, name)).filter((e) => e.reason === reason);

  it(
    'sells on the partitions it has with Degraded PartitionsNotAdded; the documented grant adds them and clears it',
    async () => {
      operator = await startOperator({
        ns,
        databaseUrl: db.url,
        env: {
          KAFKA_BROKERS: priv!.env.KAFKA_BROKERS!,
          KAFKA_TOPIC_PARTITIONS: '2',
          CLEANUP_RETRY_SECONDS: '2',
        },
      });
      await createActivity(a, saleWithThreeActiveConsumers(ns.namespace, name, activityId, 10_000));
      const orders = topicsFor(activityId).orders;
      const refused = await waitFor(
        'Degraded PartitionsNotAdded',
        async () => {
          const fsa = await getActivity(a, ns.namespace, name);
          const degraded = findCondition(fsa?.status?.conditions, 'Degraded');
          return degraded?.reason === 'PartitionsNotAdded' ? degraded : undefined;
        },
        90_000,
      );
      const message =
        `Kafka topic ${orders}: partitions not added (2, 3 wanted): TOPIC_AUTHORIZATION_FAILED: this ` +
        "client's Kafka principal needs the Alter operation on the topic (CreatePartitions; " +
        'docs/operator.md, "Kafka topics"). Consumer replicas beyond the topic\'s partitions get none ' +
        'until they are added (spec.runtime.replicas asks for 3 consumers); retried at least every 2 s';
      expect(refused.status).toBe('True');
      expect(refused.message).toBe(message);

      // The sale is not held for it: it opens on the partitions it has.
      await waitForPhase(a, ns.namespace, name, Phase.Active, 60_000);
      expect(await partitions()).toBe(2);
      // Retried every CLEANUP_RETRY_SECONDS (2 s here), said once.
      await new Promise((resolve) => setTimeout(resolve, 5_000));
      expect(await eventsFor('PartitionsNotAdded')).toEqual([
        expect.objectContaining({ type: 'Warning', message }),
      ]);
      expect(await eventsFor('PartitionsAdded')).toEqual([]);

      // The grant docs/operator.md gives, for every sale's orders topic.
      await kafkaAcls(
        '--add',
        '--allow-principal',
        PRINCIPAL,
        '--operation',
        'Alter',
        '--topic',
        'flashsale.orders.',
        '--resource-pattern-type',
        'prefixed',
      );
      await waitFor('3 partitions', async () => (await partitions()) === 3, 60_000);
      await waitFor('the PartitionsAdded event', async () => (await eventsFor('PartitionsAdded')).length > 0);
      expect((await eventsFor('PartitionsAdded')).map((e) => e.message)).toEqual([
        `Kafka topic ${orders}: 2 -> 3 partitions, one per consumer replica`,
      ]);
      await waitFor(
        'Degraded PartitionsNotAdded cleared',
        async () => {
          const fsa = await getActivity(a, ns.namespace, name);
          return findCondition(fsa?.status?.conditions, 'Degraded')?.reason !== 'PartitionsNotAdded';
        },
        30_000,
      );
      const after = await getActivity(a, ns.namespace, name);
      expect(after?.status?.phase).toBe(Phase.Active);
      expect(findCondition(after?.status?.conditions, 'Degraded')?.status).not.toBe('True');
    },
    TIMEOUT_MS,
  );
});
