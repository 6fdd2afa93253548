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
  PartitionsNotAddedError,
  TopicBrokersError,
  TopicReplicationError,
  ensureTopics,
  growPartitions,
  topicDepth,
  topicsFor,
} from '../../core/kafka.js';
import type { TopicNames } from '../../core/kafka.js';
import type { Logger } from '../../core/logger.js';

export interface KafkaAccess {
  topics(activityId: string): TopicNames;
  /** Creates the missing topics; TopicReplicationError when existing ones have less replication. */
  ensureTopics(activityId: string): Promise<string[]>;
  /**
   * Raises the activity's orders topic to at least `count` partitions; the count before when it
   * added some, undefined when the topic had enough.
   */
  growOrdersPartitions(activityId: string, count: number): Promise<number | undefined>;
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
  /** How long creating or checking an activity's topics may take; KAFKA_TOPICS_DEADLINE_MS without. */
  topicsDeadlineMs?: number;
  /** Makes the admin client (a kafkajs admin on `brokers` without). */
  createAdmin?: () => Admin;
}

/**
 * How long a pass waits for a figure from Kafka. kafkajs retries a request a broker does not
 * answer for 30 s and more; every caller has an answer for "unknown" (the drain holds, the status
 * leaves the figure out), so a pass goes on without it rather than holding its worker, and the
 * schedule's instants (the gate closing at endAt) stay on time during a Kafka outage.
 */
export const KAFKA_READ_DEADLINE_MS = 5_000;

/**
 * How long a warm-up pass waits for its topics (created in about a second by a healthy cluster):
 * then the pass fails and is retried with backoff, and the next one joins the call still running,
 * so a warm-up during a Kafka outage holds a worker for seconds, not for kafkajs' retries
 * (minutes), while other activities' instants come due.
 */
export const KAFKA_TOPICS_DEADLINE_MS = 10_000;

/**
 * A call that failed before its deadline: a request that timed out, a connection that closed under
 * it (the patched kafkajs fails every request on a connection one of them timed out on). Its
 * message names the call and the activity, as the deadline's does, so a reconcile error says which
 * step Kafka failed; the error kafkajs threw is its `cause`.
 */
export class KafkaCallError extends Error {
  override name = 'KafkaCallError';

  constructor(call: string, cause: unknown) {
    super(`Kafka ${call}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
  }
}

/** Errors that already say what failed in terms a user acts on (a condition's reason reads them). */
function explained(err: unknown): boolean {
  return (
    err instanceof TopicReplicationError ||
    err instanceof TopicBrokersError ||
    err instanceof PartitionsNotAddedError
  );
}

export class KafkaAdminAccess implements KafkaAccess {
  private admin: Promise<Admin> | undefined;
  /** The call in flight per kind and activity: a pass after one that gave up joins it. */
  private readonly inFlight = new Map<string, Promise<unknown>>();

  constructor(private readonly options: KafkaAccessOptions) {}

  topics(activityId: string): TopicNames {
    return topicsFor(activityId, this.options.topicPrefix);
  }

  async ensureTopics(activityId: string): Promise<string[]> {
    return this.once(
      `ensure topics ${activityId}`,
      (a) =>
        ensureTopics(
          a,
          this.topics(activityId),
          this.options.partitions,
          this.options.replicationFactor,
          this.options.minInsyncReplicas,
        ),
      this.options.topicsDeadlineMs ?? KAFKA_TOPICS_DEADLINE_MS,
    );
  }

  async growOrdersPartitions(activityId: string, count: number): Promise<number | undefined> {
    return this.once(
      `grow partitions ${activityId}`,
      (a) => growPartitions(a, this.topics(activityId).orders, count),
      this.readDeadlineMs,
    );
  }

  async lag(activityId: string): Promise<number> {
    const t = this.topics(activityId);
    return this.once(
      `lag ${activityId}`,
      (a) => consumerLag(a, t.consumerGroup, t.orders),
      this.readDeadlineMs,
    );
  }

  async dlqDepth(activityId: string): Promise<number> {
    return this.once(
      `dlq depth ${activityId}`,
      (a) => topicDepth(a, this.topics(activityId).dlq),
      this.readDeadlineMs,
    );
  }

  async dlqUnhandled(activityId: string): Promise<number> {
    return this.once(
      `dlq unhandled ${activityId}`,
      (a) => dlqUnhandled(a, this.topics(activityId)),
      this.readDeadlineMs,
    );
  }

  async close(): Promise<void> {
    const admin = this.admin;
    this.admin = undefined;
    if (admin) await (await admin.catch(() => undefined))?.disconnect().catch(() => undefined);
  }

  private get readDeadlineMs(): number {
    return this.options.readDeadlineMs ?? KAFKA_READ_DEADLINE_MS;
  }

  /**
   * One call per key at a time, waited for at most `deadlineMs`: the calls left behind by passes
   * that gave up are joined by the next pass rather than piled up on a broker that does not answer.
   */
  private once<T>(key: string, fn: (admin: Admin) => Promise<T>, deadlineMs: number): Promise<T> {
    let pending = this.inFlight.get(key) as Promise<T> | undefined;
    if (!pending) {
      const started: Promise<T> = this.use(fn)
        .catch((err: unknown) => {
          throw explained(err) ? err : new KafkaCallError(key, err);
        })
        .finally(() => {
          if (this.inFlight.get(key) === started) this.inFlight.delete(key);
        });
      this.inFlight.set(key, started);
      pending = started;
    }
    return within(pending, deadlineMs, `Kafka ${key}`);
  }

  private async use<T>(fn: (admin: Admin) => Promise<T>): Promise<T> {
    if (!this.admin) {
      const admin =
        this.options.createAdmin?.() ??
        createKafka(this.options.brokers, this.options.clientId, undefined, this.options.logger).admin();
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
