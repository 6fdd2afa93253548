/**
 * Every query on `activity_claims`: which FlashSaleActivity owns an activity id. The first claim
 * wins (the primary key and the unique topic key decide, not the caller); a claim is never
 * handed over, so an id's Redis keys, Kafka topics and rows belong to one resource for good.
 */
import type { Queryable } from './pool.js';

export interface ActivityClaim {
  activityId: string;
  ownerUid: string;
  ownerNamespace: string;
  ownerName: string;
  claimedAt: Date;
}

export interface Claimant {
  uid: string;
  namespace: string;
  name: string;
}

/**
 * Kafka treats `.` and `_` in topic names as the same character (its metric names), so two ids
 * differing only there would collide as topics: both map to one topic key.
 */
export function topicKeyOf(activityId: string): string {
  return activityId.replace(/_/g, '.');
}

const COLUMNS = `activity_id AS "activityId", owner_uid AS "ownerUid", owner_namespace AS "ownerNamespace",
                 owner_name AS "ownerName", claimed_at AS "claimedAt"`;

/**
 * Claims `activityId` for `claimant` unless it (or an id sharing its topic key) is claimed
 * already; returns the claim that holds, whoever made it. Idempotent: the owner claiming again
 * gets its own claim back.
 */
export async function claimActivityId(
  db: Queryable,
  activityId: string,
  claimant: Claimant,
): Promise<ActivityClaim> {
  const topicKey = topicKeyOf(activityId);
  const inserted = await db.query<ActivityClaim>(
    `INSERT INTO activity_claims (activity_id, topic_key, owner_uid, owner_namespace, owner_name)
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING ${COLUMNS}`,
    [activityId, topicKey, claimant.uid, claimant.namespace, claimant.name],
  );
  if (inserted.rows[0]) return inserted.rows[0];
  const held = await db.query<ActivityClaim>(
    `SELECT ${COLUMNS} FROM activity_claims WHERE activity_id = $1 OR topic_key = $2
      ORDER BY (activity_id = $1) DESC LIMIT 1`,
    [activityId, topicKey],
  );
  const claim = held.rows[0];
  // Only an unused claim is ever deleted (releaseUnusedClaim); racing that, the pass is retried.
  if (!claim) throw new Error(`activity id ${activityId}: claim conflict but no claim found`);
  return claim;
}

export async function readClaim(db: Queryable, activityId: string): Promise<ActivityClaim | undefined> {
  const res = await db.query<ActivityClaim>(`SELECT ${COLUMNS} FROM activity_claims WHERE activity_id = $1`, [
    activityId,
  ]);
  return res.rows[0];
}

/**
 * Gives up a claim that was never used: only its owner, and only while the resource had not
 * begun warming up (nothing of the id exists anywhere yet). A deleted Pending resource so does
 * not keep a user-chosen id from being used again.
 */
export async function releaseUnusedClaim(db: Queryable, activityId: string, ownerUid: string): Promise<void> {
  await db.query('DELETE FROM activity_claims WHERE activity_id = $1 AND owner_uid = $2', [
    activityId,
    ownerUid,
  ]);
}
