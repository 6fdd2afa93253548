/**
 * The last guard against overselling, in PostgreSQL (seeds 002 and 003): in the consumer's insert
 * transaction, after the orders are inserted, each SKU's live quantity (`activity_skus.sold`, kept
 * by the triggers of migration 7) must stay within its stock and each buyer's live quantity of a
 * SKU within the limit, counted in units, not slots. Orders of the batch beyond either are closed
 * in the same transaction (`OVERSELL_PREVENTED`, `BUYER_LIMIT_EXCEEDED`): newest reservation
 * first, and never an order of an earlier transaction, whose buyer may already have seen it.
 * After the commit their reservations are released through the one settlement path
 * (core/order-lifecycle.ts), which withholds their units (`guardRelease`: Redis had counted them
 * beyond PostgreSQL's stock), and counted in `flashsale_oversell_prevented_total`.
 *
 * Redis decides first and normally alone; this guard only acts when Redis accepted more than the
 * stock (a failover or restart lost acknowledged reservations, or its state was changed behind our
 * back). The SKU row lock it takes (through the insert trigger) serializes the insert
 * transactions of one SKU from their insert to their commit, which is what makes the sums exact
 * with several consumers and partitions at once. See docs/runbooks/FlashSaleOversellPrevented.md.
 */
import { readLoadedDefinition } from './loaded-definition.js';
import { lockActivitySkus, missingSkus, recordActivitySkus } from './db/activity-skus-store.js';
import type { ActivitySkuRow } from './db/activity-skus-store.js';
import { appendJournal } from './db/journal-store.js';
import {
  buyerSkuKey,
  closeUnpaidOrders,
  findLiveSlotHolder,
  insertClosedOrder,
  liveQuantityBySku,
  liveQuantityOfBuyers,
} from './db/orders-store.js';
import type { LifecycleOrderRow } from './db/orders-store.js';
import type { Pool, Queryable } from './db/pool.js';
import type { Logger } from './logger.js';
import type { Metrics } from './metrics.js';
import type { OrderMessage } from './model.js';
import { settleStock } from './order-lifecycle.js';
import type { RedisClient } from './scripts.js';

export const OVERSELL_PREVENTED = 'OVERSELL_PREVENTED';
export const BUYER_LIMIT_EXCEEDED = 'BUYER_LIMIT_EXCEEDED';
export type GuardReason = typeof OVERSELL_PREVENTED | typeof BUYER_LIMIT_EXCEEDED;

/** An order inserted live by this transaction. */
export interface GuardCandidate {
  orderId: string;
  reservationId: string;
  userId: string;
  skuId: string;
  quantity: number;
  /** The buyer slot Redis assigned (1..limitPerUser). */
  slot: number;
  reservedAt: number;
}

export interface GuardSku {
  stock: number;
  /** Live quantity including this transaction's inserts. */
  sold: number;
  limitPerUser: number;
}

/**
 * Which of the batch's new orders must be closed, and why. Pure: `held` is each (buyer, sku)
 * pair's live quantity including the candidates (keyed by buyerSkuKey). The buyer limit is applied
 * first (its closes also lower the SKU's sold), then the stock; in both, the newest reservations
 * of the batch are closed first.
 */
export function decideGuard(
  candidates: readonly GuardCandidate[],
  skus: ReadonlyMap<string, GuardSku>,
  held: ReadonlyMap<string, number>,
): Map<string, GuardReason> {
  const closes = new Map<string, GuardReason>();
  // A chunk can carry one reservation twice (a relay's re-publish, a gap repair's copy or a DLQ
  // replay in the same fetch): one order, weighed once. Counted twice, a buyer's excess would be
  // used up by one order's closes and an older order over the limit left live.
  const unique = [...new Map(candidates.map((c) => [c.orderId, c])).values()];
  const newestFirst = unique.sort(
    (a, b) => b.reservedAt - a.reservedAt || (a.reservationId < b.reservationId ? 1 : -1),
  );
  const sold = new Map([...skus].map(([s, v]) => [s, v.sold]));
  const excessOfBuyer = new Map<string, number>();
  for (const c of newestFirst) {
    const key = buyerSkuKey(c.userId, c.skuId);
    const sku = skus.get(c.skuId);
    if (!sku) continue;
    if (c.slot > sku.limitPerUser) {
      // A slot Redis never assigns (reserve-9.lua picks 1..limit): the slot key cannot bound it.
      closes.set(c.orderId, BUYER_LIMIT_EXCEEDED);
      sold.set(c.skuId, (sold.get(c.skuId) ?? 0) - c.quantity);
      continue;
    }
    const excess = excessOfBuyer.get(key) ?? (held.get(key) ?? 0) - sku.limitPerUser;
    if (excess > 0) {
      closes.set(c.orderId, BUYER_LIMIT_EXCEEDED);
      sold.set(c.skuId, (sold.get(c.skuId) ?? 0) - c.quantity);
      excessOfBuyer.set(key, excess - c.quantity);
    } else excessOfBuyer.set(key, excess);
  }
  for (const c of newestFirst) {
    if (closes.has(c.orderId)) continue;
    const sku = skus.get(c.skuId);
    if (!sku) continue;
    const now = sold.get(c.skuId) ?? 0;
    if (now > sku.stock) {
      closes.set(c.orderId, OVERSELL_PREVENTED);
      sold.set(c.skuId, now - c.quantity);
    }
  }
  return closes;
}

