/**
 * Every query on `activity_registry` (migrations 3 and 14): the sale windows the operator
 * registered, with the loaded generation's order-code and reopen-on-release settings.
 */
import type { Queryable } from './pool.js';

export interface RegisteredActivity {
  activityId: string;
  /** `<namespace>/<name>` of the custom resource. */
  owner: string;
  ownerUid: string;
  startAt: Date;
  endAt: Date;
  /** As loaded; undefined for a row registered before migration 14. */
  requireOrderCode?: boolean | undefined;
  reopenOnRelease?: boolean | undefined;
}

/**
 * Records (or moves) an activity's sale window and settings. Idempotent; a row registered by
 * another resource (same activity id, other uid) is left alone and reported as not registered.
 */
export async function registerActivity(
  db: Queryable,
  a: RegisteredActivity & { requireOrderCode: boolean; reopenOnRelease: boolean },
): Promise<boolean> {
  const res = await db.query(
    `INSERT INTO activity_registry (activity_id, owner, owner_uid, start_at, end_at, require_order_code, reopen_on_release)
     VALUES ($1, $2, $3, $4, $5, $6, $7)
     ON CONFLICT (activity_id) DO UPDATE SET start_at = EXCLUDED.start_at, end_at = EXCLUDED.end_at,
            require_order_code = EXCLUDED.require_order_code, reopen_on_release = EXCLUDED.reopen_on_release,
            owner = EXCLUDED.owner, updated_at = now()
      WHERE activity_registry.owner_uid = EXCLUDED.owner_uid`,
    [a.activityId, a.owner, a.ownerUid, a.startAt, a.endAt, a.requireOrderCode, a.reopenOnRelease],
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
  const res = await db.query<
    Omit<RegisteredActivity, 'requireOrderCode' | 'reopenOnRelease'> & {
      requireOrderCode: boolean | null;
      reopenOnRelease: boolean | null;
    }
  >(
    `SELECT activity_id AS "activityId", owner, owner_uid AS "ownerUid", start_at AS "startAt", end_at AS "endAt",
            require_order_code AS "requireOrderCode", reopen_on_release AS "reopenOnRelease"
       FROM activity_registry WHERE activity_id = $1`,
    [activityId],
  );
  const row = res.rows[0];
  if (!row) return undefined;
  return {
    ...row,
    requireOrderCode: row.requireOrderCode ?? undefined,
    reopenOnRelease: row.reopenOnRelease ?? undefined,
  };
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
