/**
 * Step 3b: the orders topic has a partition for every consumer replica the spec asks for. A
 * consumer group hands out whole partitions, so a consumer beyond the topic's partitions gets none
 * and sits idle: scaling `runtime.replicas.*.consumer` above `KAFKA_TOPIC_PARTITIONS` adds
 * partitions (never removes: Kafka cannot). From Ready on (the topics exist), for the largest
 * consumer count of any phase, so a sale's partitions are in place before it opens; an edit while
 * Active raises them then. The relay and the consumers use added partitions within
 * KAFKA_METADATA_MAX_AGE_MS; an order's partition does not matter to it (the unique keys decide).
 * A Kafka that refuses or does not answer holds nothing (the sale goes on with the partitions it
 * has): Degraded says so with PartitionsNotAdded, one Warning event, and the step is tried again.
 */
import { findCondition } from '../api/v1alpha1/conditions.js';
import { ConditionType, EventReason, Phase, Reason } from '../api/v1alpha1/types.js';
import { PartitionsNotAddedError } from '../../core/kafka.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE } from './context.js';

const PHASES: readonly Phase[] = [Phase.Ready, Phase.Active, Phase.Draining];

/** The most consumer replicas any phase of the spec runs. */
export function consumersWanted(replicas: {
  warmUp: { consumer: number };
  active: { consumer: number };
  draining: { consumer: number };
}): number {
  return Math.max(replicas.warmUp.consumer, replicas.active.consumer, replicas.draining.consumer);
}

export async function growPartitions(ctx: ReconcileContext): Promise<StepResult> {
  if (ctx.deleting || !PHASES.includes(ctx.phase)) return CONTINUE;
  const asked = consumersWanted(ctx.fsa.spec.runtime.replicas);
  // Tenants share the brokers and a partition can never be removed: at most the operator's cap,
  // whatever a resource asks for (the CRD allows 1000 consumers per phase).
  const { partitions, maxPartitions } = ctx.deps.config.kafka;
  const wanted = Math.min(asked, maxPartitions);
  if (asked > wanted) {
    ctx.degraded = {
      reason: Reason.PartitionsCapped,
      message:
        `spec.runtime.replicas asks for ${asked} consumers; the orders topic gets at most ` +
        `${maxPartitions} partitions (the operator's KAFKA_MAX_TOPIC_PARTITIONS): consumer replicas ` +
        'beyond them get none and sit idle',
    };
  }
  if (wanted <= partitions) return CONTINUE;
  // The activity id's topic belongs to its owner only.
  ctx.requireOwnership();
  const topic = ctx.deps.kafka.topics(ctx.activityId).orders;
  try {
    const before = await ctx.deps.kafka.growOrdersPartitions(ctx.activityId, wanted);
    if (before !== undefined) {
      await ctx.event(
        'Normal',
        EventReason.PartitionsAdded,
        `Kafka topic ${topic}: ${before} -> ${wanted} partitions, one per consumer replica`,
      );
    }
  } catch (err) {
    // Consumers beyond the partitions get none and sit idle: a user scaling them must see why.
    const cause =
      err instanceof PartitionsNotAddedError
        ? err.message
        : `Kafka topic ${topic}: partitions not added (${wanted} wanted): ${messageOf(err)}`;
    const retrySeconds = Math.round(ctx.deps.config.cleanupRetryMs / 1000);
    const message =
      `${cause}. Consumer replicas beyond the topic's partitions get none until they are added ` +
      `(spec.runtime.replicas asks for ${wanted} consumers); retried at least every ${retrySeconds} s`;
    const degraded = findCondition(ctx.fsa.status?.conditions, ConditionType.Degraded);
    const already = degraded?.status === 'True' && degraded.reason === Reason.PartitionsNotAdded;
    ctx.degraded = { reason: Reason.PartitionsNotAdded, message };
    if (!already) await ctx.event('Warning', EventReason.PartitionsNotAdded, message);
    ctx.log.warn({ err: messageOf(err), topic, wanted }, 'could not add partitions to the orders topic');
    ctx.requeueAfter(ctx.deps.config.cleanupRetryMs);
  }
  return CONTINUE;
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
