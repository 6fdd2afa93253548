/**
 * Step 5: spec edits reaching a loaded cache. Compares what the spec asks for now with what is in
 * Redis: safe edits (extend endAt, add stock, add items; anything before the sale opens except
 * removing items or lowering stock) are loaded as a new generation through the load script's
 * fence; unsafe ones are refused with Degraded=True/SpecChangeRefused and the sale goes on with
 * what is loaded. The CRD's CEL rules refuse most unsafe edits at admission already; this is the
 * check for what admission cannot see (catalog rows, edits racing a phase change).
 */
import { loadActivity } from '../../core/activity-cache.js';
import { FlashSaleError } from '../../core/errors.js';
import { readLoadedDefinition } from '../../core/loaded-definition.js';
import { EventReason, Phase, Reason } from '../api/v1alpha1/types.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE } from './context.js';
import { buildDefinition, diffDefinition } from './definition.js';
import { resolveItems } from './resolve-items.js';
import { syncTrafficPolicy } from './traffic-policy.js';

export type SyncOutcome =
  | { kind: 'loaded'; first: boolean; changes: string[] }
  | { kind: 'unchanged' }
  | { kind: 'refused'; message: string }
  | { kind: 'empty' };

/**
 * Brings the cache to the spec's generation when that is safe in the current phase. Idempotent:
 * the load script fences by generation, so a repeat after a crash changes nothing.
 */
export async function syncCache(ctx: ReconcileContext, phase: Phase): Promise<SyncOutcome> {
  const { redis } = ctx.deps;
  const items = await resolveItems(ctx);
  if (items.length === 0) return { kind: 'empty' };
  const desired = buildDefinition(ctx.fsa, ctx.activityId, items);
  const loaded = await readLoadedDefinition(redis, ctx.activityId);
  let changes: string[] = [];
  if (loaded) {
    if (loaded.generation >= desired.generation) return { kind: 'unchanged' };
    const diff = diffDefinition(loaded, desired, phase);
    if (diff.unsafe.length > 0) {
      return {
        kind: 'refused',
        message: `refused spec generation ${desired.generation}: ${diff.unsafe.join('; ')}`,
      };
    }
    if (diff.changes.length === 0) return { kind: 'unchanged' };
    changes = diff.changes;
  }
  try {
    await loadActivity(redis, desired);
  } catch (err) {
    if (err instanceof FlashSaleError && (err.code === 'STOCK_DECREASE' || err.code === 'STALE_GENERATION')) {
      return { kind: 'refused', message: `refused spec generation ${desired.generation}: ${err.message}` };
    }
    throw err;
  }
  return { kind: 'loaded', first: loaded === undefined, changes };
}

/** Records the cache's figures (from Redis itself) after a load or a check. */
export async function recordCache(ctx: ReconcileContext): Promise<void> {
  const loaded = await readLoadedDefinition(ctx.deps.redis, ctx.activityId);
  ctx.status.cache = {
    ...ctx.status.cache,
    ...(loaded ? { loadedGeneration: loaded.generation } : {}),
    syncedGeneration: ctx.generation,
    loads: loaded?.loads ?? ctx.status.cache?.loads ?? 0,
    skus: loaded?.items.length ?? ctx.status.cache?.skus ?? 0,
  };
}

export async function syncSpec(ctx: ReconcileContext): Promise<StepResult> {
  if (ctx.deleting) return CONTINUE;
  if (ctx.phase !== Phase.Ready && ctx.phase !== Phase.Active) return CONTINUE;
  await syncTrafficPolicy(ctx);
  if (ctx.status.cache?.syncedGeneration === ctx.generation) return CONTINUE;
  const outcome = await syncCache(ctx, ctx.phase);
  switch (outcome.kind) {
    case 'loaded':
      await recordCache(ctx);
      delete ctx.status.cache?.refusal;
      await ctx.event('Normal', EventReason.SpecChangeApplied, outcome.changes.join('; ') || 'reloaded');
      ctx.log.info({ changes: outcome.changes }, 'spec change applied to the cache');
      break;
    case 'unchanged':
      await recordCache(ctx);
      delete ctx.status.cache?.refusal;
      break;
    case 'refused':
      await recordCache(ctx);
      ctx.status.cache = {
        ...ctx.status.cache,
        refusal: { generation: ctx.generation, reason: Reason.SpecChangeRefused, message: outcome.message },
      };
      await ctx.event('Warning', EventReason.SpecChangeRefused, outcome.message);
      ctx.log.warn({ message: outcome.message }, 'spec change refused');
      break;
    case 'empty':
      ctx.degraded = {
        reason: Reason.CatalogEmpty,
        message: `catalog "${ctx.fsa.spec.catalogRef?.name ?? ''}" has no items; keeping what is loaded`,
      };
      ctx.requeueAfter(ctx.deps.config.cleanupRetryMs);
      break;
  }
  return CONTINUE;
}
