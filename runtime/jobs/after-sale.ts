/**
 * Schedules the after-sale jobs of one activity with node-cron (noOverlap: a run never starts
 * while the previous one is still going): the payment-timeout sweeper, order-gap repair and the
 * stock audit (stock-audit.ts). Runs in the roles that run jobs (runtime/roles/jobs.ts). Every
 * replica may run them: the sweeper's SKIP LOCKED batches, the conditional settlement and the
 * bounded re-publication claims make concurrent runs safe.
 */
import type { Sender } from '../../core/kafka.js';
import cron from 'node-cron';
import type { Pool } from '../../core/db/pool.js';
import type { Logger } from '../../core/logger.js';
import { stockReturnsFromZero } from '../../core/metrics.js';
import type { Metrics } from '../../core/metrics.js';
import type { ReservationAck } from '../../core/durable-ack.js';
import type { RedisClient } from '../../core/scripts.js';
import { activitiesWithAfterSaleWork } from '../../core/db/orders-store.js';
import { purgeEndedRegistrations } from '../../core/db/registrations-store.js';
import { checkOrderGap, GapPage } from './gauges.js';
import { repairOrderGap } from './gap-repair.js';
import { sweepExpiredOrders } from './payment-timeout.js';
import { auditStock } from './stock-audit.js';

export interface AfterSaleJobsConfig {
  PAYMENT_TIMEOUT_SECONDS: number;
  PAYMENT_SWEEP_CRON: string;
  PAYMENT_SWEEP_BATCH_SIZE: number;
  PAYMENT_SWEEP_MAX_BATCHES: number;
  STOCK_SETTLE_GRACE_SECONDS: number;
  ORDER_GAP_REPAIR: boolean;
  ORDER_GAP_THRESHOLD_SECONDS: number;
  ORDER_GAP_REPUBLISH_INTERVAL_SECONDS: number;
  ORDER_GAP_MAX_REPUBLISH: number;
  JOBS_GAUGE_CRON: string;
  RECONCILIATION_CRON: string;
  RECONCILIATION_REPORT_RETENTION_DAYS: number;
}

export interface AfterSaleJobsDeps {
  cfg: AfterSaleJobsConfig;
  activityId: string;
  topic: string;
  redis: RedisClient;
  pool: Pool;
  logger: Logger;
  metrics: Metrics;
  /** Connected idempotent producer for order-gap re-publication. */
  producer: Sender;
  /** How durable a stock return to Redis must be before it is recorded (LifecycleDeps.stockAck). */
  stockAck?: ReservationAck | undefined;
}

/**
 * A cron task's body: runs `fn` and counts the run in flashsale_job_runs_total{task, result}; a
 * failure is logged and the task goes on at its next tick.
 */
function countedRun(
  d: { logger: Logger; metrics: Metrics },
  name: string,
  fn: () => Promise<unknown>,
): () => Promise<void> {
  return async () => {
    try {
      await fn();
      d.metrics.jobRuns.inc({ task: name, result: 'ok' });
    } catch (err) {
      d.metrics.jobRuns.inc({ task: name, result: 'error' });
      d.logger.warn({ job: name, err: (err as Error).message }, 'job failed');
    }
  };
}

export function scheduleAfterSaleJobs(d: AfterSaleJobsDeps): { stop: () => Promise<void> } {
  const { cfg, activityId } = d;
  const base = lifecycleDepsOf(d);
  stockReturnsFromZero(d.metrics, activityId);
  const job = (name: string, fn: () => Promise<unknown>) => countedRun(d, name, fn);
  const tasks = [
    cron.schedule(
      cfg.PAYMENT_SWEEP_CRON,
      job('payment-timeout', () => sweepActivity(d, activityId)),
      { name: `payment-timeout-${activityId}`, noOverlap: true },
    ),
    cron.schedule(
      cfg.RECONCILIATION_CRON,
      // The task label stays `reconciliation`: it is a series of flashsale_job_runs_total.
      job('reconciliation', () =>
        auditStock({ ...base, activityId, reportRetentionDays: cfg.RECONCILIATION_REPORT_RETENTION_DAYS }),
      ),
      { name: `reconciliation-${activityId}`, noOverlap: true },
    ),
  ];
  if (cfg.ORDER_GAP_REPAIR) {
    const gapPage = new GapPage();
    tasks.push(
      cron.schedule(
        cfg.JOBS_GAUGE_CRON,
        job('order-gap-repair', async () => {
          const gap = await checkOrderGap(
            {
              activityId,
              redis: d.redis,
              pool: d.pool,
              gapThresholdSeconds: cfg.ORDER_GAP_THRESHOLD_SECONDS,
            },
            Date.now(),
            gapPage,
          );
          if (gap.missing.length === 0) return;
          await repairOrderGap(
            {
              ...base,
              activityId,
              topic: d.topic,
              producer: d.producer,
              republishIntervalSeconds: cfg.ORDER_GAP_REPUBLISH_INTERVAL_SECONDS,
              maxRepublish: cfg.ORDER_GAP_MAX_REPUBLISH,
            },
            gap.missing,
          );
        }),
        { name: `order-gap-repair-${activityId}`, noOverlap: true },
      ),
    );
  }
  return {
    stop: async () => {
      for (const t of tasks) await t.stop();
    },
  };
}

export interface SettlementSweeperDeps {
  cfg: Pick<
    AfterSaleJobsConfig,
    | 'PAYMENT_TIMEOUT_SECONDS'
    | 'PAYMENT_SWEEP_CRON'
    | 'PAYMENT_SWEEP_BATCH_SIZE'
    | 'PAYMENT_SWEEP_MAX_BATCHES'
    | 'STOCK_SETTLE_GRACE_SECONDS'
  >;
  redis: RedisClient;
  pool: Pool;
  logger: Logger;
  metrics: Metrics;
  /** How durable a stock return to Redis must be before it is recorded (LifecycleDeps.stockAck). */
  stockAck?: ReservationAck | undefined;
}

