/**
 * Step 8: WritingBack. The gate is frozen (Redis stock never changes again), then the remaining
 * stock and the final counters go to PostgreSQL in one transaction fenced by a unique row, so a
 * repeat after a crash writes nothing. From here on PostgreSQL is the source of truth. The same
 * transaction marks the closed orders whose unit the snapshot holds for a payment (their
 * reservations PAID in Redis), so a late payment's retry does not take a second unit.
 */
import { readMeta, readStock, setGate } from '../../core/activity-cache.js';
import { countOrders } from '../../core/db/orders-store.js';
import { ordersHeldForPayment } from '../../core/order-lifecycle.js';
import { readWriteBack, writeBack as writeBackStock } from '../../core/db/stock-store.js';
import { EventReason, Phase } from '../api/v1alpha1/types.js';
import { crashPoint } from '../../core/crash.js';
import type { ReconcileContext, StepResult } from './context.js';
import { detectFailure } from './detect-failure.js';
import { CONTINUE } from './context.js';

export async function writeBack(ctx: ReconcileContext): Promise<StepResult> {
  if (ctx.phase !== Phase.WritingBack) return CONTINUE;
  ctx.requireOwnership();
  const { redis, pool, identity } = ctx.deps;
  let record = await readWriteBack(pool, ctx.activityId);
  if (!record) {
    const meta = await readMeta(redis, ctx.activityId);
    if (!meta) {
      // Loaded once, gone since detect-failure looked at it this pass (Redis restarted empty):
      // its stock is unknown, not nothing. Failing CacheLost is detect-failure's to say.
      if (ctx.status.cache?.loadedGeneration !== undefined) return detectFailure(ctx);
      return ctx.transition(Phase.CleaningUp, 'nothing was loaded; nothing to write back');
    }
    await setGate(redis, ctx.activityId, 'frozen');
    crashPoint('operator-after-freeze');
    const [stock, orders, heldForPayment] = await Promise.all([
      readStock(redis, ctx.activityId),
      countOrders(pool, ctx.activityId),
      ordersHeldForPayment(redis, pool, ctx.activityId),
    ]);
    const { written, trimmed } = await writeBackStock(pool, {
      activityId: ctx.activityId,
      generation: meta.generation,
      skus: stock.skus,
      reserved: stock.reserved,
      released: stock.released,
      orders: orders.orders,
      writtenBy: identity,
      heldForPayment,
    });
    crashPoint('operator-after-write-back');
    ctx.log.info({ written, trimmed }, 'write-back done');
    record = await readWriteBack(pool, ctx.activityId);
  }
  if (!record) throw new Error(`write-back of ${ctx.activityId} left no fence row`);
  ctx.status.writeBack = {
    writtenAt: new Date(record.writtenAt).toISOString(),
    generation: record.generation,
    remaining: record.remainingTotal,
    orders: record.ordersTotal,
    ...(record.trimmedTotal > 0 ? { trimmed: record.trimmedTotal } : {}),
  };
  // Recorded by whoever completes the step (the writer may have died right after writing).
  await ctx.event(
    'Normal',
    EventReason.WroteBack,
    `remaining stock ${record.remainingTotal} of ${record.initialTotal}, ${record.reservedTotal} reserved, ` +
      `${record.ordersTotal} order(s) written to PostgreSQL`,
  );
  if (record.trimmedTotal > 0) {
    await ctx.event(
      'Warning',
      EventReason.StockTrimmed,
      `${record.trimmedTotal} unit(s) of Redis' remaining stock were not written back: PostgreSQL had ` +
        'sold them already (Redis forgot reservations; see docs/runbooks/FlashSaleOversellPrevented.md)',
    );
  }
  return ctx.transition(Phase.CleaningUp, 'stock written back; cleaning up');
}
