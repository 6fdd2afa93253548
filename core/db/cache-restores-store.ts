/**
 * Every query on `cache_restores`: one row per restore of an activity's Redis cache from
 * PostgreSQL (core/cache-restore.ts, operator/reconcile/restore-cache.ts). The row is the restore's
 * durable state: its step moves forward only by a conditional UPDATE on the expected step, so an
 * operator killed at any line finds the restore where the last committed step left it.
 */
import { inTransaction } from './pool.js';
import type { Pool, PoolClient, Queryable } from './pool.js';

export type RestoreReason = 'CacheEmpty' | 'CacheBehind';
export type RestoreStep = 'detected' | 'paused' | 'drained' | 'reloaded' | 'resumed';

/** The order of the steps; a restore never moves backwards. */
export const RESTORE_STEPS: readonly RestoreStep[] = ['detected', 'paused', 'drained', 'reloaded', 'resumed'];

/** What the detection found, per SKU: Redis's units taken vs PostgreSQL's live units. */
export interface RestoreDivergence {
  /** Redis's meta when detected: absent (empty), or its generation and epoch. */
  redis: { present: boolean; generation?: number; epoch?: number };
  /** The epoch PostgreSQL expects the cache to carry (the last completed restore, 0 = none). */
  expectedEpoch: number;
  skus: { skuId: string; redisTaken: number | null; postgresLive: number }[];
}

/** What the reload wrote, per SKU (initial − live orders − in-flight reservations). */
export interface RestoreReload {
  skus: { skuId: string; initial: number; live: number; inFlight: number; remaining: number }[];
  orders: number;
  /** (buyer, SKU) pairs whose held quantity and slots were rewritten. */
  buyers: number;
  /**
   * Reservations rebuilt `RESERVED` from the snapshot whose orders were paid by the time the
   * reload had written them, marked `PAID` after it (core/cache-restore.ts markPaidSinceSnapshot).
   */
  paidDuringReload: number;
}

export interface CacheRestoreRow {
  activityId: string;
  epoch: number;
  reason: RestoreReason;
  step: RestoreStep;
  divergence: RestoreDivergence;
  reloaded: RestoreReload | Record<string, never>;
  detectedAt: Date;
  pausedAt: Date | null;
  drainedAt: Date | null;
  reloadedAt: Date | null;
  resumedAt: Date | null;
  /** Seconds since the gate was paused, by the database clock (null before the pause). */
  pausedForSeconds: number | null;
}

const COLUMNS = `activity_id AS "activityId", epoch, reason, step, divergence, reloaded,
  detected_at AS "detectedAt", paused_at AS "pausedAt", drained_at AS "drainedAt",
  reloaded_at AS "reloadedAt", resumed_at AS "resumedAt",
  extract(epoch FROM now() - paused_at)::float8 AS "pausedForSeconds"`;

/** The restore in progress (any step before `resumed`), if there is one. */
export async function openRestore(db: Queryable, activityId: string): Promise<CacheRestoreRow | undefined> {
  const res = await db.query<CacheRestoreRow>(
    `SELECT ${COLUMNS} FROM cache_restores WHERE activity_id = $1 AND step <> 'resumed'`,
    [activityId],
  );
  return res.rows[0];
}

/** The epoch of the last reload that reached the cache (0 when the cache was never restored). */
export async function lastReloadedEpoch(db: Queryable, activityId: string): Promise<number> {
  const res = await db.query<{ epoch: number | null }>(
    `SELECT max(epoch) AS epoch FROM cache_restores
      WHERE activity_id = $1 AND step IN ('reloaded', 'resumed')`,
    [activityId],
  );
  return res.rows[0]?.epoch ?? 0;
}

/** The advisory lock of an activity's restores' opening (a 64-bit hash of its id; a clash only waits). */
const RESTORE_FENCE = `hashtextextended('cache_restores:' || $1, 0)`;

/**
 * Holds off the opening of a restore of the activity until the caller's transaction ends (a shared
 * lock; beginRestore takes it exclusively). A late payment that takes its unit back in Redis holds
 * it from before it checks for an open restore until it commits: either it sees the restore and
 * takes nothing, or the restore opens only after its commit, so the reload's snapshot (taken
 * after the opening) counts the order PAID. Without it a payment whose Redis step ran just before
 * the cache was lost, committed after the reload read PostgreSQL: the unit sold in PostgreSQL
 * and on sale again in the restored cache.
 */
