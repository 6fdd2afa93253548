/**
 * Every query on `order_gap_repairs`: bounds how often a reservation with no order is re-published
 * (spaced out, at most N times), whatever number of job replicas run the repair.
 */
import type { Queryable } from './pool.js';

export type GapClaim = { claimed: true; attempt: number } | { claimed: false; attempts: number };

/**
 * Claims the next re-publication of a reservation: succeeds when it was never re-published, or
 * the last attempt is older than `intervalSeconds` and fewer than `maxAttempts` were made.
 */
export async function claimRepublish(
  db: Queryable,
  activityId: string,
  reservationId: string,
  intervalSeconds: number,
  maxAttempts: number,
): Promise<GapClaim> {
  const res = await db.query<{ attempts: number }>(
    `INSERT INTO order_gap_repairs AS g (activity_id, reservation_id, attempts, last_action)
     VALUES ($1, $2, 1, 'republished')
     ON CONFLICT (activity_id, reservation_id) DO UPDATE
        SET attempts = g.attempts + 1, last_action = 'republished', last_at = now()
      WHERE g.attempts < $4 AND g.last_at <= now() - make_interval(secs => $3)
     RETURNING attempts`,
    [activityId, reservationId, intervalSeconds, maxAttempts],
  );
  const row = res.rows[0];
  if (row) return { claimed: true, attempt: row.attempts };
  const cur = await db.query<{ attempts: number }>(
    'SELECT attempts FROM order_gap_repairs WHERE activity_id = $1 AND reservation_id = $2',
    [activityId, reservationId],
  );
  return { claimed: false, attempts: cur.rows[0]?.attempts ?? 0 };
}

/**
 * Gives back a claimed re-publication whose send failed (brokers away): it does not count against
 * the cap, so an outage longer than the cap times the interval does not abandon the reservation.
 * `last_at` stays, so the next attempt still waits the interval. Conditional on the attempt being
 * the last one claimed: a later claim by another replica is never undone. A process killed
 * between the claim and the send keeps the attempt used (the cap stays an upper bound).
 */
export async function releaseRepublishClaim(
  db: Queryable,
  activityId: string,
  reservationId: string,
  attempt: number,
): Promise<boolean> {
  const res = await db.query(
    `UPDATE order_gap_repairs SET attempts = attempts - 1, last_action = 'send-failed'
      WHERE activity_id = $1 AND reservation_id = $2 AND attempts = $3`,
    [activityId, reservationId, attempt],
  );
  return (res.rowCount ?? 0) > 0;
}

/** Records a final action (compensated, abandoned) for a reservation. */
export async function recordGapAction(
  db: Queryable,
  activityId: string,
  reservationId: string,
  action: string,
): Promise<void> {
  await db.query(
    `INSERT INTO order_gap_repairs AS g (activity_id, reservation_id, attempts, last_action)
     VALUES ($1, $2, 0, $3)
     ON CONFLICT (activity_id, reservation_id) DO UPDATE SET last_action = $3, last_at = now()`,
    [activityId, reservationId, action],
  );
}

/**
 * Claims the return in PostgreSQL of a ledger entry's stock once the sale is frozen: true for the
 * one call that claims it, false ever after. Run in the transaction that returns the stock, so a
 * return that rolls back gives its claim back.
 */
export async function claimFrozenReturn(
  db: Queryable,
  activityId: string,
  reservationId: string,
): Promise<boolean> {
  const res = await db.query(
    `INSERT INTO order_gap_repairs AS g (activity_id, reservation_id, attempts, last_action)
     VALUES ($1, $2, 0, 'returned-in-postgres')
     ON CONFLICT (activity_id, reservation_id) DO UPDATE SET last_action = 'returned-in-postgres', last_at = now()
       WHERE g.last_action <> 'returned-in-postgres'
     RETURNING 1`,
    [activityId, reservationId],
  );
  return (res.rowCount ?? 0) > 0;
}

export async function gapRepairOf(
  db: Queryable,
  activityId: string,
  reservationId: string,
): Promise<{ attempts: number; lastAction: string } | undefined> {
  const res = await db.query<{ attempts: number; lastAction: string }>(
    `SELECT attempts, last_action AS "lastAction" FROM order_gap_repairs
      WHERE activity_id = $1 AND reservation_id = $2`,
    [activityId, reservationId],
  );
  return res.rows[0];
}
