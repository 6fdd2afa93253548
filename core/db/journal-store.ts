/** Every query on the `order_journal` table (docs/sources seed 003's flow table). */
import type { Queryable } from './pool.js';

export interface JournalEntry {
  activityId: string;
  reservationId: string;
  orderId?: string | null;
  event: string;
  fromStatus?: string | null;
  toStatus?: string | null;
  traceId?: string;
  detail?: Record<string, unknown>;
}

/**
 * The journal rows of orders that a data-modifying WITH query has just inserted, as that query's
 * sub-statement (orders-store.ts insertOrders): `relation` has the columns id, reservation_id,
 * activity_id and trace_id; `eventParam` and `toStatusParam` are the query's parameters ($n).
 */
export function journalOfInsertedSql(relation: string, eventParam: string, toStatusParam: string): string {
  return `INSERT INTO order_journal (activity_id, reservation_id, order_id, event, to_status, trace_id)
     SELECT activity_id, reservation_id, id, ${eventParam}::text, ${toStatusParam}::text, trace_id
       FROM ${relation} ORDER BY id`;
}

export async function appendJournal(db: Queryable, entries: JournalEntry[]): Promise<void> {
  if (entries.length === 0) return;
  await db.query(
    `INSERT INTO order_journal (activity_id, reservation_id, order_id, event, from_status, to_status, trace_id, detail)
     SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
                          $8::jsonb[])`,
    [
      entries.map((e) => e.activityId),
      entries.map((e) => e.reservationId),
      entries.map((e) => e.orderId ?? null),
      entries.map((e) => e.event),
      entries.map((e) => e.fromStatus ?? null),
      entries.map((e) => e.toStatus ?? null),
      entries.map((e) => e.traceId ?? ''),
      entries.map((e) => JSON.stringify(e.detail ?? {})),
    ],
  );
}

export async function journalFor(
  db: Queryable,
  reservationId: string,
): Promise<{ event: string; toStatus: string | null; traceId: string }[]> {
  const res = await db.query<{ event: string; toStatus: string | null; traceId: string }>(
    `SELECT event, to_status AS "toStatus", trace_id AS "traceId" FROM order_journal
      WHERE reservation_id = $1 ORDER BY id`,
    [reservationId],
  );
  return res.rows;
}

/** A buyer's cancellation recorded before its submission reached the cache, with no order since. */
export interface CancelledBeforeReservation {
  id: string;
  reservationId: string;
  userId: string;
}

/**
 * The cancel markers a cache restore puts back (core/cache-restore.ts), a page at a time by
 * journal id: the activity's `CANCELLED_BEFORE_RESERVATION` rows whose reservation has no order.
 * Rows journalled without the buyer (before it was recorded) cannot be put back and are left out.
 */
export async function cancellationsBeforeReservation(
  db: Queryable,
  activityId: string,
  afterId: string,
  limit: number,
): Promise<CancelledBeforeReservation[]> {
  const res = await db.query<CancelledBeforeReservation>(
    `SELECT j.id::text AS id, j.reservation_id AS "reservationId", j.detail->>'userId' AS "userId"
       FROM order_journal j
      WHERE j.activity_id = $1 AND j.event = 'CANCELLED_BEFORE_RESERVATION' AND j.id > $2::bigint
        AND j.detail ? 'userId'
        AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.reservation_id = j.reservation_id)
      ORDER BY j.id LIMIT $3`,
    [activityId, afterId, limit],
  );
  return res.rows;
}
