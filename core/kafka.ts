/** Kafka topic names, topic creation and consumer lag, shared by relay, consumer and operator. */
import { Kafka, Partitioners, logLevel } from 'kafkajs';
import type { Admin, Producer } from 'kafkajs';

export interface TopicNames {
  orders: string;
  dlq: string;
  consumerGroup: string;
}

/** One topic per activity keeps activities apart; its DLQ sits beside it. */
export function topicsFor(activityId: string, prefix = 'flashsale'): TopicNames {
  return {
    orders: `${prefix}.orders.${activityId}`,
    dlq: `${prefix}.orders.${activityId}.dlq`,
    consumerGroup: `${prefix}-orders-${activityId}`,
  };
}

export function createKafka(brokers: string[], clientId: string): Kafka {
  return new Kafka({
    clientId,
    brokers,
    logLevel: logLevel.WARN,
    retry: { retries: 8, initialRetryTime: 200 },
  });
}

/**
 * An idempotent producer (acks from all in-sync replicas, one request in flight). Retries are
 * unbounded as kafkajs requires for its idempotence guarantee: during a broker outage a send
 * waits instead of failing, and the half messages simply stay in the outbox.
 */
export function idempotentProducer(kafka: Kafka): Producer {
  return kafka.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    allowAutoTopicCreation: false,
    createPartitioner: Partitioners.DefaultPartitioner,
    retry: { retries: Number.MAX_SAFE_INTEGER, initialRetryTime: 200, maxRetryTime: 5_000 },
  });
}

export async function ensureTopics(
  admin: Admin,
  topics: TopicNames,
  partitions: number,
  replicationFactor: number,
): Promise<string[]> {
  const existing = new Set(await admin.listTopics());
  const wanted = [topics.orders, topics.dlq].filter((t) => !existing.has(t));
  if (wanted.length === 0) return [];
  await admin.createTopics({
    waitForLeaders: true,
    topics: wanted.map((topic) => ({
      topic,
      numPartitions: topic === topics.dlq ? 1 : partitions,
      replicationFactor,
      configEntries: [{ name: 'min.insync.replicas', value: String(Math.max(1, replicationFactor - 1)) }],
    })),
  });
  return wanted;
}

/**
 * Resolves once the brokers list every topic of `names`, polling with a delay growing to
 * `maxDelayMs`: a role started before the operator created its activity's topics (at warm-up)
 * waits here instead of failing. `onWaiting` is called once, with what is missing, the first time
 * something is; a failed listing (brokers still away) counts as missing. Returns false when
 * `stopped()` became true first.
 */
export async function waitForTopics(
  admin: Admin,
  names: readonly string[],
  opts: { onWaiting?: (missing: string[]) => void; stopped?: () => boolean; maxDelayMs?: number } = {},
): Promise<boolean> {
  for (let attempt = 0; ; attempt += 1) {
    if (opts.stopped?.()) return false;
    const listed = await admin.listTopics().catch((): string[] => []);
    const missing = names.filter((n) => !listed.includes(n));
    if (missing.length === 0) return true;
    if (attempt === 0) opts.onWaiting?.(missing);
    const delay = Math.min(250 * 2 ** attempt, opts.maxDelayMs ?? 5_000);
    await new Promise((resolve) => setTimeout(resolve, delay));
  }
}

/** Messages in `topic` not yet committed by `groupId` (high watermark minus committed offset). */
export async function consumerLag(admin: Admin, groupId: string, topic: string): Promise<number> {
  const [ends, committed] = await Promise.all([
    admin.fetchTopicOffsets(topic),
    admin.fetchOffsets({ groupId, topics: [topic] }),
  ]);
  const done = new Map<number, number>();
  for (const t of committed) for (const p of t.partitions) done.set(p.partition, Number(p.offset));
  let lag = 0;
  for (const p of ends) {
    const end = Number(p.high);
    const c = done.get(p.partition) ?? -1;
    lag += c < 0 ? end - Number(p.low) : Math.max(0, end - c);
  }
  return lag;
}

/** Messages currently held by a topic (used for the DLQ depth). */
export async function topicDepth(admin: Admin, topic: string): Promise<number> {
  const offsets = await admin.fetchTopicOffsets(topic);
  return offsets.reduce((n, p) => n + Number(p.high) - Number(p.low), 0);
}
