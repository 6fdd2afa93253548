/**
 * Every query on `activity_registrations` (migration 15): the buyers who pre-registered for an
 * activity (docs/operator.md "Traffic shaping and eligibility"). The api's registration route
 * records a buyer here before it flags them in Redis, so the registration outlives a Redis that
 * lost its data: a cache restore flags every registered buyer again (core/cache-restore.ts).
 */
import type { Queryable } from './pool.js';

/** Records the buyer's registration; idempotent (a repeat keeps the first `registered_at`). */
export async function recordRegistration(db: Queryable, activityId: string, userId: string): Promise<void> {
  await db.query(
    `INSERT INTO activity_registrations (activity_id, user_id) VALUES ($1, $2)
     ON CONFLICT (activity_id, user_id) DO NOTHING`,
    [activityId, userId],
  );
}

/**
 * One page of the activity's registered buyers, in user id order after `afterUserId` (keyset
 * paging over the primary key: '' starts at the first).
 */
export async function registeredBuyers(
  db: Queryable,
  activityId: string,
  afterUserId: string,
  limit: number,
): Promise<string[]> {
  const res = await db.query<{ userId: string }>(
    `SELECT user_id AS "userId" FROM activity_registrations
      WHERE activity_id = $1 AND user_id > $2 ORDER BY user_id LIMIT $3`,
    [activityId, afterUserId, limit],
  );
  return res.rows.map((r) => r.userId);
}

/**
 * Deletes up to `limit` registrations of activities whose sale ended (`activity_registry.end_at`)
 * more than `olderThanSeconds` ago; returns how many went. A registration serves its sale only (the
 * api's eligibility check, and a cache restore re-flags registered buyers while the cache lives);
 * after the end it is a buyer's id kept for nothing but an audit, for as long as the operator of
 * the platform chooses (REGISTRATION_RETENTION_DAYS). The primary key serves the delete.
 */
export async function purgeEndedRegistrations(
  db: Queryable,
  olderThanSeconds: number,
  limit = 5000,
): Promise<number> {
  const res = await db.query(
    `DELETE FROM activity_registrations WHERE (activity_id, user_id) IN (
       SELECT r.activity_id, r.user_id
         FROM activity_registrations r JOIN activity_registry a ON a.activity_id = r.activity_id
        WHERE a.end_at < now() - make_interval(secs => $1)
        LIMIT $2)`,
    [olderThanSeconds, limit],
  );
  return res.rowCount ?? 0;
}
