/**
 * The refund worker (docs/after-sale.md "Refunds"): drives REFUND_PENDING -> REFUNDING -> REFUNDED.
 *
 * Each run:
 *   1. takes surplus payments (REFUND_PENDING) for refund: payment REFUNDING + a PENDING refund
 *      row whose refund id is committed before any provider call (core/refunds.ts);
 *   2. claims due PENDING refunds one at a time, each just before its call (FOR UPDATE SKIP
 *      LOCKED; the claim itself schedules the next attempt with exponential backoff, never sooner
 *      than the call timeout, so it doubles as the lease of that call), up to REFUND_BATCH_SIZE per
 *      run, and calls the provider with the refund's fixed id;
 *   3. records the answer: succeeded -> completeRefund; processing -> wait (the notification or
 *      the next attempt tells); rejected -> FAILED for a human; unreachable -> next attempt.
 * A SIGKILL anywhere leaves the row PENDING with its id: the next attempt sends the same id and
 * the provider, which deduplicates by it, refunds once. Several replicas are safe (SKIP LOCKED,
 * conditional updates, the unique (provider, trade_no) key of refunds).
 *
 * `activityId` undefined serves every activity (a platform-level after-sale process).
 */
import cron from 'node-cron';
import { crashPoint } from '../../core/crash.js';
import { findRefundPendingPayments } from '../../core/db/payments-store.js';
import type { Pool } from '../../core/db/pool.js';
import {
  claimDueRefunds,
  failedRefunds,
  noteRefundAttempt,
  refundBacklog,
} from '../../core/db/refunds-store.js';
import type { Logger } from '../../core/logger.js';
import type { Metrics } from '../../core/metrics.js';
import { completeRefund, enqueuePaymentRefund, failRefund } from '../../core/refunds.js';
import type { RefundAnswer, RefundProvider } from '../../core/payment-provider.js';
import { storableText } from '../../core/db/storable-text.js';

export interface RefundWorkerConfig {
  REFUND_WORKER_CRON: string;
  REFUND_BATCH_SIZE: number;
  REFUND_RETRY_BASE_SECONDS: number;
  REFUND_RETRY_MAX_SECONDS: number;
  REFUND_PROVIDER_TIMEOUT_MS: number;
}

export interface RefundWorkerDeps {
  cfg: RefundWorkerConfig;
  /** undefined = every activity. */
  activityId: string | undefined;
  pool: Pool;
  logger: Logger;
  metrics: Metrics;
  providers: RefundProvider[];
}

export interface RefundRunReport {
  enqueued: number;
  attempted: number;
  succeeded: number;
  processing: number;
  failed: number;
  retried: number;
}

