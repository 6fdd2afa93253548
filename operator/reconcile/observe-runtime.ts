/**
 * Step 3b (after scale-runtime): the RuntimeReady condition, from what the Deployment controller
 * reports about the phase's runtime Deployments, and the rule for a runtime that is not available
 * when buyers need it (docs/operator.md "Runtime readiness"):
 * - warm-up ends in Ready only once RuntimeReady is True (warm-up.ts asks `waitForRuntime`);
 * - startAt passing while the runtime is still unavailable does not open the gate: the activity
 *   stays WarmingUp, Degraded=True/RuntimeNotReady says why and a StartDelayed Warning Event is
 *   recorded once; the gate opens as soon as the runtime is available (startAt is not moved, the
 *   delay shows as status.timestamps.active later than startAt). Should endAt come first, the
 *   activity goes to Ready and drains without ever opening;
 * - while Active, no available api replica at all is Degraded=True/RuntimeNotReady (the gate
 *   stays open: the replicas that come back serve the rest of the window).
 */
import type { V1Deployment } from '@kubernetes/client-node';
import { findCondition, setCondition } from '../api/v1alpha1/conditions.js';
import type { ConditionInput } from '../api/v1alpha1/conditions.js';
import { deploymentName, replicasFor } from '../api/v1alpha1/funcs.js';
import { ConditionType, EventReason, Phase, Reason, RUNTIME_ROLES } from '../api/v1alpha1/types.js';
import type { FlashSaleActivity, RoleReplicas, RuntimeRole } from '../api/v1alpha1/types.js';
import type { OperatorConfig } from '../config.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE, DONE } from './context.js';
import { deploymentUpToDate, desiredDeployment, runtimeImageOf } from './runtime-objects.js';
import { runtimePinned } from './scale-runtime.js';
import { activityLabels } from './context.js';

export interface RoleRollout {
  role: RuntimeRole;
  desired: number;
  available: number;
  /** The live Deployment has the desired spec and replicas and its controller has seen them. */
  current: boolean;
}

/**
 * How far one role's Deployment has rolled out (pure; `live` from the informer's cache). `desired`
 * is what scale-runtime.ts applies (same image choice, runtimeImageOf). A `pinned` Deployment
 * (served from, its template frozen: scale-runtime.ts runtimePinned) keeps the template it was
 * warmed up with whatever the operator's configuration is now, so only its replicas are compared.
 */
export function roleRollout(
  role: RuntimeRole,
  desired: V1Deployment,
  live: V1Deployment | undefined,
  pinned = false,
): RoleRollout {
  const replicas = desired.spec?.replicas ?? 0;
  const generation = live?.metadata?.generation ?? 0;
  const observed = live?.status?.observedGeneration ?? 0;
  const applied =
    pinned && live !== undefined ? live.spec?.replicas === replicas : deploymentUpToDate(live, desired);
  return {
    role,
    desired: replicas,
    available: Math.min(live?.status?.availableReplicas ?? 0, live?.status?.updatedReplicas ?? 0),
    current: applied && observed >= generation,
  };
}

/**
 * Every role's rollout, against the Deployment scale-runtime.ts applies in this phase (pure;
 * `liveOf` reads the informer's cache).
 */
export function rolloutsOf(
  a: {
    fsa: FlashSaleActivity;
    phase: Phase;
    deleting: boolean;
    activityId: string;
    config: OperatorConfig;
    replicas: RoleReplicas;
  },
  liveOf: (role: RuntimeRole) => V1Deployment | undefined,
): RoleRollout[] {
  return RUNTIME_ROLES.map((role) => {
    const live = liveOf(role);
    const image = runtimeImageOf(a.fsa, a.config, live);
    return roleRollout(
      role,
      desiredDeployment(a.fsa, role, a.replicas[role], a.activityId, a.config, image),
      live,
      runtimePinned(a.phase, a.deleting, live),
    );
  });
}

