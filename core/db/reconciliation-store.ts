/** Every query on `reconciliation_reports`: one row per reconciliation run of an activity. */
import type { Queryable } from './pool.js';

export type ReconciliationBasis = 'redis' | 'postgres' | 'skipped';

export interface Mismatch {
  check: string;
  expected: number;
  actual: number;
  detail?: string;
}

export interface ReconciliationReport {
  id: string;
  activityId: string;
  basis: ReconciliationBasis;
  ok: boolean;
  mismatches: Mismatch[];
  figures: Record<string, unknown>;
  createdAt: Date;
}

export async function insertReport(
  db: Queryable,
  r: { activityId: string; basis: ReconciliationBasis; ok: boolean; mismatches: Mismatch[]; figures: object },
): Promise<string> {
  const res = await db.query<{ id: string }>(
    `INSERT INTO reconciliation_reports (activity_id, basis, ok, mismatches, figures)
     VALUES ($1, $2, $3, $4::jsonb, $5::jsonb) RETURNING id`,
    [r.activityId, r.basis, r.ok, JSON.stringify(r.mismatches), JSON.stringify(r.figures)],
  );
  return res.rows[0]!.id;
}

export async function latestReports(
  db: Queryable,
  activityId: string,
  limit = 10,
): Promise<ReconciliationReport[]> {
  const res = await db.query<ReconciliationReport>(
    `SELECT id, activity_id AS "activityId", basis, ok, mismatches, figures, created_at AS "createdAt"
       FROM reconciliation_reports WHERE activity_id = $1 ORDER BY id DESC LIMIT $2`,
    [activityId, limit],
  );
  return res.rows;
}

/**
 * Deletes the activity's reports created more than `olderThanSeconds` ago, never its newest one (a
 * finished sale keeps its last verdict), at most `limit` a call; returns how many went. The
 * (activity_id, created_at) index serves it, so a call costs what it deletes.
 */
export async function purgeOldReports(
  db: Queryable,
  activityId: string,
  olderThanSeconds: number,
  limit = 1000,
): Promise<number> {
  const res = await db.query(
    `DELETE FROM reconciliation_reports WHERE id IN (
       SELECT id FROM reconciliation_reports
        WHERE activity_id = $1 AND created_at < now() - make_interval(secs => $2)
          AND id < (SELECT max(id) FROM reconciliation_reports WHERE activity_id = $1)
        ORDER BY created_at
        LIMIT $3)`,
    [activityId, olderThanSeconds, limit],
  );
  return res.rowCount ?? 0;
}