export interface GuardedOrder {
  order: LifecycleOrderRow;
  reason: GuardReason;
}

export interface StockGuardDeps {
  activityId: string;
  pool: Pool;
  redis: RedisClient;
  logger: Logger;
  metrics: Metrics;
  paymentTimeoutSeconds: number;
}

/** A failure to reach a dependency: retried by the consumer like a database outage. */
function transient(err: unknown, what: string): Error {
  return Object.assign(new Error(`${what}: ${(err as Error).message}`), { code: 'ECONNRESET' });
}

export class StockGuard {
  /** SKUs known to have their row (a row is never deleted while the activity consumes). */
  private readonly recorded = new Set<string>();

  constructor(private readonly d: StockGuardDeps) {}

  /**
   * Before the insert transaction: makes sure every SKU of the batch has its row. The operator
   * writes them from the spec before loading the cache; an activity loaded some other way gets
   * them once from the cache's loaded definition (its `initial` stock, which reservations never
   * change). A SKU known to neither is a bad message (DLQ).
   */
  async prepare(orders: readonly OrderMessage[]): Promise<void> {
    const wanted = [...new Set(orders.map((o) => o.skuId))].filter((s) => !this.recorded.has(s));
    if (wanted.length === 0) return;
    const missing = await missingSkus(this.d.pool, this.d.activityId, wanted);
    if (missing.length > 0) {
      let loaded;
      try {
        loaded = await readLoadedDefinition(this.d.redis, this.d.activityId);
      } catch (err) {
        throw transient(err, 'cache unreachable while recording the stock guard rows');
      }
      const items = (loaded?.items ?? []).filter((i) => missing.includes(i.skuId) && i.stock > 0);
      const unknown = missing.filter((s) => !items.some((i) => i.skuId === s));
      if (unknown.length > 0) {
        throw new Error(`sku ${unknown.join(', ')} is known neither to activity_skus nor to the cache`);
      }
      await recordActivitySkus(
        this.d.pool,
        this.d.activityId,
        items,
        'cache',
        await liveQuantityBySku(this.d.pool, this.d.activityId, missing),
      );
      this.d.logger.warn(
        { skus: missing },
        'stock guard rows recorded from the cache (the operator records them from the spec)',
      );
    }
    for (const s of wanted) {
      this.recorded.add(s);
      // The series exists from 0, so the alert's increase() sees the first prevented order.
      this.d.metrics.oversellPrevented.inc({ activity: this.d.activityId, sku: s }, 0);
    }
  }