/**
 * RuntimeReady from the roles' rollouts: True when every role the phase runs has all its desired
 * replicas updated and available; NoRuntime when the phase runs none (Pending, Completed, Failed).
 */
export function runtimeCondition(rollouts: readonly RoleRollout[]): ConditionInput {
  const running = rollouts.filter((r) => r.desired > 0);
  const figures = running.map((r) => `${r.role} ${r.available}/${r.desired}`).join(', ');
  if (running.length === 0) {
    return {
      type: ConditionType.RuntimeReady,
      status: 'False',
      reason: Reason.NoRuntime,
      message: 'no runtime replicas in this phase',
    };
  }
  const lagging = running.filter((r) => !r.current || r.available < r.desired);
  if (lagging.length === 0) {
    return {
      type: ConditionType.RuntimeReady,
      status: 'True',
      reason: Reason.RuntimeAvailable,
      message: `available: ${figures}`,
    };
  }
  const rolling = lagging.filter((r) => !r.current).map((r) => r.role);
  return {
    type: ConditionType.RuntimeReady,
    status: 'False',
    reason: Reason.RuntimeUnavailable,
    message: `available: ${figures}${rolling.length > 0 ? ` (rolling out: ${rolling.join(', ')})` : ''}`,
  };
}

export async function observeRuntime(ctx: ReconcileContext): Promise<StepResult> {
  const ns = ctx.fsa.metadata.namespace;
  const replicas: RoleReplicas = replicasFor(ctx.fsa.spec, ctx.phase);
  const rollouts = rolloutsOf({ ...ctx, config: ctx.deps.config, replicas }, (role) =>
    ctx.deps.deployment(ns, deploymentName(ctx.fsa.metadata.name, role)),
  );
  const condition = runtimeCondition(rollouts);
  const labels = activityLabels(ctx);
  for (const r of rollouts) {
    ctx.deps.metrics.activityReplicas.set({ ...labels, role: r.role, state: 'desired' }, r.desired);
    ctx.deps.metrics.activityReplicas.set({ ...labels, role: r.role, state: 'available' }, r.available);
  }
  ctx.status.conditions = setCondition(ctx.status.conditions, condition, ctx.generation, ctx.now);
  if (ctx.deleting || condition.status === 'True') return CONTINUE;

  const previous = findCondition(ctx.fsa.status?.conditions, ConditionType.Degraded);
  const wasDegraded = previous?.status === 'True' && previous.reason === Reason.RuntimeNotReady;
  if (ctx.phase === Phase.WarmingUp && ctx.now >= ctx.schedule.startAt) {
    const message = `startAt ${ctx.schedule.startAt.toISOString()} passed with the runtime not available (${condition.message}); the gate opens once it is`;
    ctx.degraded = { reason: Reason.RuntimeNotReady, message };
    if (!wasDegraded) await ctx.event('Warning', EventReason.StartDelayed, message);
  } else if (ctx.phase === Phase.Active) {
    const api = rollouts.find((r) => r.role === 'api');
    if (api && api.desired > 0 && api.available === 0) {
      ctx.degraded = {
        reason: Reason.RuntimeNotReady,
        message: `the sale is open but no api replica is available (${condition.message})`,
      };
    }
  }
  return CONTINUE;
}

/**
 * Asked by warm-up.ts before it moves to Ready: ends the pass (staying WarmingUp) while the
 * runtime is not available, unless the sale window has already ended (then Ready, and drain.ts
 * ends it without opening the gate). Deployment events requeue the activity; the retry period is
 * only a safety net.
 */
export function waitForRuntime(ctx: ReconcileContext): StepResult | undefined {
  const runtime = findCondition(ctx.status.conditions, ConditionType.RuntimeReady);
  if (runtime?.status === 'True' || ctx.now >= ctx.schedule.endAt) return undefined;
  ctx.log.debug({ runtime: runtime?.message }, 'warm-up waits for the runtime');
  ctx.requeueAfter(ctx.deps.config.cleanupRetryMs);
  return DONE;
}
