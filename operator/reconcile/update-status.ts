/**
 * Last step of every pass (also after an early end or an error): stock and backlog figures, the
 * Degraded and Paused conditions, the derived phase and observedGeneration, written as one merge
 * patch carrying the resourceVersion the pass started from (nothing is written when nothing
 * changed). Also the per-activity metrics.
 */
import { countUnconfirmed, readMeta, readOutbox, readStock } from '../../core/activity-cache.js';
import { countOrders } from '../../core/db/orders-store.js';
import { readStockRows, readWriteBack } from '../../core/db/stock-store.js';
import { derivePhase, enterPhase, setCondition } from '../api/v1alpha1/conditions.js';
import type { ConditionInput } from '../api/v1alpha1/conditions.js';
import { ConditionType, Phase, Reason } from '../api/v1alpha1/types.js';
import type { BacklogStatus, FlashSaleActivityStatus, StockStatus } from '../api/v1alpha1/types.js';
import type { ReconcileContext } from './context.js';
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
    const [lag, dlq] = await Promise.all([
      kafka.lag(id).catch(() => undefined),
      kafka.dlqDepth(id).catch(() => undefined),
    ]);
    if (lag !== undefined) backlog.consumerLag = lag;
    if (dlq !== undefined) backlog.dlqDepth = dlq;
  }
  return { ...(stock ? { stock } : {}), backlog };
}

function degradedCondition(ctx: ReconcileContext, status: FlashSaleActivityStatus): ConditionInput {
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
  if (status.drain?.timedOut && status.drain.leftover) return c(Reason.DrainTimedOut, status.drain.leftover);
  return {
    type: ConditionType.Degraded,
    status: 'False',
    reason: Reason.AsExpected,
    message: 'no problem seen',
  };
}

function pausedCondition(ctx: ReconcileContext, phase: Phase): ConditionInput {
  const paused = ctx.fsa.spec.paused && (phase === Phase.Ready || phase === Phase.Active);
  return paused
    ? {
        type: ConditionType.Paused,
        status: 'True',
        reason: Reason.PausedBySpec,
        message: phase === Phase.Active ? 'the gate is closed by spec.paused' : 'the sale will start paused',
      }
    : { type: ConditionType.Paused, status: 'False', reason: Reason.NotPaused, message: 'not paused' };
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

  const { metrics } = ctx.deps;
  const labels = { activity: ctx.fsa.metadata.name, namespace: ctx.fsa.metadata.namespace };
  for (const p of Object.values(Phase))
    metrics.activityPhase.set({ ...labels, phase: p }, p === phase ? 1 : 0);
  if (status.backlog?.halfMessages !== undefined)
    metrics.activityHalfMessages.set(labels, status.backlog.halfMessages);
  if (status.backlog?.consumerLag !== undefined)
    metrics.activityConsumerLag.set(labels, status.backlog.consumerLag);
  if (status.settlement) {
    const st = status.settlement;
    for (const [key, value] of [
      ['unpaid', st.unpaid],
      ['closed_unsettled', st.closedUnsettled],
      ['refund_pending', st.refundPending],
      ['refunding', st.refunding],
    ] as const) {
      metrics.ordersUnsettled.set({ ...labels, status: key }, value ?? 0);
    }
  }

  const updated = await ctx.deps.activities.patchStatus(ctx.fsa, status);
  if (updated) ctx.fsa = updated;
}