  /**
   * In the insert transaction, after the inserts: closes the new orders beyond stock or limit and
   * journals why. `inserted` maps reservation id -> order id of the orders this transaction
   * inserted (redeliveries are not candidates: they were decided when first inserted).
   */
  async enforce(
    db: Queryable,
    orders: readonly OrderMessage[],
    inserted: ReadonlyMap<string, string>,
  ): Promise<GuardedOrder[]> {
    const candidates: GuardCandidate[] = [];
    for (const o of orders) {
      const orderId = inserted.get(o.reservationId);
      if (orderId) candidates.push({ orderId, ...o });
    }
    if (candidates.length === 0) return [];
    const skuIds = [...new Set(candidates.map((c) => c.skuId))].sort();
    const rows = await lockActivitySkus(db, this.d.activityId, skuIds);
    if (rows.length !== skuIds.length) {
      const have = new Set(rows.map((r) => r.skuId));
      throw new Error(`no activity_skus row for sku ${skuIds.filter((s) => !have.has(s)).join(', ')}`);
    }
    const skus = new Map(rows.map((r: ActivitySkuRow) => [r.skuId, r]));
    // With a limit of 1, an order of one unit in slot 1 cannot take its buyer over the limit: the
    // guard closes every order in a slot above the limit, so live orders of such a SKU are all in
    // slot 1, where the unique live-slot key (orders_live_buyer_slot) allows one. Only the other
    // buyers' live quantities are read.
    const pairs = new Map<string, GuardCandidate>();
    for (const c of candidates) {
      const provable = skus.get(c.skuId)?.limitPerUser === 1 && c.quantity === 1 && c.slot === 1;
      if (!provable) pairs.set(buyerSkuKey(c.userId, c.skuId), c);
    }
    const held = await liveQuantityOfBuyers(db, this.d.activityId, [...pairs.values()]);
    const decided = decideGuard(candidates, skus, held);
    if (decided.size === 0) return [];
    const closed = await closeUnpaidOrders(
      db,
      [...decided].map(([orderId, reason]) => ({ orderId, reason })),
    );
    await appendJournal(
      db,
      closed.map((o) => {
        const s = skus.get(o.skuId);
        return {
          activityId: o.activityId,
          reservationId: o.reservationId,
          orderId: o.id,
          event: 'ORDER_CLOSED',
          fromStatus: 'UNPAID',
          toStatus: 'CLOSED',
          traceId: o.traceId,
          detail: {
            reason: o.closeReason,
            guard: {
              stock: s?.stock,
              soldBefore: s?.sold,
              limitPerUser: s?.limitPerUser,
              buyerHeld: held.get(buyerSkuKey(o.userId, o.skuId)),
            },
          },
        };
      }),
    );
    return closed.map((order) => ({ order, reason: decided.get(order.id)! }));
  }

  /**
   * In the insert transaction: the reservations the database refused because another live order
   * holds their buyer slot (orders_live_buyer_slot). Redis gives a slot again only when it forgot
   * the reservation holding it, and with it that reservation's stock decrement, so such a
   * reservation is the buyer's limit exceeded exactly as the guard sees it: it is stored CLOSED
   * `BUYER_LIMIT_EXCEEDED` (a row the buyer's answer comes from) and released like the guard's
   * own closures, its unit withheld and the slot kept. Returns the orders closed by this call.
   */
  async closeSlotConflicts(
    db: Queryable,
    orders: readonly OrderMessage[],
    rejected: readonly string[],
  ): Promise<GuardedOrder[]> {
    const out: GuardedOrder[] = [];
    for (const rid of rejected) {
      const m = orders.find((o) => o.reservationId === rid);
      if (!m) continue;
      const row = await insertClosedOrder(db, m, BUYER_LIMIT_EXCEEDED, this.d.paymentTimeoutSeconds);
      if (!row) continue; // closed meanwhile by another path (order-gap repair), which settles it
      const holder = await findLiveSlotHolder(db, m.activityId, m.userId, m.skuId, m.slot);
      await appendJournal(db, [
        {
          activityId: row.activityId,
          reservationId: row.reservationId,
          orderId: row.id,
          event: 'ORDER_CLOSED',
          fromStatus: null,
          toStatus: 'CLOSED',
          traceId: row.traceId,
          detail: {
            reason: BUYER_LIMIT_EXCEEDED,
            guard: { slot: m.slot, slotHeldBy: holder?.reservationId },
          },
        },
      ]);
      out.push({ order: row, reason: BUYER_LIMIT_EXCEEDED });
    }
    return out;
  }

  /** After the commit: counts the closed orders and releases their reservations, units withheld (idempotent). */
  async compensate(guarded: readonly GuardedOrder[]): Promise<void> {
    if (guarded.length === 0) return;
    const a = this.d.activityId;
    for (const g of guarded) {
      this.d.metrics.oversellPrevented.inc({ activity: a, sku: g.order.skuId });
      this.d.metrics.ordersClosed.inc({ activity: a, reason: g.reason });
      this.d.metrics.orders.inc({ activity: a, status: 'CLOSED' });
    }
    this.d.logger.error(
      {
        orders: guarded.map((g) => ({
          orderId: g.order.id,
          reservationId: g.order.reservationId,
          sku: g.order.skuId,
          user: g.order.userId,
          quantity: g.order.quantity,
          reason: g.reason,
          traceId: g.order.traceId,
        })),
      },
      'OVERSELL PREVENTED: Redis accepted more than PostgreSQL allows; orders stored CLOSED',
    );
    // A failure here leaves the orders CLOSED and unsettled; the payment-timeout sweeper settles
    // them again after STOCK_SETTLE_GRACE_SECONDS.
    await settleStock(
      this.d,
      guarded.map((g) => g.order),
    ).catch((err: Error) =>
      this.d.logger.warn({ err: err.message }, 'compensation of guarded orders deferred to the sweeper'),
    );
  }
}
