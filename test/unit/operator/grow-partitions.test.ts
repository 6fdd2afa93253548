// A consumer replica beyond the orders topic's partitions gets none and sits idle, so a refusal to
// add partitions must reach the user: Degraded=True PartitionsNotAdded naming the topic, the
// counts and the cause, one Warning event, and the step tried again; the sale is not held. The
// refusal itself comes from a real three-broker Kafka in test/integration/faults/kafka-cluster.test.ts.
import kafkajs from 'kafkajs';
import type { Admin, KafkaJSProtocolError } from 'kafkajs';
import { PartitionsNotAddedError, growPartitions as addPartitions } from '../../../core/kafka.js';
import { createLogger } from '../../../core/logger.js';
import { loadOperatorConfig } from '../../../operator/config.js';
import { enterPhase, findCondition, setCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { ConditionType, Phase, Reason } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import { ReconcileContext } from '../../../operator/reconcile/context.js';
import type { ReconcileDeps } from '../../../operator/reconcile/context.js';
import { growPartitions } from '../../../operator/reconcile/grow-partitions.js';
import type { KafkaAccess } from '../../../operator/reconcile/kafka-access.js';
import { activityFixture } from './activity-fixture.js';

const config = loadOperatorConfig({
  DATABASE_URL: 'postgres://u:secret@db/flashsale',
  REDIS_URL: 'redis://redis:6379',
  KAFKA_BROKERS: 'k1:9092',
  KAFKA_TOPIC_PARTITIONS: '2',
  CLEANUP_RETRY_SECONDS: '20',
});
const NOW = new Date('2030-01-01T09:00:00Z');
const TOPIC = 'flashsale.orders.shop.spring';

function activity(phase: Phase, consumers: number, degradedReason?: string): FlashSaleActivity {
  let conditions = enterPhase(undefined, phase, 'test', 3, NOW);
  if (degradedReason) {
    conditions = setCondition(
      conditions,
      { type: ConditionType.Degraded, status: 'True', reason: degradedReason, message: 'earlier pass' },
      3,
      NOW,
    );
  }
  return activityFixture({ replicas: { active: { consumer: consumers } }, status: { conditions } });
}

interface Pass {
  ctx: ReconcileContext;
  events: { type: string; reason: string; message: string }[];
  grows: number[];
}

function pass(fsa: FlashSaleActivity, grow: (count: number) => Promise<number | undefined>): Pass {
  const events: Pass['events'] = [];
  const grows: number[] = [];
  const kafka: Pick<KafkaAccess, 'topics' | 'growOrdersPartitions'> = {
    topics: () => ({ orders: TOPIC, dlq: `${TOPIC}.dlq`, consumerGroup: 'g', dlqHandledGroup: 'h' }),
    growOrdersPartitions: async (_id, count) => {
      grows.push(count);
      return grow(count);
    },
  };
  const deps = {
    config,
    kafka,
    now: () => NOW,
    events: {
      record: async (_fsa: FlashSaleActivity, type: string, reason: string, message: string) => {
        events.push({ type, reason, message });
      },
    },
  } as unknown as ReconcileDeps;
  const ctx = new ReconcileContext(
    deps,
    fsa,
    'shop.spring',
    { warmUpAt: NOW, startAt: NOW, endAt: NOW },
    createLogger('test', 'silent'),
  );
  ctx.ownsActivityId = true;
  return { ctx, events, grows };
}

const refused = new PartitionsNotAddedError(
  TOPIC,
  2,
  3,
  'the topic has 3 replicas per partition and 2 broker(s) are available (node ids 1, 3); retried until the brokers are back',
);

describe('grow-partitions: partitions Kafka will not add', () => {
  it('reports Degraded PartitionsNotAdded with the cause and one Warning event, and tries again', async () => {
    const p = pass(activity(Phase.Ready, 3), async () => {
      throw refused;
    });
    await expect(growPartitions(p.ctx)).resolves.toEqual({ done: false });
    expect(p.grows).toEqual([3]);
    const expected =
      `Kafka topic ${TOPIC}: partitions not added (2, 3 wanted): the topic has 3 replicas per partition ` +
      'and 2 broker(s) are available (node ids 1, 3); retried until the brokers are back. Consumer ' +
      "replicas beyond the topic's partitions get none until they are added (spec.runtime.replicas " +
      'asks for 3 consumers); retried at least every 20 s';
    expect(p.ctx.degraded).toEqual({ reason: Reason.PartitionsNotAdded, message: expected });
    expect(p.events).toEqual([{ type: 'Warning', reason: 'PartitionsNotAdded', message: expected }]);
    expect(p.ctx.requeueAtMs).toBe(NOW.getTime() + 20_000);
  });

  it('says it once: a pass that finds the condition already there records no second event', async () => {
    const p = pass(activity(Phase.Active, 3, Reason.PartitionsNotAdded), async () => {
      throw refused;
    });
    await growPartitions(p.ctx);
    expect(p.ctx.degraded?.reason).toBe(Reason.PartitionsNotAdded);
    expect(p.events).toEqual([]);
  });

  it('names what went wrong when Kafka did not answer at all', async () => {
    const p = pass(activity(Phase.Active, 4), async () => {
      throw new Error('Kafka grow partitions shop.spring: no answer in 5000 ms');
    });
    await growPartitions(p.ctx);
    expect(p.ctx.degraded?.message).toMatch(
      new RegExp(
        `^Kafka topic ${TOPIC.replace(/\./g, '\\.')}: partitions not added \\(4 wanted\\): ` +
          'Kafka grow partitions shop\\.spring: no answer in 5000 ms\\. ',
      ),
    );
    expect(p.events.map((e) => e.reason)).toEqual(['PartitionsNotAdded']);
  });

  it('gives at most KAFKA_MAX_TOPIC_PARTITIONS, saying so (tenants share the brokers; partitions stay for ever)', async () => {
    // The largest consumer count of any phase, even one a Ready sale never runs (draining 1000).
    const fsa = activityFixture({
      replicas: { draining: { consumer: 1000 } },
      status: { conditions: enterPhase(undefined, Phase.Ready, 'test', 3, NOW) },
    });
    const p = pass(fsa, async () => 2);
    await growPartitions(p.ctx);
    expect(p.grows).toEqual([64]);
    expect(p.ctx.degraded).toEqual({
      reason: Reason.PartitionsCapped,
      message:
        "spec.runtime.replicas asks for 1000 consumers; the orders topic gets at most 64 partitions (the operator's " +
        'KAFKA_MAX_TOPIC_PARTITIONS): consumer replicas beyond them get none and sit idle',
    });
    expect(p.events.map((e) => e.message)).toEqual([
      `Kafka topic ${TOPIC}: 2 -> 64 partitions, one per consumer replica`,
    ]);
  });

  it('clears once they are added: a Normal event, no Degraded from this step', async () => {
    const p = pass(activity(Phase.Active, 3, Reason.PartitionsNotAdded), async () => 2);
    await growPartitions(p.ctx);
    expect(p.ctx.degraded).toBeUndefined();
    expect(p.events).toEqual([
      {
        type: 'Normal',
        reason: 'PartitionsAdded',
        message: `Kafka topic ${TOPIC}: 2 -> 3 partitions, one per consumer replica`,
      },
    ]);
    expect(findCondition(p.ctx.fsa.status?.conditions, ConditionType.Degraded)?.reason).toBe(
      Reason.PartitionsNotAdded,
    ); // what the last pass wrote; update-status replaces it with this pass's AsExpected
  });

  it('asks nothing of Kafka when the partitions suffice or the phase has no sale on its topics', async () => {
    const enough = pass(activity(Phase.Active, 2), async () => undefined);
    await growPartitions(enough.ctx);
    const warming = pass(activity(Phase.WarmingUp, 5), async () => undefined);
    await growPartitions(warming.ctx);
    expect([...enough.grows, ...warming.grows]).toEqual([]);
  });
});

/**
 * An admin whose topic has 2 partitions of 3 replicas and answers CreatePartitions with `refusal`;
 * with `raisedMeanwhile`, another client has raised the topic to 3 by then.
 */
function refusingAdmin(refusal: Error, raisedMeanwhile = false): Admin {
  let partitions = 2;
  const admin = {
    fetchTopicMetadata: async () => ({
      topics: [
        {
          name: TOPIC,
          partitions: Array.from({ length: partitions }, (_, i) => ({
            partitionId: i,
            leader: 1,
            replicas: [1, 2, 3],
            isr: [1, 2, 3],
            partitionErrorCode: 0,
            offlineReplicas: [],
          })),
        },
      ],
    }),
    describeCluster: async () => ({
      brokers: [
        { nodeId: 3, host: 'h', port: 1 },
        { nodeId: 1, host: 'h', port: 1 },
      ],
      controller: 1,
      clusterId: 'c',
    }),
    createPartitions: async () => {
      if (raisedMeanwhile) partitions = 3;
      throw refusal;
    },
  };
  return admin as unknown as Admin;
}

/** A Kafka error answer as kafkajs raises it (createErrorFromCode). */
const protocolError = (type: string, code: number): KafkaJSProtocolError =>
  // Not among the names Node finds in kafkajs' CommonJS exports: taken from the module object.
  new kafkajs.KafkaJSProtocolError(
    Object.assign(new Error(`kafkajs says ${type}`), { type, code, retriable: false }),
  );

describe("core/kafka growPartitions: Kafka's refusals in the user's terms", () => {
  it('too few brokers for the topic’s replicas: the replicas and the brokers available', async () => {
    await expect(
      addPartitions(refusingAdmin(protocolError('INVALID_REPLICATION_FACTOR', 38)), TOPIC, 3),
    ).rejects.toThrow(
      new PartitionsNotAddedError(
        TOPIC,
        2,
        3,
        'the topic has 3 replicas per partition and the cluster fewer brokers (2 available: ' +
          'node ids 1, 3); retried until it has them',
      ),
    );
  });

  it('not authorized: the ACL the principal needs', async () => {
    const err = await addPartitions(
      refusingAdmin(protocolError('TOPIC_AUTHORIZATION_FAILED', 29)),
      TOPIC,
      3,
    ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PartitionsNotAddedError);
    expect((err as Error).message).toBe(
      `Kafka topic ${TOPIC}: partitions not added (2, 3 wanted): TOPIC_AUTHORIZATION_FAILED: this ` +
        "client's Kafka principal needs the Alter operation on the topic (CreatePartitions; " +
        'docs/operator.md, "Kafka topics")',
    );
  });

  it('another refusal keeps Kafka’s type and message; a connection error passes unchanged', async () => {
    await expect(
      addPartitions(refusingAdmin(protocolError('POLICY_VIOLATION', 44)), TOPIC, 3),
    ).rejects.toThrow(
      `Kafka topic ${TOPIC}: partitions not added (2, 3 wanted): POLICY_VIOLATION: kafkajs says POLICY_VIOLATION`,
    );
    const lost = new Error('Connection error: connect ECONNREFUSED 127.0.0.1:9092');
    await expect(addPartitions(refusingAdmin(lost), TOPIC, 3)).rejects.toBe(lost);
  });

  it('a refusal because another client raised the topic first is no refusal', async () => {
    // The count read after the refusal already reaches the wanted one.
    await expect(
      addPartitions(refusingAdmin(protocolError('INVALID_PARTITIONS', 37), true), TOPIC, 3),
    ).resolves.toBeUndefined();
  });
});
