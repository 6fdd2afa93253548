/**
 * Step 7: the sale ends at endAt (or when the resource is deleted): the gate closes and the
 * activity drains. Relays and consumers keep running (draining replicas) until the half-message
 * backlog is empty, the consumer group has caught up and every reservation is an order, or until
 * spec.drain.timeout; then Degraded=True/DrainTimedOut says exactly what was left.
 */
import { countUnconfirmed, readMeta, readOutbox, setGate } from '../../core/activity-cache.js';
import { readActivityItems } from '../../core/db/activity-items-store.js';
import { parseDuration } from '../api/v1alpha1/funcs.js';
import { setCondition } from '../api/v1alpha1/conditions.js';
import { ConditionType, EventReason, Phase, Reason } from '../api/v1alpha1/types.js';
import { crashPoint } from '../../core/crash.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE, DONE } from './context.js';

export interface Backlog {
  halfMessages: number;
  unconfirmed: number;
  /** undefined when Kafka could not be asked. */
  consumerLag: number | undefined;
}

export function backlogLeft(b: Backlog): string[] {
  const left: string[] = [];
  if (b.halfMessages > 0) left.push(`${b.halfMessages} half message(s) not yet in Kafka`);
  if (b.consumerLag === undefined) left.push('consumer lag unknown (Kafka unreachable)');
  else if (b.consumerLag > 0) left.push(`consumer lag ${b.consumerLag}`);
  if (b.unconfirmed > 0) left.push(`${b.unconfirmed} reservation(s) without an order in PostgreSQL`);
  return left;
}

export async function readBacklog(ctx: ReconcileContext): Promise<Backlog> {
  const { redis, kafka } = ctx.deps;
  const [outbox, unconfirmed, consumerLag] = await Promise.all([
    readOutbox(redis, ctx.activityId, ctx.now.getTime()),
    countUnconfirmed(redis, ctx.activityId, ctx.now.getTime() + 1),
    kafka.lag(ctx.activityId).catch((err: unknown) => {
      ctx.log.warn({ err: String(err) }, 'consumer lag unavailable');
      return undefined;
    }),
  ]);
  return { halfMessages: outbox.halfMessages, unconfirmed, consumerLag };
}

/** Whether PostgreSQL holds the activity's items: recorded before any cache load began. */
async function hasActivityItems(ctx: ReconcileContext): Promise<boolean> {
  return (await readActivityItems(ctx.deps.pool, ctx.activityId)).size > 0;
}

export async function drain(ctx: ReconcileContext): Promise<StepResult> {
  const { redis, config } = ctx.deps;
  const live = ctx.phase === Phase.Ready || ctx.phase === Phase.Active;
  if (live || (ctx.phase === Phase.WarmingUp && ctx.deleting)) {
    ctx.requireOwnership();
    const meta = await readMeta(redis, ctx.activityId);
    const endMs = meta?.endMs || ctx.schedule.endAt.getTime();
    if (!ctx.deleting && ctx.now.getTime() < endMs) {
      ctx.requeueAt(endMs);
      return CONTINUE;
    }
    if (meta && meta.gate !== 'closed' && meta.gate !== 'frozen')
      await setGate(redis, ctx.activityId, 'closed');
    crashPoint('operator-after-close-gate');
    const why = ctx.deleting ? 'the activity is being deleted' : 'the sale window ended';
    await ctx.event('Normal', EventReason.DrainStarted, `${why}: gate closed, draining`);
    const deadline = new Date(ctx.now.getTime() + parseDuration(ctx.fsa.spec.drain.timeout));
    ctx.status.drain = { deadline: deadline.toISOString() };
    return ctx.transition(Phase.Draining, `${why}; draining until ${deadline.toISOString()} at the latest`);
  }
  if (ctx.phase !== Phase.Draining) return CONTINUE;
  ctx.requireOwnership();

  const meta = await readMeta(redis, ctx.activityId);
  if (!meta || meta.generation === 0) {
    if (ctx.status.cache?.loadedGeneration !== undefined || (ctx.status.cache?.loads ?? 0) > 0) {
      // Loaded, and the cache is gone (or only a restore's hold is there): restore-cache.ts
      // rebuilds it from PostgreSQL first (it runs before this step, also on deletion). Moving on
      // would skip the consumers' lag and write back an empty cache.
      ctx.status.conditions = setCondition(
        ctx.status.conditions,
        {
          type: ConditionType.CacheConsistent,
          status: 'False',
          reason: Reason.RestorePausing,
          message: 'the cache is gone; it is restored from PostgreSQL before the drain goes on',
        },
        ctx.generation,
        ctx.now,
      );
      ctx.requeueAfter(config.drainCheckMs);
      return DONE;
    }
    if (!meta && !(await hasActivityItems(ctx))) {
      // Never loaded (deleted during warm-up before any load began): nothing can be in flight.
      return ctx.transition(Phase.WritingBack, 'nothing was loaded; nothing to drain');
    }
    // A load may have begun without the status knowing it: wait for the backlog all the same.
  }
  const backlog = await readBacklog(ctx);
  const left = backlogLeft(backlog);
  if (left.length === 0) {
    crashPoint('operator-after-drain');
    await ctx.event('Normal', EventReason.Drained, 'backlog empty: every reservation is an order');
    return ctx.transition(Phase.WritingBack, 'drained; writing back');
  }
  // Counted from the drain's start with spec.drain.timeout as it is now: an edit during the drain
  // (raised for a backlog that needs longer, or lowered) moves the deadline, and the status and
  // the timeout's message name the one applied.
  const started = ctx.status.timestamps?.draining;
  const timeoutMs = parseDuration(ctx.fsa.spec.drain.timeout);
  const deadlineMs = started
    ? new Date(started).getTime() + timeoutMs
    : ctx.status.drain?.deadline
      ? new Date(ctx.status.drain.deadline).getTime()
      : ctx.now.getTime() + timeoutMs;
  const deadline = new Date(deadlineMs).toISOString();
  if (ctx.status.drain?.deadline !== deadline) ctx.status.drain = { ...ctx.status.drain, deadline };
  if (ctx.now.getTime() >= deadlineMs) {
    const message = `drain timed out after ${ctx.fsa.spec.drain.timeout}: ${left.join(', ')}`;
    ctx.status.drain = { ...ctx.status.drain, timedOut: true, leftover: message };
    crashPoint('operator-after-drain');
    await ctx.event('Warning', EventReason.DrainTimedOut, message);
    return ctx.transition(Phase.WritingBack, message);
  }
  ctx.requeueAt(Math.min(deadlineMs, ctx.now.getTime() + config.drainCheckMs));
  return CONTINUE;
}
