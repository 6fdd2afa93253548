/**
 * Step 6: Ready -> Active at startAt (the gate opens, or stays paused when spec.paused); while
 * Active the gate follows spec.paused. The instants come from the cache (what was loaded), which
 * is also what the reserve script checks, so the operator and the runtime agree on the window.
 */
import { bucketsNotAt, readMeta, setGate } from '../../core/activity-cache.js';
import { EventReason, Phase } from '../api/v1alpha1/types.js';
import { crashPoint } from '../../core/crash.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE } from './context.js';

export async function openGate(ctx: ReconcileContext): Promise<StepResult> {
  if (ctx.deleting) return CONTINUE;
  if (ctx.phase !== Phase.Ready && ctx.phase !== Phase.Active) return CONTINUE;
  ctx.requireOwnership();
  const { redis } = ctx.deps;
  const meta = await readMeta(redis, ctx.activityId);
  if (!meta) return CONTINUE; // detect-failure reports a lost cache
  const startMs = meta.startMs || ctx.schedule.startAt.getTime();
  const endMs = meta.endMs || ctx.schedule.endAt.getTime();
  const now = ctx.now.getTime();
  if (now >= endMs) return CONTINUE; // drain.ts ends the sale
  const wanted = ctx.fsa.spec.paused ? 'paused' : 'open';

  if (ctx.phase === Phase.Ready) {
    if (now < startMs) {
      ctx.requeueAt(startMs);
      return CONTINUE;
    }
    await setGate(redis, ctx.activityId, wanted);
    crashPoint('operator-after-open-gate');
    await ctx.event(
      'Normal',
      EventReason.SaleOpened,
      wanted === 'open' ? 'the sale is open' : 'the sale started paused (spec.paused)',
    );
    return ctx.transition(Phase.Active, wanted === 'open' ? 'the sale is open' : 'the sale is paused');
  }

  const movable = meta.gate === 'open' || meta.gate === 'paused' || meta.gate === 'pending';
  if (meta.gate !== wanted && movable) {
    await setGate(redis, ctx.activityId, wanted);
    await ctx.event(
      'Normal',
      wanted === 'paused' ? EventReason.SalePaused : EventReason.SaleResumed,
      wanted === 'paused' ? 'gate closed by spec.paused' : 'gate reopened',
    );
    ctx.gateSeen = wanted;
  } else if (movable && (await bucketsNotAt(redis, ctx.activityId, wanted)) > 0) {
    // The activity's gate is as wanted but a bucket's is not: a setGate stopped after moving the
    // buckets (they move first) and the spec was then set back. Each bucket's reserve script reads
    // its own gate: finish the move.
    ctx.log.warn({ wanted }, "a stock bucket's gate lags the activity's; moving it");
    await setGate(redis, ctx.activityId, wanted);
    ctx.gateSeen = wanted;
  } else ctx.gateSeen = meta.gate;
  ctx.requeueAt(endMs);
  return CONTINUE;
}
