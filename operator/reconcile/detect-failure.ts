/**
 * Step 2: states the lifecycle cannot recover from. A Failed activity's data is not touched any
 * more: its runtime is scaled to zero and it waits to be deleted.
 */
import { bucketsLost, readMeta } from '../../core/activity-cache.js';
import { readWriteBack } from '../../core/db/stock-store.js';
import { EventReason, Phase, Reason } from '../api/v1alpha1/types.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE } from './context.js';

async function fail(ctx: ReconcileContext, reason: string, message: string): Promise<StepResult> {
  await ctx.event('Warning', EventReason.Failed, `${reason}: ${message}`);
  return ctx.transition(Phase.Failed, message, reason);
}

export async function detectFailure(ctx: ReconcileContext): Promise<StepResult> {
  const { redis, pool } = ctx.deps;
  switch (ctx.phase) {
    case Phase.Failed:
      return CONTINUE; // only scale-runtime (to zero) and remove-finalizer act on a Failed activity
    case Phase.Pending:
    case Phase.WarmingUp: {
      if (ctx.deleting || ctx.now < ctx.schedule.endAt) return CONTINUE;
      if (await readMeta(redis, ctx.activityId)) return CONTINUE; // loaded: end the sale normally
      return fail(
        ctx,
        Reason.ScheduleMissed,
        `the sale window ended (${ctx.schedule.endAt.toISOString()}) before the activity was loaded`,
      );
    }
    case Phase.Ready:
    case Phase.Active:
    case Phase.Draining:
      // A cache lost while it is live is restored from PostgreSQL (restore-cache.ts).
      return CONTINUE;
    case Phase.WritingBack: {
      // A loaded cache carries its load mark; a meta hash without one (what a cache restore's
      // hold writes into an empty Redis) has no stock to write back.
      const cached = (await readMeta(redis, ctx.activityId))?.generation ?? 0;
      const loaded = cached > 0;
      if (loaded && !(await readWriteBack(pool, ctx.activityId))) {
        // Behind the generation the operator loaded (a failover to a lagging replica, or an old
        // snapshot, after the drain's last check): its stock and items are not the sale's.
        const expected = ctx.status.cache?.loadedGeneration;
        if (expected !== undefined && cached < expected) {
          return fail(
            ctx,
            Reason.CacheLost,
            `the Redis cache of activity ${ctx.activityId} is behind: it holds generation ${cached}, ` +
              `generation ${expected} was loaded; its stock is not the sale's, so nothing is written ` +
              'back (check Redis persistence and failovers, then reconcile PostgreSQL by hand)',
          );
        }
        // A stock bucket's node lost its data (the activity's did not): freezing the gate would
        // fail on it at every pass, and its stock is unknown.
        const lost = await bucketsLost(redis, ctx.activityId);
        if (lost > 0) {
          return fail(
            ctx,
            Reason.CacheLost,
            `${lost} stock bucket(s) of activity ${ctx.activityId} lost their Redis keys before stock ` +
              'was written back; their remaining stock is unknown (check Redis persistence, then ' +
              'reconcile PostgreSQL by hand)',
          );
        }
      }
      if (loaded) return CONTINUE;
      if (await readWriteBack(pool, ctx.activityId)) return CONTINUE;
      if (ctx.status.cache?.loadedGeneration === undefined) return CONTINUE; // never loaded (deleted early)
      return fail(
        ctx,
        Reason.CacheLost,
        `the Redis cache of activity ${ctx.activityId} disappeared before stock was written back; ` +
          'remaining stock is unknown (check Redis persistence, then reconcile PostgreSQL by hand)',
      );
    }
    default:
      return CONTINUE;
  }
}
