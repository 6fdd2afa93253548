/**
 * An order message checked against the activity's own item (from PostgreSQL, activity_items): the
 * message is never trusted. The consumer dead-letters a refused message at once and never retries
 * it; order-gap repair asks the same question before it re-publishes a reservation, since a
 * refused copy would only add a dead letter (runtime/jobs/gap-repair.ts).
 */
import type { ActivityItem } from './db/activity-items-store.js';
import type { OrderMessage } from './order-message.js';
import { reservationIdFor } from './reservations.js';

/** Why a message is refused: a stable reason (the DLQ's `dlq-reason` header) and its detail. */
export type Refusal = [reason: string, detail: string];

/** Whole cents of a decimal string with at most two places ("19.9" -> 1990n). */
function cents(price: string): bigint | undefined {
  const m = /^(\d{1,12})(?:\.(\d{1,2}))?$/.exec(price);
  if (!m) return undefined;
  return BigInt(m[1]!) * 100n + BigInt((m[2] ?? '').padEnd(2, '0'));
}

/** The reason the message is refused against its item, or undefined when it fits. */
export function refusalOf(o: OrderMessage, item: ActivityItem | undefined): Refusal | undefined {
  if (!item) return ['unknown_sku', `sku ${o.skuId} is not an item of activity ${o.activityId}`];
  if (o.reservationId !== reservationIdFor(o.activityId, o.userId, o.requestId)) {
    return ['reservation_id', 'the reservation id is not derived from its buyer and requestId'];
  }
  const price = cents(o.unitPrice);
  if (price === undefined || price !== cents(item.price)) {
    return ['price', `unit price ${o.unitPrice} differs from the item's price ${item.price}`];
  }
  if (o.quantity < 1 || o.quantity > item.limitPerUser) {
    return ['quantity', `quantity ${o.quantity} outside 1..${item.limitPerUser} (limit per buyer)`];
  }
  if (o.slot < 1 || o.slot > item.limitPerUser) {
    return ['slot', `slot ${o.slot} outside 1..${item.limitPerUser} (limit per buyer)`];
  }
  return undefined;
}
