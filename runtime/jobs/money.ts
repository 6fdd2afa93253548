/**
 * Starts the money-side background work of a process: the refund worker (node-cron) and the
 * order-event relay (a loop over the PostgreSQL outbox). One start function, independent of the
 * role that calls it: an activity's jobs process passes its activity id; a platform-level
 * after-sale process passes none and serves every activity. Both are safe with any number of
 * replicas (see refunds.ts and order-events.ts).
 */
import type { Kafka } from 'kafkajs';
import type { Pool } from '../../core/db/pool.js';
import { ensureOrderEventsTopic, idempotentProducer, orderEventsTopic } from '../../core/kafka.js';
import type { Logger } from '../../core/logger.js';
import type { Metrics } from '../../core/metrics.js';
import type { RefundProvider } from '../../core/payment-provider.js';
import { OrderEventRelay } from './order-events.js';
import type { OrderEventRelayConfig } from './order-events.js';
import { startRefundWorker } from './refunds.js';
import type { RefundWorkerConfig } from './refunds.js';

export interface MoneyJobsConfig extends RefundWorkerConfig, OrderEventRelayConfig {
  ORDER_EVENTS_RELAY: boolean;
  ORDER_EVENTS_PARTITIONS: number;
  KAFKA_TOPIC_PREFIX: string;
  KAFKA_REPLICATION_FACTOR: number;
  KAFKA_MIN_INSYNC_REPLICAS?: number | undefined;
}

export interface MoneyJobsDeps {
  cfg: MoneyJobsConfig;
  /** undefined = every activity. */
  activityId: string | undefined;
  pool: Pool;
  logger: Logger;
  metrics: Metrics;
  kafka: Kafka;
  providers: RefundProvider[];
}

export async function startMoneyJobs(d: MoneyJobsDeps): Promise<{ stop: () => Promise<void> }> {
  const refunds = startRefundWorker({
    cfg: d.cfg,
    activityId: d.activityId,
    pool: d.pool,
    logger: d.logger,
    metrics: d.metrics,
    providers: d.providers,
  });
  let relay: OrderEventRelay | undefined;
  if (d.cfg.ORDER_EVENTS_RELAY) {
    const topic = orderEventsTopic(d.cfg.KAFKA_TOPIC_PREFIX);
    relay = new OrderEventRelay({
      cfg: d.cfg,
      activityId: d.activityId,
      topic,
      pool: d.pool,
      logger: d.logger,
      metrics: d.metrics,
      createProducer: () => idempotentProducer(d.kafka),
      // In the relay's loop, not before it: Kafka away or the topic refused holds the events in
      // PostgreSQL, never the refund worker started beside it.
      prepareTopic: async (stopping) => {
        const admin = d.kafka.admin();
        // The relay stops without waiting for this: let go of a connection Kafka has not answered.
        const letGo = (): void => void admin.disconnect().catch(() => undefined);
        stopping.addEventListener('abort', letGo, { once: true });
        try {
          await admin.connect();
          await ensureOrderEventsTopic(admin, topic, d.cfg.ORDER_EVENTS_PARTITIONS, {
            replicationFactor: d.cfg.KAFKA_REPLICATION_FACTOR,
            minInsyncReplicas: d.cfg.KAFKA_MIN_INSYNC_REPLICAS,
          });
        } finally {
          stopping.removeEventListener('abort', letGo);
          await admin.disconnect();
        }
      },
    });
    await relay.start();
  }
  return {
    stop: async () => {
      await refunds.stop();
      await relay?.stop();
    },
  };
}
