/**
 * The after-sale role's own part (beside the buyer API of every activity, roles/api.ts): the
 * settlement sweeper over every activity with due orders, and refunds and order events of every
 * activity, for as long as orders live: an activity's own jobs stop when its runtime is scaled to
 * zero at Completed (docs/after-sale.md "The after-sale tier").
 */
import type { AfterSaleConfig } from '../config.js';
import { scheduleRegistrationPurge, scheduleSettlementSweeper } from '../jobs/after-sale.js';
import { startMoneyJobsOf } from './jobs.js';
import type { Closer, DatabaseClient, KafkaClient, RoleContext } from './process.js';

export async function startAfterSaleWork(
  ctx: RoleContext,
  cfg: AfterSaleConfig,
  { pool, kafka }: DatabaseClient & KafkaClient,
): Promise<Closer[]> {
  const { logger, metrics, redis } = ctx;
  const sweeper = scheduleSettlementSweeper({
    cfg,
    redis,
    pool,
    logger,
    metrics,
    stockAck: ctx.reservationAck,
  });
  const purge = scheduleRegistrationPurge({ cfg, pool, logger, metrics });
  return [
    await startMoneyJobsOf(ctx, cfg, { pool, kafka }, undefined),
    { stage: 'jobs', name: 'settlement sweeper', close: () => sweeper.stop() },
    { stage: 'jobs', name: 'registration purge', close: () => purge.stop() },
  ];
}