export async function runRefundWorker(d: RefundWorkerDeps): Promise<RefundRunReport> {
  const report: RefundRunReport = {
    enqueued: 0,
    attempted: 0,
    succeeded: 0,
    processing: 0,
    failed: 0,
    retried: 0,
  };
  const providers = new Map(d.providers.map((p) => [p.name, p]));
  const deps = { pool: d.pool, logger: d.logger, metrics: d.metrics };

  for (const p of await findRefundPendingPayments(d.pool, d.activityId, d.cfg.REFUND_BATCH_SIZE)) {
    if (await enqueuePaymentRefund(deps, p)) report.enqueued += 1;
  }

  const backoff = {
    baseSeconds: d.cfg.REFUND_RETRY_BASE_SECONDS,
    maxSeconds: d.cfg.REFUND_RETRY_MAX_SECONDS,
    minSeconds: Math.ceil(d.cfg.REFUND_PROVIDER_TIMEOUT_MS / 1000) + 1,
  };
  // One refund claimed at a time, right before its call: the claim is the lease of that one call
  // (never shorter than the call timeout), so every call starts and ends within its own lease. A
  // batch claimed at once leases every row from the same instant while its calls run one after
  // another: later calls would start after their lease ran out, when another worker may claim and
  // send the same refund concurrently.
  for (let n = 0; n < d.cfg.REFUND_BATCH_SIZE; n += 1) {
    const [r] = await claimDueRefunds(d.pool, d.activityId, 1, backoff);
    if (!r) break;
    report.attempted += 1;
    const log = { refundId: r.refundId, orderId: r.orderId, attempt: r.attempts, traceId: r.traceId };
    const provider = providers.get(r.provider);
    if (!provider) {
      await noteRefundAttempt(
        d.pool,
        r.refundId,
        null,
        `no refund provider named ${r.provider} is configured`,
      );
      d.logger.warn(log, `no refund provider named ${r.provider}; the refund waits`);
      report.retried += 1;
      d.metrics.refunds.inc({ activity: r.activityId, outcome: 'retried' });
      continue;
    }
    let answer: RefundAnswer;
    try {
      answer = storableAnswer(
        await provider.refund({
          refundId: r.refundId,
          orderId: r.orderId,
          tradeNo: r.tradeNo,
          amount: r.amount,
          reason: r.reason,
        }),
      );
    } catch (err) {
      const message = storableText((err as Error).message, 500);
      await noteRefundAttempt(d.pool, r.refundId, null, message);
      d.logger.warn({ ...log, err: message }, 'refund call failed; retried with the same refund id');
      report.retried += 1;
      d.metrics.refunds.inc({ activity: r.activityId, outcome: 'retried' });
      continue;
    }
    crashPoint('refund-after-provider-answer');
    if (answer.status === 'succeeded') {
      await completeRefund(deps, r.refundId, answer, r.traceId);
      report.succeeded += 1;
    } else if (answer.status === 'processing') {
      await noteRefundAttempt(d.pool, r.refundId, answer.providerStatus, null);
      report.processing += 1;
      d.metrics.refunds.inc({ activity: r.activityId, outcome: 'retried' });
    } else {
      await failRefund(deps, r.refundId, answer, r.traceId);
      report.failed += 1;
    }
  }

  // What is owed, from PostgreSQL on every run (a state, not an event): the FAILED refunds stay
  // counted until a human has them retried, however long ago the provider refused them.
  const failed = await failedRefunds(d.pool, d.activityId);
  if (d.activityId && !failed.some((b) => b.activityId === d.activityId)) {
    d.metrics.refundsFailed.set({ activity: d.activityId }, 0);
  }
  if (!d.activityId) d.metrics.refundsFailed.reset();
  for (const b of failed) d.metrics.refundsFailed.set({ activity: b.activityId }, b.failed);

  const backlog = await refundBacklog(d.pool, d.activityId);
  if (d.activityId && !backlog.some((b) => b.activityId === d.activityId)) {
    d.metrics.refundPendingOldestAge.set({ activity: d.activityId }, 0);
  }
  if (!d.activityId) d.metrics.refundPendingOldestAge.reset();
  for (const b of backlog)
    d.metrics.refundPendingOldestAge.set({ activity: b.activityId }, b.oldestAgeSeconds);
  if (report.enqueued + report.attempted > 0)
    d.logger.info({ activity: d.activityId, ...report }, 'refund run');
  return report;
}

/** Schedules the worker with node-cron (noOverlap); returns its stop function. */
export function startRefundWorker(d: RefundWorkerDeps): { stop: () => Promise<void> } {
  const task = cron.schedule(
    d.cfg.REFUND_WORKER_CRON,
    async () => {
      try {
        await runRefundWorker(d);
        d.metrics.jobRuns.inc({ task: 'refunds', result: 'ok' });
      } catch (err) {
        d.metrics.jobRuns.inc({ task: 'refunds', result: 'error' });
        d.logger.warn({ job: 'refunds', err: (err as Error).message }, 'job failed');
      }
    },
    { name: `refunds-${d.activityId ?? 'all'}`, noOverlap: true },
  );
  return {
    stop: async () => {
      await task.stop();
    },
  };
}

/**
 * The provider's answer as PostgreSQL can store it (its status, refund number and error go to
 * `refunds` and the journal): a NUL or a half surrogate pair in a gateway's error page or a signed
 * `message` would otherwise fail every write of the answer, and the refund would be retried for
 * ever, never FAILED, nobody paged.
 */
function storableAnswer(a: RefundAnswer): RefundAnswer {
  switch (a.status) {
    case 'succeeded':
      return {
        ...a,
        providerStatus: storableText(a.providerStatus, 64),
        providerRefundNo: a.providerRefundNo === null ? null : storableText(a.providerRefundNo, 128),
      };
    case 'processing':
      return { ...a, providerStatus: storableText(a.providerStatus, 64) };
    case 'rejected':
      return { ...a, providerStatus: storableText(a.providerStatus, 64), error: storableText(a.error, 500) };
  }
}
