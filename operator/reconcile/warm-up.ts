/**
 * Step 4: Pending -> WarmingUp at warm-up time; then Kafka topics (created if missing) and cache
 * loading (once per generation: the load script's fence makes a repeat after a crash a no-op,
 * so live stock is never reset), then -> Ready once the runtime is available (observe-runtime.ts).
 */
import { boundedMessage } from '../api/v1alpha1/conditions.js';
import { claimCacheOwner } from '../../core/activity-cache.js';
import { TopicBrokersError, TopicReplicationError } from '../../core/kafka.js';
import { EventReason, Phase, Reason } from '../api/v1alpha1/types.js';
import { crashPoint } from '../../core/crash.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE, DONE } from './context.js';
import { waitForRuntime } from './observe-runtime.js';
import { recordCache, register, syncCache } from './sync-spec.js';
import { syncTrafficPolicy } from './traffic-policy.js';

export async function warmUp(ctx: ReconcileContext): Promise<StepResult> {
  if (ctx.deleting) return CONTINUE;
  if (ctx.phase === Phase.Pending) {
    const at = ctx.schedule.warmUpAt;
    if (!ctx.fsa.status?.conditions?.length) {
      await register(ctx);
      // A new resource is recorded as Pending first, even when warm-up time has already come.
      if (ctx.now < at) ctx.requeueAt(at.getTime());
      return ctx.transition(Phase.Pending, `waiting for warm-up at ${at.toISOString()}`);
    }
    if (ctx.now < at) {
      ctx.requeueAt(at.getTime());
      return CONTINUE;
    }
    await ctx.event('Normal', EventReason.WarmUpStarted, `warm-up of activity ${ctx.activityId} began`);
    return ctx.transition(Phase.WarmingUp, `warming up: topics, cache loading, runtime at warm-up size`);
  }
  if (ctx.phase !== Phase.WarmingUp) return CONTINUE;
  ctx.requireOwnership();

  const { redis, kafka } = ctx.deps;
  // The cache records its owner before anything is loaded; a cache recorded for another resource,
  // or loaded by an activity older than the claims (no owner recorded), is never touched.
  const owner = await claimCacheOwner(redis, ctx.activityId, ctx.fsa.metadata.uid);
  if (owner.owner !== ctx.fsa.metadata.uid || (owner.loadedBefore && !ctx.status.cache)) {
    const message =
      owner.owner !== ctx.fsa.metadata.uid
        ? `the cache of activity id ${ctx.activityId} belongs to the resource with uid ${owner.owner}`
        : `activity id ${ctx.activityId} already holds the cache of an earlier activity`;
    await ctx.event('Warning', EventReason.Failed, `${Reason.ActivityIdInUse}: ${message}`);
    return ctx.transition(Phase.Failed, message, Reason.ActivityIdInUse);
  }
  let created: string[];
  try {
    created = await kafka.ensureTopics(ctx.activityId);
  } catch (err) {
    // Selling on topics with less replication would acknowledge orders on fewer brokers than
    // configured; topics that cannot be created yet (brokers down) leave nothing to sell on. Either
    // way: hold the warm-up (the gate stays shut) until that changes, and say so once.
    const hold =
      err instanceof TopicReplicationError
        ? { reason: Reason.TopicsUnderReplicated, event: EventReason.TopicsUnderReplicated, err }
        : err instanceof TopicBrokersError
          ? { reason: Reason.TooFewKafkaBrokers, event: EventReason.TooFewKafkaBrokers, err }
          : undefined;
    if (hold === undefined) throw err;
    const { message } = hold.err;
    const already = ctx.fsa.status?.conditions?.some((c) => c.reason === hold.reason) ?? false;
    ctx.degraded = { reason: hold.reason, message };
    if (!already) await ctx.event('Warning', hold.event, message);
    ctx.requeueAfter(ctx.deps.config.cleanupRetryMs);
    return DONE;
  }
  crashPoint('operator-after-topics');
  if (created.length > 0) {
    await ctx.event('Normal', EventReason.TopicsCreated, `created Kafka topics ${created.join(', ')}`);
  }

  await register(ctx);
  const outcome = await syncCache(ctx, Phase.WarmingUp);
  if (outcome.kind === 'invalid') {
    ctx.degraded = { reason: Reason.CatalogInvalid, message: boundedMessage(`${outcome.message}; retrying`) };
    ctx.requeueAfter(ctx.deps.config.cleanupRetryMs);
    return DONE;
  }
  if (outcome.kind === 'empty') {
    ctx.degraded = {
      reason: Reason.CatalogEmpty,
      message: `catalog "${ctx.fsa.spec.catalogRef?.name ?? ''}" has no items; retrying`,
    };
    ctx.requeueAfter(ctx.deps.config.cleanupRetryMs);
    return DONE;
  }
  if (outcome.kind === 'refused') {
    // Loaded by an earlier pass and then edited unsafely (e.g. stock lowered): keep what is loaded.
    ctx.status.cache = {
      ...ctx.status.cache,
      refusal: {
        generation: ctx.generation,
        reason: Reason.SpecChangeRefused,
        message: boundedMessage(outcome.message),
      },
    };
    await ctx.event('Warning', EventReason.SpecChangeRefused, outcome.message);
  }
  // Before Ready, so the api replicas find the activity's limits and eligibility rules in place.
  await syncTrafficPolicy(ctx);
  crashPoint('operator-after-load');
  const recorded = ctx.status.cache?.loadedGeneration;
  await recordCache(ctx);
  const c = ctx.status.cache;
  // Once per load, also when the passes that wait for the runtime below repeat this step.
  if (c?.loadedGeneration === undefined || c.loadedGeneration !== recorded) {
    await ctx.event(
      'Normal',
      EventReason.CacheLoaded,
      `loaded ${c?.skus ?? 0} sku(s) of generation ${c?.loadedGeneration ?? ctx.generation} into the cache`,
    );
  }
  const waiting = waitForRuntime(ctx);
  if (waiting) return waiting;
  return ctx.transition(Phase.Ready, 'cache loaded, runtime available; waiting for the sale to start');
}
