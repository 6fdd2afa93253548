/** Every query on `activity_registry` (migration 3): the sale windows the operator registered. */
import type { Queryable } from './pool.js';

export interface RegisteredActivity {
  activityId: string;
  /** `<namespace>/<name>` of the custom resource. */
  owner: string;
  ownerUid: string;
  startAt: Date;
  endAt: Date;
}

/**
 * Records (or moves) an activity's sale window. Idempotent; a row registered by another resource
 * (same activity id, other uid) is left alone and reported as not registered.
 */
export async function registerActivity(db: Queryable, a: RegisteredActivity): Promise<boolean> {
  const res = await db.query(
    `INSERT INTO activity_registry (activity_id, owner, owner_uid, start_at, end_at)
     VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (activity_id) DO UPDATE SET start_at = EXCLUDED.start_at, end_at = EXCLUDED.end_at,
            owner = EXCLUDED.owner, updated_at = now()
      WHERE activity_registry.owner_uid = EXCLUDED.owner_uid`,
    [a.activityId, a.owner, a.ownerUid, a.startAt, a.endAt],
  );
  return res.rowCount === 1;
}

/**
 * Removes the sale window `ownerUid` registered, and only that one: a resource deleted before its
 * warm-up leaves nothing of the id behind, so the next resource that names it registers its own
 * window (registerActivity leaves a row of another uid alone). Idempotent.
 */
export async function unregisterActivity(db: Queryable, activityId: string, ownerUid: string): Promise<void> {
  await db.query(`DELETE FROM activity_registry WHERE activity_id = $1 AND owner_uid = $2`, [
    activityId,
    ownerUid,
  ]);
}

export async function findRegisteredActivity(
  db: Queryable,
  activityId: string,
): Promise<RegisteredActivity | undefined> {
  const res = await db.query<RegisteredActivity>(
    `SELECT activity_id AS "activityId", owner, owner_uid AS "ownerUid", start_at AS "startAt", end_at AS "endAt"
       FROM activity_registry WHERE activity_id = $1`,
    [activityId],
  );
  return res.rows[0];
}

export type SaleWindowPosition = 'unknown' | 'before-start' | 'open' | 'ended';

/** Where the database clock stands in the activity's registered window (one clock for every replica). */
export async function saleWindowPosition(db: Queryable, activityId: string): Promise<SaleWindowPosition> {
  const res = await db.query<{ position: SaleWindowPosition }>(
    `SELECT CASE WHEN now() < start_at THEN 'before-start' WHEN now() >= end_at THEN 'ended' ELSE 'open' END
              AS position
       FROM activity_registry WHERE activity_id = $1`,
    [activityId],
  );
  return res.rows[0]?.position ?? 'unknown';
}
