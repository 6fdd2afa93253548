/**
 * Step 11: a deleted activity lets go once nothing of it is live: Completed (after deleting keys
 * retained by cleanup.policy Retain), Failed (its data is left for an operator to inspect), still
 * Pending (nothing was created yet), or Settling (its orders live on in PostgreSQL and the
 * platform after-sale role settles them).
 */
import { deploymentName } from '../api/v1alpha1/funcs.js';
import { PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import { EventReason, FIELD_MANAGER, FINALIZER, Phase, RUNTIME_ROLES } from '../api/v1alpha1/types.js';
import { ownerReference } from './runtime-objects.js';
import { isApiStatus } from '../kube/activities.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE, DONE } from './context.js';
import { deleteActivityKeys } from './clean-up.js';
import { readMeta } from '../../core/activity-cache.js';
import { unregisterActivity } from '../../core/db/activity-registry-store.js';
import { releaseUnusedClaim } from '../../core/db/claims-store.js';

export async function removeFinalizer(ctx: ReconcileContext): Promise<StepResult> {
  if (!ctx.deleting || !ctx.fsa.metadata.finalizers?.includes(FINALIZER)) return CONTINUE;
  const releasable =
    ctx.phase === Phase.Completed ||
    ctx.phase === Phase.Failed ||
    ctx.phase === Phase.Pending ||
    (ctx.phase === Phase.Settling && (ctx.status.settlement?.unsettled ?? 0) > 0);
  if (!releasable) return CONTINUE;
  if (ctx.phase === Phase.Settling) {
    // The orders live in PostgreSQL; the platform after-sale role keeps settling them.
    await ctx.event(
      'Warning',
      EventReason.ReleasedUnsettled,
      `deleted while Settling: ${ctx.status.settlement?.unsettled ?? 0} order(s) or payment(s) still unsettled; ` +
        'the after-sale role keeps closing, refunding and answering them',
    );
  }
  // Keys a Retain cleanup kept go now: decided by what Redis holds, not by the policy, which may
  // have been edited to Delete since (no step would delete them then).
  if (
    (ctx.phase === Phase.Completed || ctx.phase === Phase.Settling) &&
    (await readMeta(ctx.deps.redis, ctx.activityId)) !== undefined
  ) {
    if (!(await deleteActivityKeys(ctx))) return DONE;
  }
  if (!ctx.status.timestamps?.warmingUp) {
    // Never warmed up (the phase is recorded before any of its side effects): no order nor cache
    // of the id exists, so a user-chosen id may be used again. Only this resource's own sale
    // window and claim go (the window first: a crash in between repeats both); a window left
    // behind would answer the next sale's buyers NOT_STARTED or ENDED by this one's schedule.
    await unregisterActivity(ctx.deps.pool, ctx.activityId, ctx.fsa.metadata.uid);
    await releaseUnusedClaim(ctx.deps.pool, ctx.activityId, ctx.fsa.metadata.uid);
  }
  await adoptUnownedRuntime(ctx);
  await ctx.event('Normal', EventReason.FinalizerRemoved, `released after ${ctx.phase}`);
  await ctx.deps.activities.removeFinalizer(ctx.fsa);
  ctx.gone = true;
  return DONE;
}

/**
 * The runtime Deployments scale-runtime made again without an owner reference during a foreground
 * deletion: given back their owner reference before the finalizer goes, so garbage collection
 * removes them with the activity (the operator deletes nothing itself: config/rbac/role.yaml).
 */
async function adoptUnownedRuntime(ctx: ReconcileContext): Promise<void> {
  const ns = ctx.fsa.metadata.namespace;
  for (const role of RUNTIME_ROLES) {
    const name = deploymentName(ctx.fsa.metadata.name, role);
    const live = ctx.deps.deployment(ns, name);
    if (!live || (live.metadata?.ownerReferences ?? []).some((r) => r.uid === ctx.fsa.metadata.uid)) continue;
    try {
      await ctx.deps.apps.patchNamespacedDeployment(
        {
          name,
          namespace: ns,
          body: { metadata: { ownerReferences: [ownerReference(ctx.fsa)] } },
          fieldManager: FIELD_MANAGER,
        },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
    } catch (err) {
      if (!isApiStatus(err, 404)) throw err;
    }
  }
}
