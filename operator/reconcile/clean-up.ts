/**
 * Step 9: CleaningUp. Deletes this activity's Redis keys only (core's cleanupActivity: SCAN over
 * the activity's own prefix, never KEYS or a global pattern), keeps buyers' results with a TTL of
 * spec.cleanup.resultRetention, and refuses while anything is still in flight; then Settling
 * (settle.ts) waits for the orders. With cleanup.policy Retain the keys stay until the resource is
 * deleted, and the step still waits until nothing is in flight: Settling counts PostgreSQL's
 * orders only, and Completed scales the relay and consumer that would write the rest to zero.
 */
import { assertNothingInFlight, cleanupActivity } from '../../core/activity-cache.js';
import { countReleasesUnproven } from '../../core/db/orders-store.js';
import { FlashSaleError } from '../../core/errors.js';
import { parseDuration } from '../api/v1alpha1/funcs.js';
import { EventReason, Phase, Reason } from '../api/v1alpha1/types.js';
import { crashPoint } from '../../core/crash.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE, DONE } from './context.js';

/** Runs the cleanup; false (and Degraded=CleanupBlocked) while something is still in flight. */
export async function deleteActivityKeys(ctx: ReconcileContext): Promise<boolean> {
  ctx.requireOwnership();
  const retentionMs = parseDuration(ctx.fsa.spec.cleanup.resultRetention);
  return blockedWhileInFlight(ctx, async () => {
    // A release attempted before the freeze that did not answer (Redis full, a timeout) is proven
    // by its reservation alone: RELEASED, the write-back counted the unit free; RESERVED, held, and
    // it goes back in PostgreSQL. The settlement sweeper reads it; once the keys are gone the unit
    // could only be flagged unresolved, one unit short for good. Not at the resource's deletion
    // (Settling, keys kept by Retain): no runtime may run to sweep then, and the finalizer must go;
    // the after-sale role settles what is left, an unproven release flagged unresolved.
    const unproven = ctx.deleting ? 0 : await countReleasesUnproven(ctx.deps.pool, ctx.activityId);
    if (unproven > 0)
      throw new FlashSaleError(
        'UNAVAILABLE',
        `cleanup refused: ${unproven} closed order(s) whose stock release was attempted are not settled yet (the settlement sweeper reads their reservations first)`,
      );
    const outcome = await cleanupActivity(ctx.deps.redis, ctx.activityId, Math.ceil(retentionMs / 1000));
    crashPoint('operator-after-cleanup');
    ctx.status.cleanup = {
      deletedKeys: (ctx.status.cleanup?.deletedKeys ?? 0) + outcome.deleted,
      ...(outcome.retained > 0
        ? { resultsRetainedUntil: new Date(ctx.now.getTime() + retentionMs).toISOString() }
        : {}),
    };
  });
}

/** Runs `step`; false (and Degraded=CleanupBlocked, retried) while it finds orders in flight. */
async function blockedWhileInFlight(ctx: ReconcileContext, step: () => Promise<void>): Promise<boolean> {
  try {
    await step();
    return true;
  } catch (err) {
    if (!(err instanceof FlashSaleError) || err.code !== 'UNAVAILABLE') throw err;
    const already = ctx.fsa.status?.conditions?.some((c) => c.reason === Reason.CleanupBlocked) ?? false;
    ctx.degraded = { reason: Reason.CleanupBlocked, message: err.message };
    if (!already) await ctx.event('Warning', EventReason.CleanupBlocked, err.message);
    ctx.requeueAfter(ctx.deps.config.cleanupRetryMs);
    return false;
  }
}

export async function cleanUp(ctx: ReconcileContext): Promise<StepResult> {
  if (ctx.phase !== Phase.CleaningUp) return CONTINUE;
  const retain = ctx.fsa.spec.cleanup.policy === 'Retain' && !ctx.deleting;
  if (retain) {
    const settled = await blockedWhileInFlight(ctx, () =>
      assertNothingInFlight(ctx.deps.redis, ctx.activityId, 'settling held back'),
    );
    if (!settled) return DONE;
  } else if (!(await deleteActivityKeys(ctx))) return DONE;
  const message = retain
    ? 'completed; Redis keys retained (cleanup.policy Retain) until the resource is deleted'
    : `completed; ${ctx.status.cleanup?.deletedKeys ?? 0} Redis key(s) deleted, results kept for ${ctx.fsa.spec.cleanup.resultRetention}`;
  await ctx.event('Normal', EventReason.CleanedUp, message);
  return ctx.transition(Phase.Settling, `${message}; settling the orders`);
}
