/**
 * The consumer role's part: Kafka -> PostgreSQL (consumer/consumer.ts). It joins its group in the
 * background: whatever the process runs beside it (gauges, order-gap check and repair) must run
 * while it joins, which can take as long as the session timeout of a member that died. `started`
 * settles once it consumes or failed to connect at all; the caller awaits it after starting the
 * rest, so such a failure still ends the process (its restart is the recovery).
 */
import { KAFKA_METADATA_MAX_AGE_MS, RenewingProducer, idempotentProducer } from '../../core/kafka.js';
import type { TopicNames } from '../../core/kafka.js';
import type { ConsumerConfig } from '../config.js';
import { OrderConsumer } from '../consumer/consumer.js';
import type { Closer, DatabaseClient, KafkaClient, RoleContext } from './process.js';

export function startConsumer(
  ctx: RoleContext,
  cfg: ConsumerConfig,
  { pool, kafka }: DatabaseClient & KafkaClient,
  topics: TopicNames,
): { started: Promise<void>; closers: Closer[] } {
  const consumer = new OrderConsumer({
    activityId: cfg.ACTIVITY_ID,
    topic: topics.orders,
    dlqTopic: topics.dlq,
    createConsumer: () =>
      kafka.consumer({
        groupId: topics.consumerGroup,
        allowAutoTopicCreation: false,
        maxBytesPerPartition: cfg.CONSUMER_FETCH_MAX_BYTES_PER_PARTITION,
        sessionTimeout: cfg.CONSUMER_SESSION_TIMEOUT_MS,
        heartbeatInterval: cfg.CONSUMER_HEARTBEAT_INTERVAL_MS,
        rebalanceTimeout: cfg.CONSUMER_REBALANCE_TIMEOUT_MS,
        // Partitions added to the topic mid-sale are seen (and the group re-balanced over them)
        // within this age instead of kafkajs' 5 minutes, while the relay already writes to them.
        metadataMaxAge: KAFKA_METADATA_MAX_AGE_MS,
      }),
    // Replaced after a failed send: dead letters are rare, so its producer id is the kind a broker
    // forgets (core/kafka.ts RenewingProducer), and a producer kept after that would fail the
    // partition's every chunk that has a dead letter until the pod restarts.
    dlqProducer: new RenewingProducer(() => idempotentProducer(kafka)),
    pool,
    redis: ctx.redis,
    metrics: ctx.metrics,
    logger: ctx.logger,
    batchSize: cfg.CONSUMER_BATCH_SIZE,
    partitionConcurrency: cfg.CONSUMER_PARTITION_CONCURRENCY,
    maxAttempts: cfg.CONSUMER_MAX_ATTEMPTS,
    paymentTimeoutSeconds: cfg.PAYMENT_TIMEOUT_SECONDS,
  });
  ctx.readiness.report('consumer', () => consumer.status());
  const started = consumer.start();
  // Awaited by the caller once the rest is started; until then a failure must not go unhandled.
  started.catch(() => undefined);
  return {
    started,
    // Finishes the chunk in flight (its transaction, results and offsets) before it stops.
    closers: [{ stage: 'work', name: 'order consumer', close: () => consumer.stop() }],
  };
}
