/**
 * The cache-restore series of the operator (docs/runbooks/FlashSaleCacheRestore.md): a counter of
 * restores begun and, while one is open, its detection time and age by step. Kept apart from
 * restore-cache.ts so the step itself only calls these at its transitions.
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
 * The open restore on the series of its current step: when it was detected (Unix seconds, by the
 * database's timestamps; FlashSaleCacheRestoreStuck alerts on `time() - it`, which keeps growing
 * when passes stop) and its age as of this pass. No series when none is open, so `absent` or
 * `max by` reads them directly.
 */
export function exportOpenRestore(ctx: ReconcileContext, row: CacheRestoreRow | undefined): void {
  const { cacheRestoreOpenSeconds, cacheRestoreOpenSince } = ctx.deps.metrics;
  const labels = activityLabels(ctx);
  for (const step of RESTORE_STEPS) {
    cacheRestoreOpenSeconds.remove({ ...labels, step });
    cacheRestoreOpenSince.remove({ ...labels, step });
  }
  if (!row || row.step === 'resumed') return;
  const detectedMs = new Date(row.detectedAt).getTime();
  const age = Math.max(0, (ctx.now.getTime() - detectedMs) / 1000);
  cacheRestoreOpenSeconds.set({ ...labels, step: row.step }, age);
  cacheRestoreOpenSince.set({ ...labels, step: row.step }, detectedMs / 1000);
}
