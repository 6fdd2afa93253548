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
