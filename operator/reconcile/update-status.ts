/**
 * Last step of every pass (also after an early end or an error): stock and backlog figures, the
 * Degraded and Paused conditions, the derived phase and observedGeneration, written as one merge
 * patch carrying the resourceVersion the pass started from (nothing is written when nothing
 * changed). Also the per-activity metrics.
 */
import { RESTORE_STEPS } from '../../core/db/cache-restores-store.js';
import { countUnconfirmed, readMeta, readOutbox, readStock } from '../../core/activity-cache.js';
import { countOrders } from '../../core/db/orders-store.js';
import { readStockRows, readWriteBack } from '../../core/db/stock-store.js';
import { derivePhase, enterPhase, findCondition, setCondition } from '../api/v1alpha1/conditions.js';
import type { ConditionInput } from '../api/v1alpha1/conditions.js';
import { ConditionType, Phase, Reason, RUNTIME_ROLES } from '../api/v1alpha1/types.js';
import type { BacklogStatus, FlashSaleActivityStatus, StockStatus } from '../api/v1alpha1/types.js';
import { activityLabels } from './context.js';
import type { ActivityLabels, ReconcileContext } from './context.js';
import { exportOpenRestoreFromStatus, RESTORE_PHASES } from './restore-metrics.js';
import { readSettlement } from './settle.js';

const KAFKA_PHASES: readonly Phase[] = [
  Phase.Active,
  Phase.Draining,
  Phase.WritingBack,
  Phase.CleaningUp,
  Phase.Settling,
  Phase.Completed,
];
const FIGURE_PHASES: readonly Phase[] = [
  Phase.WarmingUp,
  Phase.Ready,
  Phase.Active,
  Phase.Draining,
  Phase.WritingBack,
  Phase.CleaningUp,
  Phase.Settling,
  Phase.Completed,
];

async function readFigures(
  ctx: ReconcileContext,
  phase: Phase,
): Promise<{ stock?: StockStatus; backlog?: BacklogStatus }> {
  // Only the id's owner reads its figures (another tenant's resource never sees them).
  if (!FIGURE_PHASES.includes(phase) || !ctx.ownsActivityId) return {};
  const { redis, pool, kafka, config } = ctx.deps;
  const id = ctx.activityId;
  const now = ctx.now.getTime();
  const orders = await countOrders(pool, id);
  const ordered = { ordered: orders.orders, paid: orders.byStatus.PAID };
  const meta = await readMeta(redis, id);
  let stock: StockStatus | undefined;
  let backlog: BacklogStatus = {};
  const record = meta?.gate === 'frozen' || !meta ? await readWriteBack(pool, id) : undefined;
  if (record) {
    // After write-back PostgreSQL is the truth (later releases update it, not Redis).
    const rows = await readStockRows(pool, id);
    stock = {
      initial: record.initialTotal,
      reserved: record.reservedTotal,
      released: record.releasedTotal,
      remaining: rows.reduce((n, r) => n + r.remaining, 0),
      ...ordered,
    };
  } else if (meta) {
    const s = await readStock(redis, id);
    stock = {
      initial: s.initial,
      reserved: s.reserved,
      released: s.released,
      remaining: s.remaining,
      ...ordered,
    };
  }
  if (meta) {
    const [outbox, gap, unconfirmed] = await Promise.all([
      readOutbox(redis, id, now),
      countUnconfirmed(redis, id, now - config.orderGapThresholdMs),
      countUnconfirmed(redis, id, now + 1),
    ]);
    backlog = {
      halfMessages: outbox.halfMessages,
      oldestHalfMessageAgeSeconds: Math.floor(outbox.oldestAgeSeconds),
      orderGap: gap,
      unconfirmed,
    };
  } else if (record) {
    backlog = { halfMessages: 0, oldestHalfMessageAgeSeconds: 0, orderGap: 0, unconfirmed: 0 };
  }
  if (KAFKA_PHASES.includes(phase)) {
    const [lag, dlq, unhandled] = await Promise.all([
      kafka.lag(id).catch(() => undefined),
      kafka.dlqDepth(id).catch(() => undefined),
      kafka.dlqUnhandled(id).catch(() => undefined),
    ]);
    if (lag !== undefined) backlog.consumerLag = lag;
    if (dlq !== undefined) backlog.dlqDepth = dlq;
    if (unhandled !== undefined) backlog.dlqUnhandled = unhandled;
  }
  return { ...(stock ? { stock } : {}), backlog };
}

