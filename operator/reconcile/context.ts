/**
 * What a reconcile pass works with. Steps read the resource as fetched at the start of the pass,
 * act, and record what they did on the working status; update-status.ts writes it once at the end.
 * A step that moves the lifecycle calls `transition()` and ends the pass, so every phase is
 * recorded in the API server before any side effect of the next phase happens.
 */
import type { AppsV1Api, CoreV1Api, PolicyV1Api, V1Deployment } from '@kubernetes/client-node';
import type { Pool } from '../../core/db/pool.js';
import type { Logger } from '../../core/logger.js';
import type { OperatorMetrics } from '../../core/metrics.js';
import type { RedisClient } from '../../core/scripts.js';
import type { OperatorConfig } from '../config.js';
import { enterPhase, derivePhase } from '../api/v1alpha1/conditions.js';
import type { EffectiveSchedule } from '../api/v1alpha1/funcs.js';
import type {
  FlashSaleActivity,
  FlashSaleActivityStatus,
  Phase,
  PhaseTimestamps,
} from '../api/v1alpha1/types.js';
import type { ActivityClient } from '../kube/activities.js';
import type { EventSink, EventType } from '../kube/events.js';
import type { EventReason } from '../api/v1alpha1/types.js';
import type { KafkaAccess } from './kafka-access.js';

export interface ReconcileDeps {
  config: OperatorConfig;
  log: Logger;
  activities: ActivityClient;
  apps: AppsV1Api;
  core: CoreV1Api;
  /** The runtime roles' PodDisruptionBudgets (protect-api.ts). */
  policy: PolicyV1Api;
  events: EventSink;
  /** The Deployment informer's cache. */
  deployment: (namespace: string, name: string) => V1Deployment | undefined;
  redis: RedisClient;
  pool: Pool;
  kafka: KafkaAccess;
  metrics: OperatorMetrics;
  identity: string;
  now: () => Date;
}

export interface StepResult {
  /** End the pass here (update-status still runs). */
  done: boolean;
}

export const CONTINUE: StepResult = { done: false };
export const DONE: StepResult = { done: true };

export type Step = (ctx: ReconcileContext) => Promise<StepResult>;

const TIMESTAMP_FIELD: Record<Phase, keyof PhaseTimestamps> = {
  Pending: 'pending',
  WarmingUp: 'warmingUp',
  Ready: 'ready',
  Active: 'active',
  Draining: 'draining',
  WritingBack: 'writingBack',
  CleaningUp: 'cleaningUp',
  Settling: 'settling',
  Completed: 'completed',
  Failed: 'failed',
};

export class ReconcileContext {
  /** The phase the pass started in (as recorded in the API server). */
  readonly phase: Phase;
  readonly deleting: boolean;
  readonly now: Date;
  /** The working status; written by update-status.ts. */
  status: FlashSaleActivityStatus;
  /** Earliest instant at which the key should be looked at again. */
  requeueAtMs: number | undefined;
  /** Set by transition(): the next pass should run at once. */
  transitioned = false;
  /** A temporary problem seen in this pass (reported as Degraded). */
  degraded: { reason: string; message: string } | undefined;
  /** The pass failed with this error (reported as Degraded/ReconcileError). */
  error: unknown;
  /** The object is gone (finalizer removed): nothing to write. */
  gone = false;
  /** Set by claim-id.ts when this resource owns its activity id (checked in PostgreSQL). */
  ownsActivityId = false;
  /**
   * The gate as open-gate.ts left it in this pass (Active): what the Paused condition reports.
   * Undefined when the step did not get that far (a dependency failed earlier in the pass).
   */
  gateSeen: string | undefined;
  /** Set by restore-metrics.ts when this pass exported the open restore from PostgreSQL. */
  restoreExported = false;

  constructor(
    readonly deps: ReconcileDeps,
    public fsa: FlashSaleActivity,
    readonly activityId: string,
    readonly schedule: EffectiveSchedule,
    readonly log: Logger,
  ) {
    this.now = deps.now();
    this.phase = derivePhase(fsa.status?.conditions);
    this.deleting = Boolean(fsa.metadata.deletionTimestamp);
    this.status = structuredClone(fsa.status ?? {});
  }

  get generation(): number {
    return this.fsa.metadata.generation;
  }

  requeueAt(ms: number): void {
    if (this.requeueAtMs === undefined || ms < this.requeueAtMs) this.requeueAtMs = ms;
  }

  requeueAfter(ms: number): void {
    this.requeueAt(this.now.getTime() + ms);
  }

  /** Moves the lifecycle to `phase` (conditions + timestamp) and ends the pass. */
  transition(phase: Phase, message: string, failureReason?: string): StepResult {
    this.status.conditions = enterPhase(
      this.status.conditions,
      phase,
      message,
      this.generation,
      this.now,
      failureReason,
    );
    this.status.timestamps = { ...this.status.timestamps, [TIMESTAMP_FIELD[phase]]: this.now.toISOString() };
    this.transitioned = true;
    this.log.info({ from: this.phase, to: phase }, message);
    return DONE;
  }

  /**
   * Called by every step before it touches the activity id's data in Redis, Kafka or PostgreSQL:
   * only the id's owner may (claim-id.ts runs first and ends the pass for anyone else).
   */
  requireOwnership(): void {
    if (!this.ownsActivityId) {
      throw new Error(
        `activity id ${this.activityId} is not claimed by ${this.fsa.metadata.uid}; refusing to touch it`,
      );
    }
  }

  async event(type: EventType, reason: EventReason, message: string): Promise<void> {
    await this.deps.events.record(this.fsa, type, reason, message);
  }
}

/**
 * The labels of every per-activity series of the operator: `activity` is the activity id, the
 * label the runtime's series carry, so one selector finds both; `name` is the resource's name.
 */
export function activityLabels(ctx: Pick<ReconcileContext, 'fsa' | 'activityId'>): ActivityLabels {
  return { activity: ctx.activityId, name: ctx.fsa.metadata.name, namespace: ctx.fsa.metadata.namespace };
}

export interface ActivityLabels {
  activity: string;
  name: string;
  namespace: string;
}
