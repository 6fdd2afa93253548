/**
 * Step 5: spec edits reaching a loaded cache. Compares what the spec asks for now with what is in
 * Redis: safe edits (extend endAt, add stock, add items; anything before the sale opens except
 * removing items or lowering stock) are loaded as a new generation through the load script's
 * fence; unsafe ones are refused with Degraded=True/SpecChangeRefused and the sale goes on with
 * what is loaded. The CRD's CEL rules refuse most unsafe edits at admission already; this is the
 * check for what admission cannot see (catalog rows, edits racing a phase change).
 *
 * Besides a new generation, the step looks at the cache's own load mark: a Redis whose `gen` is
 * older than status.cache.loadedGeneration came back from before a load (a snapshot, a lagging
 * replica) and is never loaded over from the spec; restore-cache.ts rebuilds it to the loaded
 * generation from PostgreSQL on the next pass. One that is newer (a status write lost after a
 * load) is recorded as it is.
 */
import { boundedMessage } from '../api/v1alpha1/conditions.js';
import { loadActivity } from '../../core/activity-cache.js';
import { cacheGeneration } from '../../core/cache-restore.js';
import { recordActivityItems } from '../../core/db/activity-items-store.js';
import { registerActivity } from '../../core/db/activity-registry-store.js';
import { recordActivitySkus } from '../../core/db/activity-skus-store.js';
import { liveQuantityBySku } from '../../core/db/orders-store.js';
import { FlashSaleError } from '../../core/errors.js';
import { readLoadedDefinition } from '../../core/loaded-definition.js';
import type { LoadedDefinition } from '../../core/loaded-definition.js';
import { EventReason, Phase, Reason } from '../api/v1alpha1/types.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE, DONE } from './context.js';
import { buildDefinition, diffDefinition, listChanges, phaseOfGate } from './definition.js';
import { planBuckets } from './plan-buckets.js';
import { catalogProblems, resolveItems } from './resolve-items.js';
import { syncTrafficPolicy } from './traffic-policy.js';

export type SyncOutcome =
  | { kind: 'loaded'; first: boolean; changes: string[] }
  | { kind: 'unchanged' }
  | { kind: 'refused'; message: string }
  | { kind: 'empty' }
  | { kind: 'invalid'; message: string };

/**
 * Brings the cache to the spec's generation when that is safe in the current phase. Idempotent:
 * the load script fences by generation, so a repeat after a crash changes nothing. Whatever the
 * outcome, the sale window the cache then holds is registered (activity_registry): the after-sale
 * role judges ENDED by it, and a cache restore puts back the loaded generation's window from it. A
 * repeat after a crash between the load and the registration registers it then.
 */
export async function syncCache(ctx: ReconcileContext, phase: Phase): Promise<SyncOutcome> {
  const { redis } = ctx.deps;
  const resolved = await resolveItems(ctx);
  if (resolved.length === 0) return { kind: 'empty' };
  // A catalog's rows were never admitted by the CRD: refused whole, nothing loaded or changed.
  const problems = catalogProblems(resolved);
  if (problems.length > 0)
    return {
      kind: 'invalid',
      message: `catalog "${ctx.fsa.spec.catalogRef?.name ?? ''}": ${problems.slice(0, 3).join('; ')}${problems.length > 3 ? ` (and ${problems.length - 3} more)` : ''}`,
    };
  const loaded = await readLoadedDefinition(redis, ctx.activityId);
  const items = await planBuckets(ctx, resolved, loaded);
  const desired = buildDefinition(ctx.fsa, ctx.activityId, items);
  let changes: string[] = [];
  if (loaded) {
    // What is live is what the consumer checks orders against: a cache loaded before the items
    // were recorded in PostgreSQL gets them here (idempotent; a newer generation is kept).
    await recordActivityItems(ctx.deps.pool, ctx.activityId, loaded.generation, loaded.items);
    const keep = async <T extends SyncOutcome>(outcome: T): Promise<T> => {
      await register(ctx, loaded);
      return outcome;
    };
    if (loaded.generation >= desired.generation) return keep({ kind: 'unchanged' });
    const diff = diffDefinition(loaded, desired, phaseOfGate(phase, loaded.gate));
    if (diff.unsafe.length > 0) {
      return keep({
        kind: 'refused',
        message: `refused spec generation ${desired.generation}: ${listChanges(diff.unsafe)}`,
      });
    }
    if (diff.changes.length === 0) return keep({ kind: 'unchanged' });
    changes = diff.changes;
  }
  // PostgreSQL first: once an item is in the cache, orders for it can reach the consumer, which
  // refuses orders for items it cannot find (a crash in between just repeats both, idempotently).
  await recordActivityItems(ctx.deps.pool, ctx.activityId, desired.generation, desired.items);
  // PostgreSQL learns each SKU's stock and limit before Redis can sell it: the consumer's stock
  // guard (core/stock-guard.ts) holds every order to these rows. Stock only grows here too.
  const { pool } = ctx.deps;
  const skuIds = desired.items.map((i) => i.skuId);
  await recordActivitySkus(
    pool,
    ctx.activityId,
    desired.items,
    'spec',
    await liveQuantityBySku(pool, ctx.activityId, skuIds),
  );
  try {
    await loadActivity(redis, desired);
  } catch (err) {
    if (err instanceof FlashSaleError && (err.code === 'STOCK_DECREASE' || err.code === 'STALE_GENERATION')) {
      // The cache kept what it had: PostgreSQL goes back to exactly that.
      const live = await readLoadedDefinition(redis, ctx.activityId);
      if (live) {
        await recordActivityItems(ctx.deps.pool, ctx.activityId, live.generation, live.items, {
          replace: true,
        });
        await register(ctx, live);
      }
      return { kind: 'refused', message: `refused spec generation ${desired.generation}: ${err.message}` };
    }
    throw err;
  }
  // endAt may have been extended: the after-sale role judges ENDED by the registered window.
  await register(ctx);
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
  const buckets = (loaded?.items ?? [])
    .filter((i) => (i.buckets ?? 1) > 1)
    .map((i) => ({ skuId: i.skuId, buckets: i.buckets! }));
  if (buckets.length > 0) ctx.status.cache.buckets = buckets;
}

