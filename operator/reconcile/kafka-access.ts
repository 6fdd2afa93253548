/**
 * The operator's Kafka admin connection (topics, consumer lag, DLQ depth), connected on first use
 * and re-created after a failure so a broker restart does not leave a dead client behind.
 */
import type { Admin } from 'kafkajs';
import { within } from '../../core/deadline.js';
import {
  consumerLag,
  createKafka,
  dlqUnhandled,
  TopicReplicationError,
  ensureTopics,
  topicDepth,
  topicsFor,
} from '../../core/kafka.js';
import type { TopicNames } from '../../core/kafka.js';
import type { Logger } from '../../core/logger.js';

export interface KafkaAccess {
  topics(activityId: string): TopicNames;
  /** Creates the missing topics; TopicReplicationError when existing ones have less replication. */
  ensureTopics(activityId: string): Promise<string[]>;
  /** Consumer lag of the activity's consumer group on its orders topic. */
  lag(activityId: string): Promise<number>;
  dlqDepth(activityId: string): Promise<number>;
  /** Dead letters after the DLQ's handled offset (`dlq replay` and `dlq ack` move it). */
  dlqUnhandled(activityId: string): Promise<number>;
  close(): Promise<void>;
}

export interface KafkaAccessOptions {
  brokers: string[];
  clientId: string;
  topicPrefix: string;
  partitions: number;
  replicationFactor: number;
  /** min.insync.replicas of the topics created (KAFKA_MIN_INSYNC_REPLICAS). */
  minInsyncReplicas?: number;
  /** Where kafkajs' own lines go (repeats held back, core/kafka-log.ts); the console without. */
  logger?: Logger;
  /** How long a figure read (lag, DLQ depth) may take; KAFKA_READ_DEADLINE_MS without. */
  readDeadlineMs?: number;
}

/**
 * How long a pass waits for a figure from Kafka. kafkajs retries a request a broker does not
 * answer for 30 s and more; every caller has an answer for "unknown" (the drain holds, the status
 * leaves the figure out), so a pass goes on without it rather than holding its worker, and the
 * schedule's instants (the gate closing at endAt) stay on time during a Kafka outage.
 */
export const KAFKA_READ_DEADLINE_MS = 5_000;

export class KafkaAdminAccess implements KafkaAccess {
  private admin: Promise<Admin> | undefined;
  /** The read in flight per figure and activity: a pass after one that gave up joins it. */
  private readonly reads = new Map<string, Promise<number>>();

  constructor(private readonly options: KafkaAccessOptions) {}

  topics(activityId: string): TopicNames {
    return topicsFor(activityId, this.options.topicPrefix);
  }

  async ensureTopics(activityId: string): Promise<string[]> {
    return this.use((a) =>
      ensureTopics(
        a,
        this.topics(activityId),
        this.options.partitions,
        this.options.replicationFactor,
        this.options.minInsyncReplicas,
      ),
    );
  }

  async lag(activityId: string): Promise<number> {
    const t = this.topics(activityId);
    return this.read(`lag ${activityId}`, (a) => consumerLag(a, t.consumerGroup, t.orders));
  }

  async dlqDepth(activityId: string): Promise<number> {
    return this.read(`dlq depth ${activityId}`, (a) => topicDepth(a, this.topics(activityId).dlq));
  }

  async dlqUnhandled(activityId: string): Promise<number> {
    return this.read(`dlq unhandled ${activityId}`, (a) => dlqUnhandled(a, this.topics(activityId)));
  }

  async close(): Promise<void> {
    const admin = this.admin;
    this.admin = undefined;
    if (admin) await (await admin.catch(() => undefined))?.disconnect().catch(() => undefined);
  }

  /**
   * One read per key at a time, waited for at most the read deadline: the ones left behind by
   * passes that gave up do not pile up on a broker that does not answer.
   */
  private read(key: string, fn: (admin: Admin) => Promise<number>): Promise<number> {
    let pending = this.reads.get(key);
    if (!pending) {
      const started: Promise<number> = this.use(fn).finally(() => {
        if (this.reads.get(key) === started) this.reads.delete(key);
      });
      this.reads.set(key, started);
      pending = started;
    }
    return within(pending, this.options.readDeadlineMs ?? KAFKA_READ_DEADLINE_MS, `Kafka ${key}`);
  }

  private async use<T>(fn: (admin: Admin) => Promise<T>): Promise<T> {
    if (!this.admin) {
      const admin = createKafka(
        this.options.brokers,
        this.options.clientId,
        undefined,
        this.options.logger,
      ).admin();
      this.admin = admin.connect().then(() => admin);
    }
    const pending = this.admin;
    try {
      return await fn(await pending);
    } catch (err) {
      // A refusal of the topics' settings is an answer of a working connection: keep it.
      if (this.admin === pending && !(err instanceof TopicReplicationError)) {
        this.admin = undefined;
        void pending.then((a) => a.disconnect()).catch(() => undefined);
      }
      throw err;
    }
  }
}