export function degradedCondition(ctx: ReconcileContext, status: FlashSaleActivityStatus): ConditionInput {
  const c = (reason: string, message: string): ConditionInput => ({
    type: ConditionType.Degraded,
    status: 'True',
    reason,
    message,
  });
  if (ctx.error !== undefined) {
    return c(Reason.ReconcileError, ctx.error instanceof Error ? ctx.error.message : String(ctx.error));
  }
  if (ctx.degraded) return c(ctx.degraded.reason, ctx.degraded.message);
  const refusal = status.cache?.refusal;
  if (refusal?.generation === ctx.generation && refusal.message)
    return c(Reason.SpecChangeRefused, refusal.message);
  // What the drain left is gone once the cleanup ran (it waits until nothing is in flight): from
  // Settling on the leftover is history (status.drain keeps it), not a problem to chase.
  const phase = derivePhase(status.conditions);
  if (
    status.drain?.timedOut &&
    status.drain.leftover &&
    phase !== Phase.Settling &&
    phase !== Phase.Completed
  )
    return c(Reason.DrainTimedOut, status.drain.leftover);
  return {
    type: ConditionType.Degraded,
    status: 'False',
    reason: Reason.AsExpected,
    message: 'no problem seen',
  };
}

/** SpecAccepted: False while an edit of this generation stands refused, whatever Degraded says. */
export function specAcceptedCondition(
  ctx: ReconcileContext,
  status: FlashSaleActivityStatus,
): ConditionInput {
  const refusal = status.cache?.refusal;
  if (refusal?.generation === ctx.generation && refusal.message)
    return {
      type: ConditionType.SpecAccepted,
      status: 'False',
      reason: Reason.SpecChangeRefused,
      message: refusal.message,
    };
  return {
    type: ConditionType.SpecAccepted,
    status: 'True',
    reason: Reason.SpecAccepted,
    message: 'no edit of this generation was refused',
  };
}

/**
 * Paused says what the gate is, not what the spec asks: while Active, what open-gate.ts left it
 * in this pass, or, when the pass failed before (PostgreSQL or Redis unreachable), what the last
 * pass reported. A pause the operator could not apply yet is `PausePending`, never True: buyers
 * are still being served.
 */
export function pausedCondition(ctx: ReconcileContext, phase: Phase): ConditionInput {
  const c = (paused: boolean, reason: string, message: string): ConditionInput => ({
    type: ConditionType.Paused,
    status: paused ? 'True' : 'False',
    reason,
    message,
  });
  const wanted = ctx.fsa.spec.paused === true;
  const off = c(false, Reason.NotPaused, 'not paused');
  if (phase === Phase.Ready) return wanted ? c(true, Reason.PausedBySpec, 'the sale will start paused') : off;
  if (phase !== Phase.Active) return off;
  const closed =
    ctx.gateSeen !== undefined
      ? ctx.gateSeen === 'paused'
      : findCondition(ctx.fsa.status?.conditions, ConditionType.Paused)?.status === 'True';
  if (closed && wanted) return c(true, Reason.PausedBySpec, 'the gate is closed by spec.paused');
  if (closed)
    return c(
      true,
      Reason.ResumePending,
      'spec.paused was cleared; the gate is still closed until the operator reaches it',
    );
  if (wanted)
    return c(
      false,
      Reason.PausePending,
      'spec.paused is set, but the gate is still open: the operator has not reached it yet',
    );
  return off;
}

const UNSETTLED = ['unpaid', 'closed_unsettled', 'refund_pending', 'refunding'] as const;
const INSTANTS = ['warm_up', 'start', 'end'] as const;
const REPLICA_STATES = ['desired', 'available'] as const;

function exportActivityMetrics(ctx: ReconcileContext, phase: Phase, status: FlashSaleActivityStatus): void {
  const { metrics } = ctx.deps;
  const labels = activityLabels(ctx);
  for (const p of Object.values(Phase))
    metrics.activityPhase.set({ ...labels, phase: p }, p === phase ? 1 : 0);
  // Schedule instants, so that a rule can tell a sale that should be open by now (startAt passed)
  // and is not Active.
  const instants = { warm_up: ctx.schedule.warmUpAt, start: ctx.schedule.startAt, end: ctx.schedule.endAt };
  for (const instant of INSTANTS)
    metrics.activitySchedule.set({ ...labels, instant }, instants[instant].getTime() / 1000);
  const b = status.backlog;
  if (b?.halfMessages !== undefined) metrics.activityHalfMessages.set(labels, b.halfMessages);
  if (b?.oldestHalfMessageAgeSeconds !== undefined)
    metrics.activityOldestHalfMessageAge.set(labels, b.oldestHalfMessageAgeSeconds);
  if (b?.orderGap !== undefined) metrics.activityOrderGap.set(labels, b.orderGap);
  if (b?.consumerLag !== undefined) metrics.activityConsumerLag.set(labels, b.consumerLag);
  if (b?.dlqDepth !== undefined) metrics.activityDlqDepth.set(labels, b.dlqDepth);
  if (b?.dlqUnhandled !== undefined) metrics.activityDlqUnhandled.set(labels, b.dlqUnhandled);
  if (status.settlement) {
    const st = status.settlement;
    const values = {
      unpaid: st.unpaid,
      closed_unsettled: st.closedUnsettled,
      refund_pending: st.refundPending,
      refunding: st.refunding,
    };
    for (const key of UNSETTLED) metrics.ordersUnsettled.set({ ...labels, status: key }, values[key] ?? 0);
  }
}

