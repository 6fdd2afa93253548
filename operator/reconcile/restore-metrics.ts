/**
 * The cache-restore series of the operator (docs/runbooks/FlashSaleCacheRestore.md): a counter of
 * restores begun and, while one is open, its age by step. Kept apart from restore-cache.ts so the
 * step itself only calls these at its transitions.
 */
import { RESTORE_STEPS } from '../../core/db/cache-restores-store.js';
import type { CacheRestoreRow, RestoreReason } from '../../core/db/cache-restores-store.js';
import type { ReconcileContext } from './context.js';
import { activityLabels } from './update-status.js';

/** A restore was begun (its row inserted). */
export function countRestore(ctx: ReconcileContext, reason: RestoreReason): void {
  ctx.deps.metrics.cacheRestores.inc({ ...activityLabels(ctx), reason });
}

/**
 * The open restore's age (from its detection, by the database's timestamps) on the series of its
 * current step; no series when none is open, so `absent` or `max by` reads it directly.
 */
export function exportOpenRestore(ctx: ReconcileContext, row: CacheRestoreRow | undefined): void {
  const labels = activityLabels(ctx);
  for (const step of RESTORE_STEPS) ctx.deps.metrics.cacheRestoreOpenSeconds.remove({ ...labels, step });
  if (!row || row.step === 'resumed') return;
  const age = Math.max(0, (ctx.now.getTime() - new Date(row.detectedAt).getTime()) / 1000);
  ctx.deps.metrics.cacheRestoreOpenSeconds.set({ ...labels, step: row.step }, age);
}
