/**
 * The jobs role's part (also run by the consumer role with JOBS_IN_CONSUMER): the gauges and
 * order-gap check (node-cron, JOBS_GAUGE_CRON), the after-sale jobs of the activity (payment
 * timeout, gap repair, stock audit) and its money jobs (refund worker, order-event relay). Every
 * one is safe with several replicas (jobs/*.ts).
 */
import cron from 'node-cron';
import { KAFKA_DISCONNECT_GRACE_MS, settlesWithin } from '../../core/deadline.js';
import { idempotentProducer, RenewingProducer, topicsFor } from '../../core/kafka.js';
import type { AfterSaleConfig, JobsConfig } from '../config.js';
import { scheduleAfterSaleJobs } from '../jobs/after-sale.js';
import { gaugeSampler } from '../jobs/gauges.js';
import { startMoneyJobs } from '../jobs/money.js';
import { providersFromEnv } from '../payments/hmac-provider.js';
import type { Closer, DatabaseClient, KafkaClient, RoleContext } from './process.js';

export async function startJobs(
  ctx: RoleContext,
  cfg: JobsConfig,
  { pool, kafka }: DatabaseClient & KafkaClient,
): Promise<Closer[]> {
  const { logger, metrics, redis } = ctx;
  const activityId = cfg.ACTIVITY_ID;
  const topics = topicsFor(activityId, cfg.KAFKA_TOPIC_PREFIX);
  const admin = kafka.admin();
  await admin.connect();
  const sampleGauges = gaugeSampler({
    activityId,
    redis,
    pool,
    admin,
    topics,
    metrics,
    gapThresholdSeconds: cfg.ORDER_GAP_THRESHOLD_SECONDS,
  });
  const gauges = cron.schedule(
    cfg.JOBS_GAUGE_CRON,
    async () => {
      const r = await sampleGauges();
      metrics.jobRuns.inc({ task: 'gauges', result: r.failed.length === 0 ? 'ok' : 'error' });
      for (const f of r.failed) logger.warn({ sampler: f.sampler, err: f.error }, 'gauge sampler failed');
    },
    { name: `gauges-${activityId}`, noOverlap: true },
  );
  // Replaced after a failed send: its sends are rare, its producer id is the kind a broker forgets.
  const gapProducer = new RenewingProducer(() => idempotentProducer(kafka));
  await gapProducer.connect();
  const afterSale = scheduleAfterSaleJobs({
    cfg,
    activityId,
    topic: topics.orders,
    redis,
    pool,
    logger,
    metrics,
    producer: gapProducer,
    stockAck: ctx.reservationAck,
  });
  return [
    await startMoneyJobsOf(ctx, cfg, { pool, kafka }, activityId),
    { stage: 'jobs', name: 'gauges', close: async () => gauges.stop() },
    { stage: 'jobs', name: 'after-sale jobs', close: () => afterSale.stop() },
    {
      stage: 'jobs',
      name: 'gap repair producer',
      close: () => settlesWithin(gapProducer.disconnect(), KAFKA_DISCONNECT_GRACE_MS),
    },
    {
      stage: 'jobs',
      name: 'jobs kafka admin',
      close: () => settlesWithin(admin.disconnect(), KAFKA_DISCONNECT_GRACE_MS),
    },
  ];
}

/**
 * The money jobs (refund worker, order-event relay) of one activity, or (`undefined`) of every
 * activity: the after-sale role's run for as long as orders live.
 */
export async function startMoneyJobsOf(
  { logger, metrics }: RoleContext,
  cfg: JobsConfig | AfterSaleConfig,
  { pool, kafka }: DatabaseClient & KafkaClient,
  activityId: string | undefined,
): Promise<Closer> {
  const money = await startMoneyJobs({
    cfg,
    activityId,
    pool,
    logger,
    metrics,
    kafka,
    providers: providersFromEnv(cfg),
  });
  return { stage: 'jobs', name: 'money jobs', close: () => money.stop() };
}