/** Removes every per-activity series of a resource that no longer exists. */
export function forgetActivityMetrics(
  metrics: ReconcileContext['deps']['metrics'],
  labels: ActivityLabels,
): void {
  for (const p of Object.values(Phase)) metrics.activityPhase.remove({ ...labels, phase: p });
  for (const status of UNSETTLED) metrics.ordersUnsettled.remove({ ...labels, status });
  for (const instant of INSTANTS) metrics.activitySchedule.remove({ ...labels, instant });
  for (const role of RUNTIME_ROLES)
    for (const state of REPLICA_STATES) metrics.activityReplicas.remove({ ...labels, role, state });
  for (const g of [
    metrics.activityHalfMessages,
    metrics.activityOldestHalfMessageAge,
    metrics.activityOrderGap,
    metrics.activityConsumerLag,
    metrics.activityDlqDepth,
    metrics.activityDlqUnhandled,
  ])
    g.remove(labels);
  for (const step of RESTORE_STEPS) {
    metrics.cacheRestoreOpenSeconds.remove({ ...labels, step });
    metrics.cacheRestoreOpenSince.remove({ ...labels, step });
  }
  for (const reason of ['CacheEmpty', 'CacheBehind'] as const)
    metrics.cacheRestores.remove({ ...labels, reason });
}

/** Computes the final status of the pass and writes it. */
export async function updateStatus(ctx: ReconcileContext): Promise<void> {
  if (ctx.gone) return;
  const status = ctx.status;
  const { now } = ctx;
  if (!status.conditions || status.conditions.length === 0) {
    // A pass that ended before warm-up.ts recorded Pending (an error, a deletion).
    status.conditions = enterPhase([], Phase.Pending, 'waiting for warm-up', ctx.generation, now);
    status.timestamps = { ...status.timestamps, pending: now.toISOString() };
  }
  const phase = derivePhase(status.conditions);
  if (ctx.error === undefined) {
    try {
      Object.assign(status, await readFigures(ctx, phase));
      // The pass that entered Settling shows its figures at once (the settle step reads them in
      // the passes after).
      if (phase === Phase.Settling && ctx.phase !== Phase.Settling)
        status.settlement = await readSettlement(ctx);
    } catch (err) {
      ctx.log.warn({ err: String(err) }, 'could not read stock/backlog figures');
    }
  }
  let conditions = setCondition(status.conditions, degradedCondition(ctx, status), ctx.generation, now);
  conditions = setCondition(conditions, specAcceptedCondition(ctx, status), ctx.generation, now);
  conditions = setCondition(conditions, pausedCondition(ctx, phase), ctx.generation, now);
  // Keep a stable order: lifecycle conditions first, then Degraded, Paused and RuntimeReady.
  const order: string[] = [
    ConditionType.Ready,
    ConditionType.Progressing,
    ConditionType.Succeeded,
    ConditionType.Degraded,
    ConditionType.Paused,
    ConditionType.RuntimeReady,
  ];
  status.conditions = conditions.sort((a, b) => order.indexOf(a.type) - order.indexOf(b.type));
  status.phase = phase;
  status.observedGeneration = ctx.generation;
  status.activityId = ctx.activityId;
  if (ctx.transitioned) delete status.nextCheckAt;
  else if (ctx.requeueAtMs !== undefined) status.nextCheckAt = new Date(ctx.requeueAtMs).toISOString();
  else delete status.nextCheckAt;

  exportActivityMetrics(ctx, phase, status);
  if (RESTORE_PHASES.includes(phase)) exportOpenRestoreFromStatus(ctx, status);

  const updated = await ctx.deps.activities.patchStatus(ctx.fsa, status);
  if (updated) ctx.fsa = updated;
}
