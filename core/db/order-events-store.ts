/**
 * Every query on `order_events`, the transactional outbox of order events (migration 4,
 * docs/order-events.md). Rows are written only by the triggers on `orders`, in the transaction
 * of the state change; this store reads, marks and purges them.
 */
import type { Queryable } from './pool.js';

export interface OutboxEvent {
  id: string;
  orderId: string;
  seq: number;
  activityId: string;
  /** The event as published (JSON text; docs/order-events.md). */
  payload: string;
}

/**
 * Locks up to `limit` unpublished events that are each the oldest unpublished event of their
 * order, oldest first (FOR UPDATE SKIP LOCKED). Call inside a transaction and keep it open until
 * Kafka acknowledged them: a later event of an order becomes eligible only once the earlier one
 * is marked published (committed), so any number of relays publish each order's events in order.
 * No cursor over `id`: ids are allocated before commit, so a cursor would skip late commits.
 */
export async function claimPublishableEvents(
  db: Queryable,
  activityId: string | undefined,
  limit: number,
): Promise<OutboxEvent[]> {
  const res = await db.query<OutboxEvent>(
    `SELECT e.id, e.order_id::text AS "orderId", e.seq, e.activity_id AS "activityId",
            json_build_object(
              'eventId', e.order_id::text || '-' || e.seq::text,
              'type', CASE WHEN e.from_status IS NULL AND e.to_status = 'UNPAID' THEN 'ORDER_CREATED'
                           ELSE 'ORDER_' || e.to_status END,
              'seq', e.seq,
              'orderId', e.order_id::text,
              'reservationId', o.reservation_id,
              'activityId', e.activity_id,
              'userId', o.user_id,
              'skuId', o.sku_id,
              'quantity', o.quantity,
              'amount', o.amount::text,
              'fromStatus', e.from_status,
              'status', e.to_status,
              -- CLOSED is terminal, so the order's close reason is the one this event set.
              'closeReason', CASE WHEN e.to_status = 'CLOSED' THEN o.close_reason END,
              'traceId', o.trace_id,
              'occurredAt', to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
            )::text AS payload
       FROM order_events e JOIN orders o ON o.id = e.order_id
      WHERE e.published_at IS NULL AND ($1::text IS NULL OR e.activity_id = $1)
        AND NOT EXISTS (SELECT 1 FROM order_events p
                         WHERE p.order_id = e.order_id AND p.seq < e.seq AND p.published_at IS NULL)
      ORDER BY e.id
      LIMIT $2
      FOR UPDATE OF e SKIP LOCKED`,
    [activityId ?? null, limit],
  );
  return res.rows;
}

export async function markEventsPublished(db: Queryable, ids: string[]): Promise<number> {
  if (ids.length === 0) return 0;
  const res = await db.query(
    `UPDATE order_events SET published_at = now() WHERE id = ANY($1::bigint[]) AND published_at IS NULL`,
    [ids],
  );
  return res.rowCount ?? 0;
}

/** Unpublished events (of one activity, or all). */
export async function unpublishedEvents(db: Queryable, activityId: string | undefined): Promise<number> {
  const res = await db.query<{ n: string }>(
    `SELECT count(*)::text AS n FROM order_events
      WHERE published_at IS NULL AND ($1::text IS NULL OR activity_id = $1)`,
    [activityId ?? null],
  );
  return Number(res.rows[0]?.n ?? 0);
}

/** Deletes up to `limit` events published more than `retentionSeconds` ago. */
export async function purgePublishedEvents(
  db: Queryable,
  retentionSeconds: number,
  limit: number,
): Promise<number> {
  const res = await db.query(
    `DELETE FROM order_events WHERE id IN (
       SELECT id FROM order_events
        WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1)
        LIMIT $2)`,
    [retentionSeconds, limit],
  );
  return res.rowCount ?? 0;
}

/** An order's events, oldest first (tests, the DLQ-style tooling). */
export async function eventsForOrder(
  db: Queryable,
  orderId: string,
): Promise<{ seq: number; toStatus: string; published: boolean }[]> {
  const res = await db.query<{ seq: number; toStatus: string; published: boolean }>(
    `SELECT seq, to_status AS "toStatus", published_at IS NOT NULL AS published
       FROM order_events WHERE order_id = $1 ORDER BY seq`,
    [orderId],
  );
  return res.rows;
}
