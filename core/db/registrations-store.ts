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
