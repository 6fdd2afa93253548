/**
 * Step 3c (after observe-runtime): a PodDisruptionBudget for each runtime role whose settings ask
 * for one (RUNTIME_ROLE_SETTINGS `disruptionBudget`, on by default; the step keeps its historical
 * name) while the sale is Active, so that a node drain or an eviction during the sale never takes
 * away more than one replica of a role at a time, nor the last one (minAvailable = max(1, active
 * replicas - 1)); a role with no active replicas gets none. Created on entering
 * Active, relaxed to minAvailable 0 once the sale has ended (it then blocks nothing); like the
 * Deployments it is never deleted by the operator: its owner reference lets the garbage collector
 * remove it with the activity.
 */
import { PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { V1PodDisruptionBudget } from '@kubernetes/client-node';
import { deploymentName } from '../api/v1alpha1/funcs.js';
import type { FlashSaleActivity, RuntimeRole } from '../api/v1alpha1/types.js';
import { FIELD_MANAGER, Phase, RUNTIME_ROLES } from '../api/v1alpha1/types.js';
import { isApiStatus } from '../kube/activities.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE } from './context.js';
import { LABEL_ACTIVITY, MANAGED_BY, ownerReference, selectorLabels } from './runtime-objects.js';

const applyOptions = setHeaderOptions('Content-Type', PatchStrategy.ServerSideApply);
const AFTER_SALE: readonly Phase[] = [
  Phase.Draining,
  Phase.WritingBack,
  Phase.CleaningUp,
  Phase.Completed,
  Phase.Failed,
];

/** minAvailable while Active: every api replica but one, and at least one. */
export function apiMinAvailable(activeApiReplicas: number): number {
  return Math.max(1, activeApiReplicas - 1);
}

export function desiredApiBudget(
  fsa: FlashSaleActivity,
  activityId: string,
  minAvailable: number,
): V1PodDisruptionBudget {
  return desiredBudget(fsa, 'api', activityId, minAvailable);
}

/** The role's budget, named like its Deployment (`<name>-<role>`). */
export function desiredBudget(
  fsa: FlashSaleActivity,
  role: RuntimeRole,
  activityId: string,
  minAvailable: number,
): V1PodDisruptionBudget {
  return {
    apiVersion: 'policy/v1',
    kind: 'PodDisruptionBudget',
    metadata: {
      name: deploymentName(fsa.metadata.name, role),
      namespace: fsa.metadata.namespace,
      labels: {
        ...selectorLabels(fsa, role),
        'app.kubernetes.io/part-of': 'flashsale',
        'app.kubernetes.io/managed-by': MANAGED_BY,
        [LABEL_ACTIVITY]: activityId,
      },
      ownerReferences: [ownerReference(fsa)],
    },
    spec: { minAvailable, selector: { matchLabels: selectorLabels(fsa, role) } },
  };
}

export async function protectApi(ctx: ReconcileContext): Promise<StepResult> {
  const active = ctx.phase === Phase.Active && !ctx.deleting;
  if (!active && !AFTER_SALE.includes(ctx.phase)) return CONTINUE;
  const { policy, config } = ctx.deps;
  const namespace = ctx.fsa.metadata.namespace;
  for (const role of RUNTIME_ROLES) {
    const name = deploymentName(ctx.fsa.metadata.name, role);
    const activeReplicas = ctx.fsa.spec.runtime.replicas.active[role];
    // While Active only the roles that ask for a budget get one; after the sale any existing
    // budget (also one created under an earlier configuration) is relaxed.
    const wantedNow = active && config.runtime.roles[role].disruptionBudget && activeReplicas > 0;
    if (active && !wantedNow) continue;
    let live: V1PodDisruptionBudget | undefined;
    try {
      live = await policy.readNamespacedPodDisruptionBudget({ name, namespace });
    } catch (err) {
      if (!isApiStatus(err, 404)) throw err;
    }
    // After the sale only an existing budget is relaxed; none is created.
    if (!active && !live) continue;
    const wanted = active ? apiMinAvailable(activeReplicas) : 0;
    if (live?.spec?.minAvailable === wanted) continue;
    await policy.patchNamespacedPodDisruptionBudget(
      {
        name,
        namespace,
        body: desiredBudget(ctx.fsa, role, ctx.activityId, wanted),
        fieldManager: FIELD_MANAGER,
        force: true,
      },
      applyOptions,
    );
    ctx.log.debug({ role, minAvailable: wanted }, 'runtime disruption budget applied');
  }
  return CONTINUE;
}
