/**
 * Step 2: the activity id is this resource's own. The first resource to claim an id owns it for
 * good (a unique row in PostgreSQL, core/db/claims-store.ts; the owner's uid is also recorded in
 * the cache's meta by warm-up); any other resource naming that id, in any namespace, ends Failed
 * with ActivityIdInUse naming the owner, before any step has touched Redis, Kafka or PostgreSQL
 * for it. Every later step that does checks `ctx.ownsActivityId` (requireOwnership), so a step
 * order mistake fails loudly instead of touching another tenant's sale.
 */
import { readMeta } from '../../core/activity-cache.js';
import { claimActivityId, readClaim } from '../../core/db/claims-store.js';
import type { ActivityClaim } from '../../core/db/claims-store.js';
import { readWriteBack } from '../../core/db/stock-store.js';
import { EventReason, Phase, Reason } from '../api/v1alpha1/types.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE } from './context.js';

function ownerText(claim: ActivityClaim): string {
  return `${claim.ownerNamespace}/${claim.ownerName} (uid ${claim.ownerUid})`;
}

async function inUse(ctx: ReconcileContext, message: string): Promise<StepResult> {
  await ctx.event('Warning', EventReason.Failed, `${Reason.ActivityIdInUse}: ${message}`);
  return ctx.transition(Phase.Failed, message, Reason.ActivityIdInUse);
}

export async function claimId(ctx: ReconcileContext): Promise<StepResult> {
  // A Failed activity's data is never touched again (its own or anyone's): nothing to check.
  if (ctx.phase === Phase.Failed) return CONTINUE;
  const { pool, redis } = ctx.deps;
  const { uid, namespace, name } = ctx.fsa.metadata;
  const id = ctx.activityId;
  let claim = await readClaim(pool, id);
  if (!claim) {
    // Deleted before warm-up: nothing of it exists anywhere; claiming now would only waste the id.
    if (ctx.deleting && ctx.phase === Phase.Pending) return CONTINUE;
    if (ctx.phase === Phase.Pending) {
      // A new id must be unused. Data without a claim is an activity older than the claims
      // (or one whose claim was lost): it is not ours to take over.
      const [meta, writeBack] = await Promise.all([readMeta(redis, id), readWriteBack(pool, id)]);
      if (meta || writeBack) {
        return inUse(
          ctx,
          `activity id ${id} already holds the ${meta ? 'cache' : 'written-back stock'} of an earlier activity`,
        );
      }
    }
    // Past Pending without a claim: the resource ran before claims existed; it claims what it uses.
    claim = await claimActivityId(pool, id, { uid, namespace, name });
  }
  if (claim.ownerUid !== uid) {
    const same = claim.activityId === id ? '' : ` (as ${claim.activityId}: Kafka topic names would collide)`;
    return inUse(
      ctx,
      `activity id ${id} is owned by ${ownerText(claim)}${same}; this resource changes nothing`,
    );
  }
  ctx.ownsActivityId = true;
  return CONTINUE;
}