/** What every order-lifecycle job of the role is given: its clients and the payment timeout. */
function lifecycleDepsOf(d: SettlementSweeperDeps) {
  return {
    pool: d.pool,
    redis: d.redis,
    logger: d.logger,
    metrics: d.metrics,
    paymentTimeoutSeconds: d.cfg.PAYMENT_TIMEOUT_SECONDS,
    stockAck: d.stockAck,
  };
}

/**
 * One activity's payment-timeout sweep with the role's figures: the per-activity job and the
 * platform-level sweeper run the same sweep.
 */
function sweepActivity(d: SettlementSweeperDeps, activityId: string): ReturnType<typeof sweepExpiredOrders> {
  const { cfg } = d;
  return sweepExpiredOrders({
    ...lifecycleDepsOf(d),
    activityId,
    batchSize: cfg.PAYMENT_SWEEP_BATCH_SIZE,
    maxBatches: cfg.PAYMENT_SWEEP_MAX_BATCHES,
    settleGraceSeconds: cfg.STOCK_SETTLE_GRACE_SECONDS,
  });
}

/**
 * The platform-level after-sale role's sweeper: on PAYMENT_SWEEP_CRON, every activity that has
 * UNPAID orders past their deadline or closed orders whose stock is not settled (one indexed
 * query) is swept like the per-activity sweeper does. It outlives the activity's own Deployments,
 * so orders are closed and their stock returned (to PostgreSQL after write-back) until the
 * activity is settled. Safe beside the per-activity sweepers (SKIP LOCKED, conditional updates).
 */
export function scheduleSettlementSweeper(d: SettlementSweeperDeps): { stop: () => Promise<void> } {
  const task = cron.schedule(
    d.cfg.PAYMENT_SWEEP_CRON,
    countedRun(d, 'settlement-sweep', async () => {
      const { failed } = await sweepEveryActivity(d);
      if (failed.length > 0) {
        throw new Error(
          `${failed.length} activit${failed.length === 1 ? 'y' : 'ies'} not swept: ${failed.join(', ')}`,
        );
      }
    }),
    { name: 'settlement-sweep', noOverlap: true },
  );
  return { stop: async () => void (await task.stop()) };
}

/**
 * One run of the platform sweeper: every activity with after-sale work, each on its own. One that
 * fails (its Redis slot unreachable, say) is logged and retried next run; the activities after
 * it are swept all the same.
 */
export async function sweepEveryActivity(
  d: SettlementSweeperDeps,
): Promise<{ swept: string[]; failed: string[] }> {
  const activities = await activitiesWithAfterSaleWork(d.pool, d.cfg.STOCK_SETTLE_GRACE_SECONDS);
  const swept: string[] = [];
  const failed: string[] = [];
  for (const activityId of activities) {
    // From 0 once this role first sees the activity: its orders settle a grace period after they
    // close (STOCK_SETTLE_GRACE_SECONDS), so the series is scraped at 0 before they count.
    stockReturnsFromZero(d.metrics, activityId);
    try {
      await sweepActivity(d, activityId);
      swept.push(activityId);
    } catch (err) {
      failed.push(activityId);
      d.logger.warn(
        { activity: activityId, err: (err as Error).message },
        'settlement sweep of this activity failed; the others go on, it is retried next run',
      );
    }
  }
  return { swept, failed };
}

/** Most registrations one purge run deletes (REGISTRATION_PURGE_BATCH at a time): the rest next run. */
const REGISTRATION_PURGE_BATCHES = 20;
const REGISTRATION_PURGE_BATCH = 5000;

/**
 * Deletes the registrations of sales that ended more than `retentionDays` ago (0 keeps all), a
 * bounded number of batches a call; returns how many went. Safe on every replica at once (a row
 * deleted twice is deleted once).
 */
export async function purgeRegistrations(pool: Pool, retentionDays: number): Promise<number> {
  if (retentionDays <= 0) return 0;
  let purged = 0;
  for (let batch = 0; batch < REGISTRATION_PURGE_BATCHES; batch += 1) {
    const n = await purgeEndedRegistrations(pool, retentionDays * 86_400, REGISTRATION_PURGE_BATCH);
    purged += n;
    if (n < REGISTRATION_PURGE_BATCH) break;
  }
  return purged;
}

/**
 * The platform-level after-sale role's registration purge, on RECONCILIATION_CRON: the
 * registrations of every sale that ended more than REGISTRATION_RETENTION_DAYS ago.
 */
export function scheduleRegistrationPurge(d: {
  cfg: { RECONCILIATION_CRON: string; REGISTRATION_RETENTION_DAYS: number };
  pool: Pool;
  logger: Logger;
  metrics: Metrics;
}): { stop: () => Promise<void> } {
  const task = cron.schedule(
    d.cfg.RECONCILIATION_CRON,
    countedRun(d, 'registration-purge', async () => {
      const purged = await purgeRegistrations(d.pool, d.cfg.REGISTRATION_RETENTION_DAYS);
      if (purged > 0) {
        d.logger.info(
          { job: 'registration-purge', purged, retentionDays: d.cfg.REGISTRATION_RETENTION_DAYS },
          'deleted the registrations of ended sales',
        );
      }
    }),
    { name: 'registration-purge', noOverlap: true },
  );
  return { stop: async () => void (await task.stop()) };
}