export async function syncSpec(ctx: ReconcileContext): Promise<StepResult> {
  if (ctx.deleting) return CONTINUE;
  if (ctx.phase !== Phase.Ready && ctx.phase !== Phase.Active) return CONTINUE;
  await syncTrafficPolicy(ctx);
  ctx.requireOwnership();
  const loadedGeneration = ctx.status.cache?.loadedGeneration;
  const cached =
    loadedGeneration === undefined ? undefined : await cacheGeneration(ctx.deps.redis, ctx.activityId);
  if (loadedGeneration !== undefined && cached !== undefined && cached < loadedGeneration) {
    // Empty, or back at an older generation, since restore-cache looked at it: loading the spec
    // over it would top up stale stock (and count it as sold). The restore rebuilds it from
    // PostgreSQL to the loaded generation on the next pass; nothing opens or drains it meanwhile.
    ctx.log.warn({ cached, loadedGeneration }, 'the cache is behind the loaded generation; restoring first');
    ctx.requeueAfter(ctx.deps.config.drainCheckMs);
    return DONE;
  }
  if (ctx.status.cache?.syncedGeneration === ctx.generation && cached === loadedGeneration) return CONTINUE;
  const outcome = await syncCache(ctx, ctx.phase);
  switch (outcome.kind) {
    case 'loaded':
      await recordCache(ctx);
      delete ctx.status.cache?.refusal;
      await ctx.event('Normal', EventReason.SpecChangeApplied, listChanges(outcome.changes) || 'reloaded');
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
        refusal: {
          generation: ctx.generation,
          reason: Reason.SpecChangeRefused,
          message: boundedMessage(outcome.message),
        },
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
    case 'invalid':
      ctx.degraded = {
        reason: Reason.CatalogInvalid,
        message: boundedMessage(`${outcome.message}; keeping what is loaded`),
      };
      ctx.requeueAfter(ctx.deps.config.cleanupRetryMs);
      break;
  }
  return CONTINUE;
}

/**
 * Records the activity's sale window in PostgreSQL (activity_registry), so the platform after-sale
 * role can answer NOT_STARTED / ENDED / NOT_FOUND without the cache, and a cache restore knows the
 * loaded generation's window and settings (requireOrderCode, reopenOnRelease): the spec's, or
 * `cached`, what the cache holds (after a load the spec asked for was refused or had nothing to
 * change). Idempotent; a row owned by another resource is never moved.
 */
export async function register(
  ctx: ReconcileContext,
  cached?: Pick<LoadedDefinition, 'startMs' | 'endMs' | 'requireOrderCode' | 'reopenOnRelease'>,
): Promise<void> {
  ctx.requireOwnership();
  const known = cached !== undefined && cached.startMs > 0 && cached.endMs > 0;
  await registerActivity(ctx.deps.pool, {
    activityId: ctx.activityId,
    owner: `${ctx.fsa.metadata.namespace}/${ctx.fsa.metadata.name}`,
    ownerUid: ctx.fsa.metadata.uid,
    startAt: known ? new Date(cached.startMs) : ctx.schedule.startAt,
    endAt: known ? new Date(cached.endMs) : ctx.schedule.endAt,
    requireOrderCode: known ? cached.requireOrderCode : ctx.fsa.spec.requireOrderCode,
    reopenOnRelease: known ? cached.reopenOnRelease : ctx.fsa.spec.reopenOnRelease,
  });
}