export async function holdOffRestores(c: PoolClient, activityId: string): Promise<void> {
  await c.query(`SELECT pg_advisory_xact_lock_shared(${RESTORE_FENCE})`, [activityId]);
}

/** The next restore's row (epoch = the highest so far + 1), unless one is open; under RESTORE_FENCE. */
async function insertNextRestore(
  c: PoolClient,
  activityId: string,
  reason: RestoreReason,
  divergence: RestoreDivergence,
): Promise<void> {
  await c.query(
    `INSERT INTO cache_restores (activity_id, epoch, reason, divergence)
     SELECT $1, coalesce(max(epoch), 0) + 1, $2, $3::jsonb FROM cache_restores WHERE activity_id = $1
     ON CONFLICT DO NOTHING`,
    [activityId, reason, JSON.stringify(divergence)],
  );
}

/**
 * Opens the next restore (epoch = the highest so far + 1) unless one is open already, and returns
 * the open one either way: two operators racing here end up with the same row. The opening waits
 * for every transaction that holds off restores (holdOffRestores) to end.
 */
export async function beginRestore(
  pool: Pool,
  activityId: string,
  reason: RestoreReason,
  divergence: RestoreDivergence,
): Promise<CacheRestoreRow> {
  await inTransaction(pool, async (c) => {
    await c.query(`SELECT pg_advisory_xact_lock(${RESTORE_FENCE})`, [activityId]);
    await insertNextRestore(c, activityId, reason, divergence);
  });
  const open = await openRestore(pool, activityId);
  if (!open) throw new Error(`no open cache restore for ${activityId} after opening one`);
  return open;
}

/**
 * Moves the restore from `from` to the next step (and records its instant and, for `reloaded`,
 * what was written). False when the row was not at `from` any more (another pass moved it).
 */
export async function advanceRestore(
  db: Queryable,
  activityId: string,
  epoch: number,
  from: Exclude<RestoreStep, 'resumed'>,
  reloaded?: RestoreReload,
): Promise<boolean> {
  const to = RESTORE_STEPS[RESTORE_STEPS.indexOf(from) + 1]!;
  const at = `${to}_at`;
  const res = await db.query(
    `UPDATE cache_restores SET step = $4, ${at} = now(),
            reloaded = CASE WHEN $5::jsonb IS NULL THEN reloaded ELSE $5::jsonb END
      WHERE activity_id = $1 AND epoch = $2 AND step = $3`,
    [activityId, epoch, from, to, reloaded ? JSON.stringify(reloaded) : null],
  );
  return (res.rowCount ?? 0) === 1;
}

/** Every restore of the activity, newest first (reconciliation reports them). */
export async function restoresOf(db: Queryable, activityId: string, limit = 20): Promise<CacheRestoreRow[]> {
  const res = await db.query<CacheRestoreRow>(
    `SELECT ${COLUMNS} FROM cache_restores WHERE activity_id = $1 ORDER BY epoch DESC LIMIT $2`,
    [activityId, limit],
  );
  return res.rows;
}

/**
 * Closes restore `epoch` at `reloaded` (its reload gone before its resume was recorded) and opens
 * the next one, in one transaction: at no moment is the cache, holding only the hold's paused gate,
 * without an open restore (the stock returns, late payments and the audit wait for one).
 * Returns the open restore either way (another pass may have done it).
 */
export async function supersedeRestore(
  pool: Pool,
  activityId: string,
  epoch: number,
  divergence: RestoreDivergence,
): Promise<CacheRestoreRow> {
  await inTransaction(pool, async (c) => {
    await c.query(`SELECT pg_advisory_xact_lock(${RESTORE_FENCE})`, [activityId]);
    if (!(await advanceRestore(c, activityId, epoch, 'reloaded'))) return;
    await insertNextRestore(c, activityId, 'CacheEmpty', divergence);
  });
  const open = await openRestore(pool, activityId);
  if (!open) throw new Error(`no open cache restore for ${activityId} after superseding ${epoch}`);
  return open;
}
