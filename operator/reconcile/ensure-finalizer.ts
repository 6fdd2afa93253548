/** Step 1: the finalizer, so that deleting a live activity drains, writes back and cleans up first. */
import { FINALIZER } from '../api/v1alpha1/types.js';
import { crashPoint } from '../../core/crash.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE, DONE } from './context.js';

export async function ensureFinalizer(ctx: ReconcileContext): Promise<StepResult> {
  const has = ctx.fsa.metadata.finalizers?.includes(FINALIZER) ?? false;
  if (ctx.deleting) {
    if (has) return CONTINUE;
    // Deleted before the finalizer was ever added: nothing of ours can exist yet.
    ctx.gone = true;
    return DONE;
  }
  if (has) return CONTINUE;
  ctx.fsa = await ctx.deps.activities.addFinalizer(ctx.fsa);
  crashPoint('operator-after-finalizer');
  return CONTINUE;
}
