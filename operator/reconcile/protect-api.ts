/**
 * Step 3c (after observe-runtime): a PodDisruptionBudget for the api while the sale is Active, so
 * that a node drain or an eviction during the sale never takes away more than one api replica at a
 * time, nor the last one (minAvailable = max(1, active api replicas - 1)). Created on entering
 * Active, relaxed to minAvailable 0 once the sale has ended (it then blocks nothing); like the
 * Deployments it is never deleted by the operator: its owner reference lets the garbage collector
 * remove it with the activity.
 */
import { PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { V1PodDisruptionBudget } from '@kubernetes/client-node';
import type { FlashSaleActivity } from '../api/v1alpha1/types.js';
import { FIELD_MANAGER, Phase } from '../api/v1alpha1/types.js';
import { isApiStatus } from '../kube/activities.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE } from './context.js';
import {
  LABEL_ACTIVITY,
  MANAGED_BY,
  apiServiceName,
  ownerReference,
  selectorLabels,
} from './runtime-objects.js';

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
  return {
    apiVersion: 'policy/v1',
    kind: 'PodDisruptionBudget',
    metadata: {
      name: apiServiceName(fsa.metadata.name),
      namespace: fsa.metadata.namespace,
      labels: {
        ...selectorLabels(fsa, 'api'),
        'app.kubernetes.io/part-of': 'flashsale',
        'app.kubernetes.io/managed-by': MANAGED_BY,
        [LABEL_ACTIVITY]: activityId,
      },
      ownerReferences: [ownerReference(fsa)],
    },
    spec: { minAvailable, selector: { matchLabels: selectorLabels(fsa, 'api') } },
  };
}

export async function protectApi(ctx: ReconcileContext): Promise<StepResult> {
  const active = ctx.phase === Phase.Active && !ctx.deleting;
  if (!active && !AFTER_SALE.includes(ctx.phase)) return CONTINUE;
  const { policy } = ctx.deps;
  const name = apiServiceName(ctx.fsa.metadata.name);
  const namespace = ctx.fsa.metadata.namespace;
  let live: V1PodDisruptionBudget | undefined;
  try {
    live = await policy.readNamespacedPodDisruptionBudget({ name, namespace });
  } catch (err) {
    if (!isApiStatus(err, 404)) throw err;
  }
  // After the sale only an existing budget is relaxed; none is created.
  if (!active && !live) return CONTINUE;
  const wanted = active ? apiMinAvailable(ctx.fsa.spec.runtime.replicas.active.api) : 0;
  if (live?.spec?.minAvailable === wanted) return CONTINUE;
  await policy.patchNamespacedPodDisruptionBudget(
    {
      name,
      namespace,
      body: desiredApiBudget(ctx.fsa, ctx.activityId, wanted),
      fieldManager: FIELD_MANAGER,
      force: true,
    },
    applyOptions,
  );
  ctx.log.debug({ minAvailable: wanted }, 'api disruption budget applied');
  return CONTINUE;
}
