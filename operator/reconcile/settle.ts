/**
 * Step 10: Settling. Orders outlive the sale (docs/after-sale.md "The after-sale tier"): the
 * activity is Completed only once every order is PAID, CLOSED (stock returned) or REFUNDED and
 * no payment waits for a refund. The work itself is done by the runtime (the sweeper closes
 * expired orders and returns their stock to PostgreSQL; payments and refunds are applied by the
 * notification endpoints), here and in the platform-level after-sale role; this step only counts,
 * from PostgreSQL, and decides.
 *
 * Requeue: at the latest payment deadline of an UNPAID order (the instant the last order can be
 * closed), and at most SETTLE_CHECK_SECONDS later: payments and refunds arrive without any
 * Kubernetes event, so a bounded re-check is the only way to see them (no watch on PostgreSQL).
 *
 * A resource deleted while Settling with orders still unsettled is released (remove-finalizer.ts)
 * without waiting: its orders live in PostgreSQL and the after-sale role keeps settling them; the
 * Event says so. With nothing left to settle it is Completed first, as without deletion.
 */
import { settlementCounts } from '../../core/db/orders-store.js';
import { countRefundPending } from '../../core/db/payments-store.js';
import { EventReason, Phase } from '../api/v1alpha1/types.js';
import type { SettlementStatus } from '../api/v1alpha1/types.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE } from './context.js';

/** The settlement figures of the activity, as recorded in status.settlement. */
export async function readSettlement(ctx: ReconcileContext): Promise<SettlementStatus> {
  const [orders, refundPending, deadLetters] = await Promise.all([
    settlementCounts(ctx.deps.pool, ctx.activityId),
    countRefundPending(ctx.deps.pool, ctx.activityId),
    // Unknown (left out) while Kafka does not answer: the activity is not Completed on a guess.
    ctx.deps.kafka.dlqUnhandled(ctx.activityId).catch((err: unknown) => {
      ctx.log.warn({ err: String(err) }, 'could not count the unhandled dead letters');
      return undefined;
    }),
  ]);
  return {
    unpaid: orders.unpaid,
    paid: orders.paid,
    closed: orders.closed,
    closedUnsettled: orders.closedUnsettled,
    refundPending,
    refunding: orders.refunding,
    refunded: orders.refunded,
    unsettled: orders.unpaid + orders.closedUnsettled + refundPending + orders.refunding,
    ...(deadLetters !== undefined ? { deadLetters } : {}),
    ...(orders.lastUnpaidDeadline ? { lastPaymentDeadline: orders.lastUnpaidDeadline.toISOString() } : {}),
  };
}

export async function settle(ctx: ReconcileContext): Promise<StepResult> {
  if (ctx.phase !== Phase.Settling) return CONTINUE;
  const s = await readSettlement(ctx);
  ctx.status.settlement = s;
  // Deleted with orders still unsettled: released from Settling by remove-finalizer.ts.
  if (ctx.deleting && (s.unsettled ?? 0) > 0) return CONTINUE;
  // A dead letter is a reservation with no order yet, and so is a message still in the order
  // topic (a replayed dead letter the consumer has not written yet): Completed scales the consumer
  // to zero, and nothing would write them. So the activity waits, its consumer running, until
  // every dead letter is replayed or acknowledged and the consumer has caught up (unknown while
  // Kafka does not answer: it waits). A deletion does not wait for them.
  const caughtUp =
    ctx.deleting ||
    (s.deadLetters === 0 && (await ctx.deps.kafka.lag(ctx.activityId).catch(() => undefined)) === 0);
  if (s.unsettled === 0 && caughtUp) {
    // Deleted with dead letters left: said, since nothing of the sale's runtime remains to replay them.
    const left = ctx.deleting && (s.deadLetters ?? 0) > 0;
    const message =
      `settled: ${s.paid ?? 0} paid, ${s.closed ?? 0} closed (stock returned), ${s.refunded ?? 0} refunded; ` +
      (left ? `${s.deadLetters} dead letter(s) left unhandled (dlq in the after-sale Deployment); ` : '') +
      'runtime scaled to zero';
    await ctx.event(left ? 'Warning' : 'Normal', EventReason.Settled, message);
    await ctx.event('Normal', EventReason.Completed, 'the activity is complete; runtime scaled to zero');
    return ctx.transition(Phase.Completed, message);
  }
  const now = ctx.now.getTime();
  if (s.lastPaymentDeadline) {
    const deadline = new Date(s.lastPaymentDeadline).getTime();
    if (deadline > now) ctx.requeueAt(deadline);
  }
  ctx.requeueAfter(ctx.deps.config.settleCheckMs);
  return CONTINUE;
}
