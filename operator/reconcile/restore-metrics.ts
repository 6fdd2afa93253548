/**
 * The cache-restore series of the operator (docs/runbooks/FlashSaleCacheRestore.md): a counter of
 * restores begun and, while one is open, its detection time and age by step. Kept apart from
 * restore-cache.ts so the step itself only calls these at its transitions.
 */
import { RESTORE_STEPS } from '../../core/db/cache-restores-store.js';
import type { CacheRestoreRow, RestoreReason, RestoreStep } from '../../core/db/cache-restores-store.js';
import { ConditionType, Phase, Reason } from '../api/v1alpha1/types.js';
import type { FlashSaleActivityStatus } from '../api/v1alpha1/types.js';
import type { ReconcileContext } from './context.js';
import { activityLabels } from './context.js';

/** The phases a cache restore runs in (restore-cache.ts); an open one is exported in these only. */
export const RESTORE_PHASES: readonly Phase[] = [Phase.Ready, Phase.Active, Phase.Draining];

/** A restore was begun (its row inserted). */
export function countRestore(ctx: ReconcileContext, reason: RestoreReason): void {
  ctx.deps.metrics.cacheRestores.inc({ ...activityLabels(ctx), reason });
}

/**
 * The open restore on the series of its current step: when it was detected (Unix seconds, by the
 * database's timestamps; FlashSaleCacheRestoreStuck alerts on `time() - it`, which keeps growing
 * when passes stop) and its age as of this pass. No series when none is open, so `absent` or
 * `max by` reads them directly.
 */
export function exportOpenRestore(ctx: ReconcileContext, row: CacheRestoreRow | undefined): void {
  ctx.restoreExported = true;
  setOpenRestore(
    ctx,
    row && row.step !== 'resumed' ? { step: row.step, detectedAt: row.detectedAt } : undefined,
  );
}

/** The step a restore is at, by the CacheConsistent reason its pass recorded. */
const STEP_OF_REASON: Readonly<Record<string, RestoreStep>> = {
  [Reason.RestorePausing]: 'detected',
  [Reason.RestoreDraining]: 'paused',
  [Reason.RestoreReloading]: 'drained',
  [Reason.RestoreResuming]: 'reloaded',
};

/**
 * A pass that did not reach the restore step (PostgreSQL down: an earlier step's query failed)
 * exports the open restore from the status instead: its CacheConsistent condition, False since
 * the detection (lastTransitionTime), and the step its reason names. Without it an operator that
 * restarts, or fails over to another replica, during such an outage exports no series, and
 * FlashSaleCacheRestoreStuck is blind in the outage it exists for.
 */
export function exportOpenRestoreFromStatus(ctx: ReconcileContext, status: FlashSaleActivityStatus): void {
  if (ctx.restoreExported) return;
  const c = status.conditions?.find((x) => x.type === ConditionType.CacheConsistent);
  const step = c?.status === 'False' ? STEP_OF_REASON[c.reason ?? ''] : undefined;
  if (!step || !c?.lastTransitionTime) return;
  setOpenRestore(ctx, { step, detectedAt: c.lastTransitionTime });
}

function setOpenRestore(
  ctx: ReconcileContext,
  open: { step: RestoreStep; detectedAt: string | Date } | undefined,
): void {
  const { cacheRestoreOpenSeconds, cacheRestoreOpenSince } = ctx.deps.metrics;
  const labels = activityLabels(ctx);
  for (const step of RESTORE_STEPS) {
    cacheRestoreOpenSeconds.remove({ ...labels, step });
    cacheRestoreOpenSince.remove({ ...labels, step });
  }
  if (!open) return;
  const detectedMs = new Date(open.detectedAt).getTime();
  const age = Math.max(0, (ctx.now.getTime() - detectedMs) / 1000);
  cacheRestoreOpenSeconds.set({ ...labels, step: open.step }, age);
  cacheRestoreOpenSince.set({ ...labels, step: open.step }, detectedMs / 1000);
}
