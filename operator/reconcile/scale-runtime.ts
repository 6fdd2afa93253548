/**
 * Step 3: the runtime Deployments (api, relay, consumer) and the api Service, with the replicas of
 * the phase recorded in the status. Server-side apply with the operator's field manager; skipped
 * when the live Deployment already has the desired spec hash and replicas. An image the operator
 * does not allow (runtime-objects.ts, runtimeImageFor) is never applied: a resource that has not
 * warmed up yet fails with ImageNotAllowed and gets no runtime objects; a later edit to such an
 * image is reported as Degraded=True/ImageNotAllowed and the running image stays.
 *
 * Pinned at warm-up (docs/install.md, "Upgrades"): the pod template (image, resources, every
 * setting of the operator's configuration) is applied only while the activity is Pending or
 * WarmingUp, when no buyer is served. From Ready on, a live Deployment only has its replicas
 * changed (a merge patch of spec.replicas): a new operator version or configuration (a new
 * RUNTIME_IMAGE, resources, role settings) and a spec.runtime.image edit never re-roll the pods
 * of a sale that is about to start, running or draining; they apply to the next activity.
 */
import { PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { V1Deployment } from '@kubernetes/client-node';
import { deploymentName, replicasFor } from '../api/v1alpha1/funcs.js';
import { EventReason, FIELD_MANAGER, Phase, Reason, RUNTIME_ROLES } from '../api/v1alpha1/types.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE } from './context.js';
import {
  apiServiceName,
  deploymentUpToDate,
  desiredApiService,
  desiredDeployment,
  runtimeImageFor,
  runtimeImageOf,
} from './runtime-objects.js';
import { isApiStatus } from '../kube/activities.js';

const applyOptions = setHeaderOptions('Content-Type', PatchStrategy.ServerSideApply);
const mergeOptions = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

/** Phases whose runtime pod template may still be (re)applied: nothing is served yet. */
export const TEMPLATE_PHASES: readonly Phase[] = [Phase.Pending, Phase.WarmingUp];

/** Whether the live Deployment's pod template is frozen (only its replicas may change). */
export function runtimePinned(phase: Phase, deleting: boolean, live: V1Deployment | undefined): boolean {
  return live !== undefined && (deleting || !TEMPLATE_PHASES.includes(phase));
}

export async function scaleRuntime(ctx: ReconcileContext): Promise<StepResult> {
  const { apps, core, config, deployment } = ctx.deps;
  const ns = ctx.fsa.metadata.namespace;
  const terminal = ctx.phase === Phase.Completed || ctx.phase === Phase.Failed;
  // Runtime pods serve the activity id's sale: only its owner gets them (scaling down is always fine).
  if (!terminal && !ctx.deleting) ctx.requireOwnership();
  const choice = runtimeImageFor(ctx.fsa, config);
  if (!choice.allowed) {
    if (ctx.phase === Phase.Pending && !ctx.deleting) {
      await ctx.event('Warning', EventReason.Failed, `${Reason.ImageNotAllowed}: ${choice.message}`);
      return ctx.transition(Phase.Failed, choice.message, Reason.ImageNotAllowed);
    }
    if (!terminal) ctx.degraded = { reason: Reason.ImageNotAllowed, message: choice.message };
  }
  const replicas = replicasFor(ctx.fsa.spec, ctx.phase);
  const runtime: NonNullable<typeof ctx.status.runtime> = {};
  for (const role of RUNTIME_ROLES) {
    const name = deploymentName(ctx.fsa.metadata.name, role);
    const live = deployment(ns, name);
    // Refused: keep the image the live Deployment runs if the operator allows it, else its own.
    const image = runtimeImageOf(ctx.fsa, config, live);
    if (live && runtimePinned(ctx.phase, ctx.deleting, live)) {
      // The pods keep the template they were warmed up with; only the phase's size changes.
      if (live.spec?.replicas !== replicas[role]) {
        await apps.patchNamespacedDeployment(
          { name, namespace: ns, body: { spec: { replicas: replicas[role] } }, fieldManager: FIELD_MANAGER },
          mergeOptions,
        );
        ctx.log.debug({ role, replicas: replicas[role] }, 'runtime deployment scaled (template pinned)');
      }
      runtime[role] = {
        deployment: name,
        replicas: replicas[role],
        readyReplicas: live.status?.readyReplicas ?? 0,
      };
      continue;
    }
    const desired = desiredDeployment(ctx.fsa, role, replicas[role], ctx.activityId, config, image);
    // A foreground deletion (`kubectl delete --cascade=foreground`, Argo CD's prune) has garbage
    // collection remove the runtime before the finalizer's drain, which needs the relay and the
    // consumer: a Deployment the deleted activity still needs is made again without an owner
    // reference (collection would remove an owned one again), given it back by remove-finalizer.
    // Not in Settling: a deleted activity is let go from there without its runtime (the platform
    // after-sale role settles its orders), so one made again would only outlive it.
    const orphan = ctx.deleting && !live && !terminal && ctx.phase !== Phase.Settling && replicas[role] > 0;
    const skip =
      deploymentUpToDate(live, desired) || (ctx.deleting && !live && !orphan) || (terminal && !live);
    if (!skip) {
      const body: V1Deployment = orphan
        ? { ...desired, metadata: { ...desired.metadata, ownerReferences: [] } }
        : desired;
      if (orphan)
        ctx.log.warn({ role }, 'runtime deployment gone during deletion; recreated unowned to drain');
      await apps.patchNamespacedDeployment(
        { name, namespace: ns, body, fieldManager: FIELD_MANAGER, force: true },
        applyOptions,
      );
      ctx.log.debug({ role, replicas: replicas[role] }, 'runtime deployment applied');
    }
    runtime[role] = {
      deployment: name,
      replicas: replicas[role],
      readyReplicas: live?.status?.readyReplicas ?? 0,
    };
  }
  if (!ctx.deleting && !terminal) {
    const name = apiServiceName(ctx.fsa.metadata.name);
    let exists = true;
    try {
      await core.readNamespacedService({ name, namespace: ns });
    } catch (err) {
      if (!isApiStatus(err, 404)) throw err;
      exists = false;
    }
    if (!exists) {
      await core.patchNamespacedService(
        {
          name,
          namespace: ns,
          body: desiredApiService(ctx.fsa, ctx.activityId),
          fieldManager: FIELD_MANAGER,
          force: true,
        },
        applyOptions,
      );
    }
  }
  ctx.status.runtime = runtime;
  return CONTINUE;
}
