/**
 * The operator's Kafka admin connection (topics, consumer lag, DLQ depth), connected on first use
 * and re-created after a failure so a broker restart does not leave a dead client behind.
 */
import type { Admin } from 'kafkajs';
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
}

export class KafkaAdminAccess implements KafkaAccess {
  private admin: Promise<Admin> | undefined;

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
    return this.use((a) => consumerLag(a, t.consumerGroup, t.orders));
  }

  async dlqDepth(activityId: string): Promise<number> {
    return this.use((a) => topicDepth(a, this.topics(activityId).dlq));
  }

  async dlqUnhandled(activityId: string): Promise<number> {
    return this.use((a) => dlqUnhandled(a, this.topics(activityId)));
  }

  async close(): Promise<void> {
    const admin = this.admin;
    this.admin = undefined;
    if (admin) await (await admin.catch(() => undefined))?.disconnect().catch(() => undefined);
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
