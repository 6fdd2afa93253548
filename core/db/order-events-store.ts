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
 *
 * Two statements whose plans cannot go wrong, instead of one with an anti-join: right after a
 * burst the statistics still say that no event is unpublished (the last ANALYZE saw them all
 * published), so the partial indexes on `published_at IS NULL` look empty, and the planner chose
 * to scan one of them whole for every candidate row: 9.4 s per claim with 100,000 events waiting,
 * a core of PostgreSQL for as long as the backlog lasted (docs/benchmarks.md, "Order events after
 * a burst"). First the head of the queue: the oldest unpublished ids, which the partial indexes
 * give in order. An order's earlier event has a smaller id (its transaction committed before the
 * later event's began), so it is in the head whenever a later one is: which events are their
 * order's oldest is decided from the head alone. Then those events are locked by primary key; the
 * statement names no `published_at` condition, so no partial index matches it, and an event
 * another relay published meanwhile is dropped after the lock.
 */
export async function claimPublishableEvents(
  db: Queryable,
  activityId: string | undefined,
  limit: number,
): Promise<OutboxEvent[]> {
  // The head comes from a partial index in its own order, whatever the statistics say: a sort is
  // never cheaper here. One activity's condition is written as a range (the same rows as an
  // equality: text comparison falls back to the bytes on a tie) so that its index (activity_id, id)
  // is the only one that gives the order; with an equality the planner orders by id alone, takes
  // the index of all activities and walks past their events (migration 9). The setting ends with
  // the caller's transaction. Several relays read the same head and skip each other's locked rows:
  // a head of four batches leaves work for up to four at once.
  await db.query('SET LOCAL enable_sort = off');
  const head = await db.query<{ id: string; orderId: string; seq: number }>(
    activityId === undefined
      ? `SELECT id, order_id::text AS "orderId", seq FROM order_events
          WHERE published_at IS NULL
          ORDER BY id
          LIMIT $1`
      : `SELECT id, order_id::text AS "orderId", seq FROM order_events
          WHERE published_at IS NULL AND activity_id >= $2 AND activity_id <= $2
          ORDER BY activity_id, id
          LIMIT $1`,
    activityId === undefined ? [limit * 4] : [limit * 4, activityId],
  );
  const firstSeq = new Map<string, number>();
  for (const e of head.rows) firstSeq.set(e.orderId, Math.min(e.seq, firstSeq.get(e.orderId) ?? e.seq));
  const eligible = head.rows.filter((e) => e.seq === firstSeq.get(e.orderId)).map((e) => e.id);
  if (eligible.length === 0) return [];
  const res = await db.query<OutboxEvent & { pending: boolean }>(
    `SELECT e.id, e.order_id::text AS "orderId", e.seq, e.activity_id AS "activityId",
            e.published_at IS NULL AS pending,
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
      WHERE e.id = ANY($1::bigint[])
      ORDER BY e.id
      LIMIT $2
      FOR UPDATE OF e SKIP LOCKED`,
    [eligible, limit],
  );
  return res.rows.filter((e) => e.pending).map(({ pending: _pending, ...event }) => event);
}

/**
 * Marks events published (an event published before keeps its time). No `published_at IS NULL`
 * in the WHERE clause: it would let the planner pick a partial index that stale statistics show
 * as empty and scan it whole for the ids (see claimPublishableEvents); by primary key it is one
 * lookup per id.
 */
export async function markEventsPublished(db: Queryable, ids: string[]): Promise<void> {
  if (ids.length === 0) return;
  await db.query(
    `UPDATE order_events SET published_at = coalesce(published_at, now()) WHERE id = ANY($1::bigint[])`,
    [ids],
  );
}

/**
 * The relay's backlog (of one activity, or all): unpublished events and the age of the oldest
 * (0 when none), in one pass over the unpublished rows.
 */
export async function eventBacklog(
  db: Queryable,
  activityId: string | undefined,
): Promise<{ unpublished: number; oldestAgeSeconds: number }> {
  const res = await db.query<{ n: string; age: number | null }>(
    `SELECT count(*)::text AS n, extract(epoch FROM now() - min(created_at))::float8 AS age
       FROM order_events
      WHERE published_at IS NULL AND ($1::text IS NULL OR activity_id = $1)`,
    [activityId ?? null],
  );
  const row = res.rows[0];
  return { unpublished: Number(row?.n ?? 0), oldestAgeSeconds: Math.max(0, row?.age ?? 0) };
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
