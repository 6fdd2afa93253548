/**
 * The relay role's part: RELAY_CONCURRENCY relay loops over the activity's outbox, each a named
 * stream consumer with its own blocking Redis connection and Kafka producer (relay/relay.ts).
 * Expects the activity's topics to exist (roles/process.ts waitForActivityTopics).
 */
import { hostname } from 'node:os';
import { idempotentProducer } from '../../core/kafka.js';
import type { TopicNames } from '../../core/kafka.js';
import type { RelayConfig } from '../config.js';
import { Relay } from '../relay/relay.js';
import type { Closer, KafkaClient, RoleContext } from './process.js';

export async function startRelays(
  ctx: RoleContext,
  cfg: RelayConfig,
  { kafka }: KafkaClient,
  topics: TopicNames,
): Promise<{ relays: Relay[]; closers: Closer[] }> {
  const baseName = cfg.RELAY_CONSUMER_NAME ?? hostname();
  const relays: Relay[] = [];
  const stops: (() => Promise<void>)[] = [];
  for (let i = 0; i < cfg.RELAY_CONCURRENCY; i += 1) {
    const blocking = ctx.connectRedis(`relay-blocking-reads-${i}`, { maxRetriesPerRequest: null });
    const relay = new Relay({
      activityId: cfg.ACTIVITY_ID,
      topic: topics.orders,
      redis: ctx.redis,
      blockingRedis: blocking,
      createProducer: () => idempotentProducer(kafka),
      metrics: ctx.metrics,
      logger: ctx.logger,
      batchSize: cfg.RELAY_BATCH_SIZE,
      ordersPerMessage: cfg.RELAY_ORDERS_PER_MESSAGE,
      reclaimIdleMs: cfg.RELAY_RECLAIM_IDLE_MS,
      consumerName: `${baseName}-${i}`,
    });
    relays.push(relay);
    stops.push(async () => {
      await relay.stop();
      blocking.disconnect();
    });
  }
  // Side by side: a loop's start connects its Kafka producer, which waits out the connection
  // timeout when the bootstrap broker it meets first stalls (frozen, cut off); one after the other,
  // the loops' waits would add up before the role is ready.
  await Promise.all(relays.map((relay) => relay.start()));
  // Each loop finishes its batch in flight (Kafka acknowledged, entries deleted) before it stops,
  // or lets it go after RELAY_STOP_GRACE_MS when Kafka does not answer: all at once, so that the
  // loops' graces do not add up past SHUTDOWN_TIMEOUT_MS.
  const closers: Closer[] = [
    { stage: 'work', name: 'relay loops', close: () => Promise.all(stops.map((stop) => stop())) },
  ];
  return { relays, closers };
}

/** The outbox gauges of a relay process that runs no jobs (the jobs' gauges include them). */
export function sampleRelayGauges(relay: Relay): Closer {
  const timer = setInterval(() => void relay.sampleGauges().catch(() => undefined), 1000);
  return { stage: 'jobs', name: 'outbox gauges', close: async () => clearInterval(timer) };
}
