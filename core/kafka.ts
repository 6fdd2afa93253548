/** Kafka topic names, topic creation and consumer lag, shared by relay, consumer and operator. */
import { setTimeout as sleep } from 'node:timers/promises';
import { z } from 'zod';
import type { ConnectionOptions } from 'node:tls';
import kafkajs, { Kafka, Partitioners, logLevel } from 'kafkajs';
import { KAFKA_DISCONNECT_GRACE_MS, settlesWithin } from './deadline.js';
import { fixKafkajsIdleLoop } from './kafkajs-idle-loop.js';
import { kafkajsLogCreator } from './kafka-log.js';
import type { Logger } from './logger.js';
import type {
  Admin,
  Message,
  PartitionMetadata,
  Producer,
  ProducerBatch,
  ProducerRecord,
  RecordMetadata,
  SASLOptions,
} from 'kafkajs';

// Not among the names Node finds in kafkajs' CommonJS exports: taken from the module object.
const { ConfigResourceTypes } = kafkajs;

export interface TopicNames {
  orders: string;
  dlq: string;
  consumerGroup: string;
  /**
   * The consumer group whose committed offsets are the DLQ's handled offsets: `dlq replay` and
   * `dlq ack` advance them, nothing consumes with it (docs/runbooks/FlashSaleDLQUnhandled.md).
   */
  dlqHandledGroup: string;
}

/** One topic per activity keeps activities apart; its DLQ sits beside it. */
export function topicsFor(activityId: string, prefix = 'flashsale'): TopicNames {
  return {
    orders: `${prefix}.orders.${activityId}`,
    dlq: `${prefix}.orders.${activityId}.dlq`,
    consumerGroup: `${prefix}-orders-${activityId}`,
    dlqHandledGroup: `${prefix}-dlq-handled-${activityId}`,
  };
}

/**
 * The platform-wide topic of order events (docs/order-events.md): one topic for every activity,
 * keyed by order id, so one order's events stay in one partition, in order.
 */
export function orderEventsTopic(prefix = 'flashsale'): string {
  return `${prefix}.order-events`;
}

/**
 * min.insync.replicas for a topic of `replicationFactor` replicas unless configured: one fewer
 * than the replicas (at least 1), so that with acks=all a write survives the loss of any one
 * broker and the topic still takes writes while one broker is down (3 replicas -> 2).
 */
export function defaultMinInsyncReplicas(replicationFactor: number): number {
  return Math.max(1, replicationFactor - 1);
}

/** Replication of the topics a process creates (docs/capacity.md, "Kafka"). */
export interface TopicReplication {
  /** Replicas per partition; -1 = the brokers' default.replication.factor. */
  replicationFactor: number;
  /** min.insync.replicas of the topic; undefined = defaultMinInsyncReplicas, or the brokers' setting when the factor is -1. */
  minInsyncReplicas?: number | undefined;
}

function topicConfigEntries(r: TopicReplication): { name: string; value: string }[] {
  const isr =
    r.minInsyncReplicas ??
    (r.replicationFactor > 0 ? defaultMinInsyncReplicas(r.replicationFactor) : undefined);
  return isr === undefined ? [] : [{ name: 'min.insync.replicas', value: String(isr) }];
}

/**
 * Creates the order-events topic if missing (replication -1 = the brokers' default). One that
 * exists must have at least the configured replication, as the activities' topics must
 * (ensureTopics): otherwise TopicReplicationError, and the relay publishes nothing to it.
 */
export async function ensureOrderEventsTopic(
  admin: Admin,
  topic: string,
  partitions: number,
  replication: TopicReplication | number = -1,
): Promise<boolean> {
  const r = typeof replication === 'number' ? { replicationFactor: replication } : replication;
  if ((await admin.listTopics()).includes(topic)) {
    const shortfalls = await topicReplicationShortfalls(
      admin,
      [topic],
      r.replicationFactor,
      r.minInsyncReplicas ?? defaultMinInsyncReplicas(r.replicationFactor),
    );
    if (shortfalls.length > 0)
      throw new TopicReplicationError(
        shortfalls,
        'Raise it (kafka-reassign-partitions, kafka-configs --alter); the events wait in PostgreSQL ' +
          'meanwhile (docs/runbooks/FlashSaleOrderEventsTopicUnderReplicated.md)',
      );
    return false;
  }
  try {
    const created = await admin.createTopics({
      waitForLeaders: false,
      topics: [
        {
          topic,
          numPartitions: partitions,
          replicationFactor: r.replicationFactor,
          configEntries: topicConfigEntries(r),
        },
      ],
    });
    await waitForLeaders(admin, [topic]);
    return created;
  } catch (err) {
    // Another relay created it at the same time.
    if (/already exists/i.test((err as Error).message)) return false;
    if (refusedForReplication(err)) throw await topicBrokersError(admin, [topic], r.replicationFactor);
    throw err;
  }
}

/**
 * The Kafka TLS and SASL variables as strings in a configuration schema (runtime and operator), so
 * that the configuration contract knows them; kafkaSecurityFromEnv reads and checks their values.
 */
export const kafkaSecurityEnvShape = {
  KAFKA_TLS: z.string().optional(),
  KAFKA_TLS_CA: z.string().optional(),
  KAFKA_TLS_CERT: z.string().optional(),
  KAFKA_TLS_KEY: z.string().optional(),
  KAFKA_TLS_SERVERNAME: z.string().optional(),
  KAFKA_TLS_REJECT_UNAUTHORIZED: z.string().optional(),
  KAFKA_SASL_MECHANISM: z.string().optional(),
  KAFKA_SASL_USERNAME: z.string().optional(),
  KAFKA_SASL_PASSWORD: z.string().optional(),
  KAFKA_SASL_ALLOW_PLAINTEXT: z.string().optional(),
};

/** TLS and SASL settings of every Kafka client (runtime roles, the operator, tools). */
export interface KafkaSecurity {
  ssl?: ConnectionOptions | boolean;
  sasl?: SASLOptions;
}

const SASL_MECHANISMS = ['plain', 'scram-sha-256', 'scram-sha-512'] as const;

function flag(envValue: string | undefined, name: string, def: boolean): boolean {
  if (envValue === undefined || envValue === '') return def;
  if (['true', '1'].includes(envValue)) return true;
  if (['false', '0'].includes(envValue)) return false;
  throw new Error(`invalid configuration:\n  ${name}: true or false`);
}

/**
 * Maps the KAFKA_TLS* and KAFKA_SASL_* variables (README, "Kafka authentication" in
 * docs/install.md) to kafkajs options. Unset means plaintext without authentication, as before.
 * SASL PLAIN sends the password as it is, so it is refused without TLS unless
 * KAFKA_SASL_ALLOW_PLAINTEXT says the network is trusted.
 */
export function kafkaSecurityFromEnv(e: NodeJS.ProcessEnv = process.env): KafkaSecurity {
  const out: KafkaSecurity = {};
  const tls = flag(e.KAFKA_TLS, 'KAFKA_TLS', false);
  if (tls) {
    const opts: ConnectionOptions = {
      rejectUnauthorized: flag(e.KAFKA_TLS_REJECT_UNAUTHORIZED, 'KAFKA_TLS_REJECT_UNAUTHORIZED', true),
    };
    if (e.KAFKA_TLS_CA) opts.ca = [e.KAFKA_TLS_CA];
    if (Boolean(e.KAFKA_TLS_CERT) !== Boolean(e.KAFKA_TLS_KEY)) {
      throw new Error(
        'invalid configuration:\n  KAFKA_TLS_CERT, KAFKA_TLS_KEY: set both (client certificate) or neither',
      );
    }
    if (e.KAFKA_TLS_CERT) opts.cert = e.KAFKA_TLS_CERT;
    if (e.KAFKA_TLS_KEY) opts.key = e.KAFKA_TLS_KEY;
    if (e.KAFKA_TLS_SERVERNAME) opts.servername = e.KAFKA_TLS_SERVERNAME;
    out.ssl = opts;
  } else if (e.KAFKA_TLS_CA || e.KAFKA_TLS_CERT || e.KAFKA_TLS_KEY) {
    throw new Error('invalid configuration:\n  KAFKA_TLS: set it to true to use KAFKA_TLS_CA/CERT/KEY');
  }
  const mechanism = (e.KAFKA_SASL_MECHANISM ?? '').toLowerCase();
  if (mechanism) {
    if (!(SASL_MECHANISMS as readonly string[]).includes(mechanism)) {
      throw new Error(`invalid configuration:\n  KAFKA_SASL_MECHANISM: one of ${SASL_MECHANISMS.join(', ')}`);
    }
    const username = e.KAFKA_SASL_USERNAME ?? '';
    const password = e.KAFKA_SASL_PASSWORD ?? '';
    if (!username || !password) {
      throw new Error(
        'invalid configuration:\n  KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD: required with KAFKA_SASL_MECHANISM',
      );
    }
    if (
      mechanism === 'plain' &&
      !tls &&
      !flag(e.KAFKA_SASL_ALLOW_PLAINTEXT, 'KAFKA_SASL_ALLOW_PLAINTEXT', false)
    ) {
      throw new Error(
        'invalid configuration:\n  KAFKA_SASL_MECHANISM: plain sends the password in clear; set KAFKA_TLS=true (or KAFKA_SASL_ALLOW_PLAINTEXT=true on a trusted network)',
      );
    }
    out.sasl = {
      mechanism: mechanism as (typeof SASL_MECHANISMS)[number],
      username,
      password,
    } as SASLOptions;
  } else if (e.KAFKA_SASL_USERNAME || e.KAFKA_SASL_PASSWORD) {
    throw new Error(
      'invalid configuration:\n  KAFKA_SASL_MECHANISM: required with KAFKA_SASL_USERNAME/PASSWORD',
    );
  }
  return out;
}

/**
 * How long a new connection to a broker may take: the TCP connect, and (patches/kafkajs+2.2.4.patch)
 * its ApiVersions handshake, which kafkajs sends with this timeout. A broker that stalls (a paused
 * process, cut off) still takes TCP connections and answers nothing: a client that meets it first
 * in its bootstrap list moves on to the next broker after this long. Above kafkajs' 1 s default so
 * that a healthy broker on a loaded machine (a JVM pause) is not taken for a stalled one; a client
 * whose handshake timed out everywhere retries with backoff anyway.
 */
export const KAFKA_CONNECTION_TIMEOUT_MS = 3_000;

/**
 * How long a client waits for a broker's answer to a request before it gives the request up
 * (kafkajs' `requestTimeout`, 30 s by default, as the Java client's `request.timeout.ms`). A broker
 * that stalls (a paused JVM, a cut that leaves TCP accepting) answers nothing, and a client learns
 * of the stall only when a request to it times out: with 30 s every order of a frozen leader's
 * partitions waited at least 30 s in the outbox, although the controllers fence a silent broker and
 * move its leadership after `broker.session.timeout.ms` (9 s); at 10 s the relay's retry finds the
 * new leader about when it is elected (docs/faults.md, window 18, stalled broker). A request that
 * only takes long is sent again, which costs nothing but the wait: the producer is idempotent (a
 * batch sent twice is written once) and a consumer's fetch, a `JoinGroup` and a connection's
 * handshake keep timeouts of their own (the fetch's long poll, the group's rebalance timeout plus
 * 5 s, KAFKA_CONNECTION_TIMEOUT_MS). The healthy brokers' acks=all answers also wait until the
 * frozen one leaves the in-sync replicas, about when it is fenced: they answer first since
 * KAFKA_PRODUCE_ACK_TIMEOUT_MS (before it, the relay's requests to all three timed out together
 * and its next metadata read could meet the frozen broker: 21–23 s to drain). 15 s, tried,
 * drained in 20.3 s.
 */
export const KAFKA_REQUEST_TIMEOUT_MS = 10_000;

/**
 * How long a leader may hold a send for its in-sync replicas before it answers REQUEST_TIMED_OUT
 * (the produce request's `timeout`; kafkajs sends 30 s). It must end before KAFKA_REQUEST_TIMEOUT_MS:
 * a healthy leader waiting for a stalled follower to leave the in-sync replicas (about 9 s, when the
 * controllers fence it) then answers, the idempotent producer sends again on the same connection
 * (the broker recognises the repeat by its sequence number), and no connection to a healthy broker
 * is closed. With kafkajs' 30 s the client gave up first on every broker at once, closed all their
 * connections, and its next metadata read could go to the frozen broker, a second request timeout
 * (traced 2026-12-06: drained 23.3 s after the freeze instead of 10–15 s; docs/faults.md window 18,
 * "stalled broker"). The 3 s margin covers a loaded broker's queueing before its timer starts.
 */
export const KAFKA_PRODUCE_ACK_TIMEOUT_MS = KAFKA_REQUEST_TIMEOUT_MS - 3_000;

/**
 * A kafkajs client; TLS and SASL come from the environment unless given (kafkaSecurityFromEnv).
 * With `logger`, kafkajs' lines go through it, repeats held back (core/kafka-log.ts); without,
 * kafkajs writes its own JSON to the console (tests, benchmarks, the demo's scripts).
 */
export function createKafka(
  brokers: string[],
  clientId: string,
  security: KafkaSecurity = kafkaSecurityFromEnv(),
  logger?: Logger,
): Kafka {
  // Once per process (idempotent): no 1 ms timer loop per idle broker connection.
  fixKafkajsIdleLoop();
  return new Kafka({
    clientId,
    brokers,
    connectionTimeout: KAFKA_CONNECTION_TIMEOUT_MS,
    requestTimeout: KAFKA_REQUEST_TIMEOUT_MS,
    logLevel: logLevel.WARN,
    retry: { retries: 8, initialRetryTime: 200 },
    ...(logger ? { logCreator: kafkajsLogCreator(logger) } : {}),
    ...security,
  });
}

/**
 * How old a producer's or consumer's partition metadata may get before it is read again (kafkajs'
 * `metadataMaxAge`, 5 minutes by default). kafkajs reads it again after a "not leader" answer,
 * which a broker that stalls (frozen, cut off) never gives: its requests only time out and are
 * retried against it. With the default the relay's sends went on to the frozen leader for minutes
 * after the cluster had moved its partitions; now a retry after 5 s finds the new leader. The same
 * age bounds how long partitions added to a topic mid-sale go unused by the relay and unread by
 * the consumer group (onePartitionPerRequest; runtime/roles/consumer.ts). One Metadata request per
 * producer and per consumer every 5 s while they work.
 */
export const KAFKA_METADATA_MAX_AGE_MS = 5_000;

/**
 * The longest wait between two tries of one send (kafkajs' backoff doubles from 200 ms up to this,
 * with its ±20 % jitter). A send is tried for as long as Kafka refuses it, so when an outage ends
 * the orders wait up to this long for their next try: with 5 s, a try refused just before two of
 * three brokers came back (`NOT_ENOUGH_REPLICAS`) slept out the 5 s after their return
 * (docs/faults.md, "18 (Kafka majority lost)"). The cost: during an outage each send in flight is
 * tried about once a second (a refused connection, or a request the broker refuses or the request
 * timeout ends).
 */
export const KAFKA_SEND_MAX_RETRY_MS = 1_000;

/** What a job that sends now and then uses of a producer. */
export type Sender = Pick<Producer, 'send'>;

/**
 * A producer made afresh after any failed send, as the relay's is. kafkajs takes an idempotent
 * producer's id once, at connect; a broker that lost it (a restart, or an idle producer's id
 * expired) answers UNKNOWN_PRODUCER_ID or OUT_OF_ORDER_SEQUENCE_NUMBER, which it does not retry, and
 * the same producer would then fail every send until the process restarts. For jobs whose sends are
 * rare (gap repair), so their producer is idle for long.
 */
export class RenewingProducer implements Sender {
  private current: Promise<Producer> | undefined;
  constructor(private readonly create: () => Producer) {}

  /** Connects now (a start that finds Kafka away fails as before); a send would otherwise. */
  async connect(): Promise<void> {
    await this.producer();
  }

  async send(record: ProducerRecord): Promise<RecordMetadata[]> {
    const current = this.producer();
    const producer = await current;
    try {
      return await producer.send(record);
    } catch (err) {
      if (this.current === current) this.current = undefined;
      void settlesWithin(producer.disconnect(), KAFKA_DISCONNECT_GRACE_MS);
      throw err;
    }
  }

  async disconnect(): Promise<void> {
    const current = this.current;
    this.current = undefined;
    if (current) await (await current.catch(() => undefined))?.disconnect();
  }

  private producer(): Promise<Producer> {
    if (!this.current) {
      const made = (async () => {
        const p = this.create();
        await p.connect();
        return p;
      })();
      // A connect that failed is tried again by the next call.
      made.catch(() => {
        if (this.current === made) this.current = undefined;
      });
      this.current = made;
    }
    return this.current;
  }
}

/**
 * An idempotent producer (acks from all in-sync replicas, one request in flight). Retries are
 * unbounded as kafkajs requires for its idempotence guarantee: during a broker outage a send
 * waits instead of failing (a try at least every KAFKA_SEND_MAX_RETRY_MS), and the half messages
 * simply stay in the outbox.
 *
 * Every request of a send targets one partition (onePartitionPerRequest): kafkajs 2.2.4 loses
 * messages otherwise when a partition's leader dies mid-send (see there).
 */
export function idempotentProducer(kafka: Kafka): PartitionedProducer {
  const producer = kafka.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    allowAutoTopicCreation: false,
    createPartitioner: Partitioners.DefaultPartitioner,
    metadataMaxAge: KAFKA_METADATA_MAX_AGE_MS,
    retry: { retries: Number.MAX_SAFE_INTEGER, initialRetryTime: 200, maxRetryTime: KAFKA_SEND_MAX_RETRY_MS },
  });
  return onePartitionPerRequest(producer, kafka);
}

/**
 * The most one produce request carries for one partition, in bytes of its messages' values, keys
 * and headers (plus REQUEST_BYTES_PER_RECORD each). Kafka writes a request's messages for one
 * partition as one record batch and refuses a batch above the topic's `max.message.bytes` (1 MB by
 * default) with MESSAGE_TOO_LARGE, which kafkajs does not retry: a relay read of 2,000 half
 * messages of long item names for one partition (1.2 MB) was refused, read again and sent the same
 * way for ever (test/integration/order-path/relay-large-read.test.ts). Half of the default, like
 * one order batch (core/order-message.ts ORDER_BATCH_MAX_BYTES): a message that large goes alone.
 */
export const PARTITION_REQUEST_MAX_BYTES = 512 * 1024;

/** A record's own framing in a batch (lengths, offsets, timestamps, attributes), at most. */
const REQUEST_BYTES_PER_RECORD = 64;

function bytesOf(v: Message['key'] | Message['value']): number {
  if (v === null || v === undefined) return 0;
  return typeof v === 'string' ? Buffer.byteLength(v) : v.length;
}

/** A record's bytes in a produce request: key, value, headers and framing. */
export function recordBytes(m: Message): number {
  let n = REQUEST_BYTES_PER_RECORD + bytesOf(m.key) + bytesOf(m.value);
  for (const [name, value] of Object.entries(m.headers ?? {})) {
    n += Buffer.byteLength(name);
    for (const v of Array.isArray(value) ? value : [value]) n += bytesOf(v as Message['value']);
  }
  return n;
}

/**
 * One partition's messages in requests of at most PARTITION_REQUEST_MAX_BYTES each, in their
 * order (one larger message in a request of its own). Exported for tests.
 */
export function requestsOf(messages: readonly Message[]): Message[][] {
  const out: Message[][] = [];
  let open: Message[] = [];
  let bytes = 0;
  for (const m of messages) {
    const n = recordBytes(m);
    if (open.length > 0 && bytes + n > PARTITION_REQUEST_MAX_BYTES) {
      out.push(open);
      open = [];
      bytes = 0;
    }
    open.push(m);
    bytes += n;
  }
  if (open.length > 0) out.push(open);
  return out;
}

/**
 * A producer that also tells which partition a key goes to, so that a caller can put several
 * records of one partition into one message (runtime/relay/relay.ts, order batches).
 */
export interface PartitionedProducer extends Producer {
  /** The producer's own partitioner for `topic`, by the partitions its sends go by. */
  partitionerFor(topic: string): Promise<(key: string) => number>;
}

/**
 * Splits every `send` into one send per partition, run side by side, and fails when any fails.
 *
 * Why: kafkajs (2.2.4, producer/sendMessages.js) tracks a send's progress per broker. When the
 * leader of partition A dies, its request fails and is retried after a metadata refresh; if A's
 * new leader is a broker that already answered for its own partitions of the same send, A's
 * messages are never sent again, yet the send resolves. The relay then deletes them from the
 * outbox: lost orders. Seen on three brokers with a leader SIGKILLed mid-sale (docs/faults.md,
 * window 18). With one partition per request the only broker of a send is the one that failed,
 * so the retry always goes to the new leader. A send that fails as a whole is sent again by its
 * caller; the partitions that had succeeded then arrive twice, which the orders' unique keys and
 * the event consumers' idempotence absorb.
 *
 * The partition is chosen here with the producer's own partitioner (the key's murmur2 hash, as
 * kafkajs and the Java client do), from the topic's partition metadata, read again once it is
 * KAFKA_METADATA_MAX_AGE_MS old and after a failed send: partitions added to the topic mid-sale
 * (to spread the orders over more consumers) take new orders within seconds. kafkajs itself sends
 * nothing to a partition its own metadata (read as often) does not have yet, and resolves the send:
 * a partition's send whose answer does not name that partition fails, so the caller sends it again
 * (seen 2026-12-06: six orders deleted from the outbox unsent, in the fault test that adds
 * partitions mid-sale, test/integration/faults/kafka-maintenance.test.ts). A message that names
 * its partition keeps it.
 *
 * Only the first read (and the first after a failed send) holds a send: once partitions are known,
 * a read that is due runs beside the sends, which use the known partitions until it answers (when
 * it fails, they are kept). The read goes to any broker of the cluster, and one that stalls (frozen,
 * cut off) answers nothing until the request times out (kafkajs' 30 s then): seen 2026-12-06 as
 * the last orders of a sale waiting 2–6 s and once more than 15 s in the outbox with a broker frozen
 * (test/integration/faults/stalled-broker.test.ts), the relay loop holding them waiting on it. The
 * reading client connects with the producer, so that a fresh producer's two bootstrap connects
 * (each may first meet a stalled broker) overlap.
 */
export function onePartitionPerRequest(producer: Producer, kafka: Kafka): PartitionedProducer {
  const partitioner = Partitioners.DefaultPartitioner();
  interface Known {
    partitions: PartitionMetadata[];
    readAt: number;
    reading: boolean;
  }
  const metadata = new Map<string, Known>();
  let admin: Promise<Admin> | undefined;
  const connectAdmin = (): Promise<Admin> => {
    if (!admin) {
      const connecting = (async () => {
        const a = kafka.admin();
        await a.connect();
        return a;
      })();
      // A connect that failed is made again by the next read.
      connecting.catch(() => {
        if (admin === connecting) admin = undefined;
      });
      admin = connecting;
    }
    return admin;
  };
  const read = async (topic: string): Promise<PartitionMetadata[]> => {
    const a = await connectAdmin();
    const got = (await a.fetchTopicMetadata({ topics: [topic] })).topics[0]?.partitions ?? [];
    if (got.length === 0) throw new Error(`no partition metadata for topic ${topic}`);
    return got;
  };
  const partitionsOf = async (topic: string): Promise<PartitionMetadata[]> => {
    const known = metadata.get(topic);
    if (!known) {
      const partitions = await read(topic);
      metadata.set(topic, { partitions, readAt: Date.now(), reading: false });
      return partitions;
    }
    if (!known.reading && Date.now() - known.readAt >= KAFKA_METADATA_MAX_AGE_MS) {
      known.reading = true;
      void read(topic)
        .then(
          (partitions) => {
            known.partitions = partitions;
          },
          () => undefined,
        )
        .finally(() => {
          known.readAt = Date.now();
          known.reading = false;
        });
    }
    return known.partitions;
  };
  const send = async (record: ProducerRecord): Promise<RecordMetadata[]> => {
    try {
      const partitionMetadata = await partitionsOf(record.topic);
      const groups = new Map<number, Message[]>();
      for (const message of record.messages) {
        const partition = partitioner({ topic: record.topic, partitionMetadata, message });
        const group = groups.get(partition);
        if (group) group.push({ ...message, partition });
        else groups.set(partition, [{ ...message, partition }]);
      }
      const results = await Promise.allSettled(
        [...groups].map(async ([partition, messages]) => {
          const answers: RecordMetadata[] = [];
          // In order: a partition's requests one after the other, as one request would write them.
          for (const part of requestsOf(messages)) {
            const sent = await producer.send({
              timeout: KAFKA_PRODUCE_ACK_TIMEOUT_MS,
              ...record,
              messages: part,
            });
            // kafkajs sends nothing for a partition its own metadata does not have yet, and
            // resolves (cluster.findLeaderForPartitions skips it): a partition added since the
            // producer last read the topic's metadata, which the partitions read above already
            // name. A send with no answer for its partition sent nothing; failing it has the
            // caller send again with a fresh producer, which reads the metadata first.
            if (!sent.some((r) => r.partition === partition))
              throw new Error(
                `kafka producer sent nothing to partition ${partition} of ${record.topic} (not in its metadata yet)`,
              );
            answers.push(...sent);
          }
          return answers;
        }),
      );
      const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed) throw failed.reason;
      return results.flatMap((r) => (r.status === 'fulfilled' ? r.value : []));
    } catch (err) {
      metadata.delete(record.topic);
      throw err;
    }
  };
  return {
    ...producer,
    connect: async (): Promise<void> => {
      await Promise.all([producer.connect(), connectAdmin()]);
    },
    send,
    partitionerFor: async (topic: string): Promise<(key: string) => number> => {
      const partitionMetadata = await partitionsOf(topic);
      return (key) => partitioner({ topic, partitionMetadata, message: { key, value: null } });
    },
    sendBatch: async (batch: ProducerBatch): Promise<RecordMetadata[]> => {
      const out: RecordMetadata[] = [];
      for (const tm of batch.topicMessages ?? []) {
        out.push(...(await send({ ...batch, topic: tm.topic, messages: tm.messages })));
      }
      return out;
    },
    disconnect: async (): Promise<void> => {
      const a = admin;
      admin = undefined;
      await Promise.allSettled([producer.disconnect(), a?.then((c) => c.disconnect())]);
    },
  };
}

/**
 * Topics that exist with less replication than this process is configured to create: the
 * durability an acknowledged order relies on (acks=all on `min.insync.replicas` brokers) would not
 * hold, so they are refused rather than used (ensureTopics).
 */
export class TopicReplicationError extends Error {
  constructor(
    readonly shortfalls: string[],
    advice = 'Raise them (kafka-reassign-partitions, kafka-configs --alter), or delete them while they hold ' +
      'no orders so they are created as configured (docs/operator.md, "Kafka topics")',
  ) {
    super(`Kafka topic(s) exist with less replication than configured: ${shortfalls.join('; ')}. ${advice}`);
    this.name = 'TopicReplicationError';
  }
}

/**
 * The brokers refused to create topics with `replicationFactor` replicas
 * (INVALID_REPLICATION_FACTOR): fewer brokers are available than that, because brokers are down
 * (a KRaft controller leaves a stopped broker out once its session expires) or because the
 * setting is above the cluster's size. Nothing was created.
 */
export class TopicBrokersError extends Error {
  constructor(
    readonly topics: readonly string[],
    readonly replicationFactor: number,
    readonly brokers: readonly number[],
  ) {
    super(
      `Kafka topic(s) ${topics.join(', ')} cannot be created with ${replicationFactor} replicas: ` +
        `${brokers.length} broker(s) available (node ids ${brokers.join(', ') || 'none'}). Either brokers ` +
        'are down (retried until they are back) or KAFKA_REPLICATION_FACTOR is above the ' +
        `cluster's broker count (docs/operator.md, "Kafka topics")`,
    );
    this.name = 'TopicBrokersError';
  }
}

/**
 * Kafka refused to add partitions to `topic` (CreatePartitions): the count stays `partitions`.
 * `refusal` says why in the user's terms: fewer brokers than the topic's replicas, the client's
 * principal not allowed to alter the topic, or Kafka's own error type and message.
 */
export class PartitionsNotAddedError extends Error {
  constructor(
    readonly topic: string,
    readonly partitions: number,
    readonly wanted: number,
    readonly refusal: string,
  ) {
    super(`Kafka topic ${topic}: partitions not added (${partitions}, ${wanted} wanted): ${refusal}`);
    this.name = 'PartitionsNotAddedError';
  }
}

/** The Kafka error types a kafkajs error carries: its own, then (aggregated) its inner ones'. */
function kafkaErrorTypes(err: unknown): string[] {
  const type = (e: unknown): unknown => (e as { type?: unknown } | null)?.type;
  const errors = (err as { errors?: unknown } | null)?.errors;
  return [err, ...(Array.isArray(errors) ? errors : [])]
    .map(type)
    .filter((t): t is string => typeof t === 'string');
}

/** Whether a CreateTopics failure says the replication factor exceeds the available brokers. */
function refusedForReplication(err: unknown): boolean {
  return kafkaErrorTypes(err).includes('INVALID_REPLICATION_FACTOR');
}

/** The TopicBrokersError of a refused CreateTopics, with the brokers the cluster has available. */
async function topicBrokersError(
  admin: Admin,
  topics: readonly string[],
  replicationFactor: number,
): Promise<TopicBrokersError> {
  return new TopicBrokersError(topics, replicationFactor, await availableBrokerIds(admin));
}

/** The node ids of the brokers the cluster's metadata lists (fenced ones are left out), ascending. */
async function availableBrokerIds(admin: Admin): Promise<number[]> {
  const { brokers } = await admin.describeCluster();
  return brokers.map((b) => b.nodeId).sort((x, y) => x - y);
}

/**
 * What falls short in existing `names` of `replicationFactor` replicas per partition and
 * `minInsyncReplicas` (the topic's effective setting, its own or the brokers' default); nothing
 * to check when the factor is the brokers' default (-1).
 */
export async function topicReplicationShortfalls(
  admin: Admin,
  names: readonly string[],
  replicationFactor: number,
  minInsyncReplicas: number,
): Promise<string[]> {
  if (names.length === 0 || replicationFactor < 1) return [];
  const [metadata, configs] = await Promise.all([
    admin.fetchTopicMetadata({ topics: [...names] }),
    admin.describeConfigs({
      includeSynonyms: false,
      resources: names.map((name) => ({
        type: ConfigResourceTypes.TOPIC,
        name,
        configNames: ['min.insync.replicas'],
      })),
    }),
  ]);
  const isrOf = new Map(
    configs.resources.map((r) => [
      r.resourceName,
      Number(r.configEntries.find((e) => e.configName === 'min.insync.replicas')?.configValue ?? 1),
    ]),
  );
  const out: string[] = [];
  for (const t of metadata.topics) {
    const replicas = Math.min(...t.partitions.map((p) => p.replicas.length));
    if (replicas < replicationFactor)
      out.push(`${t.name} has ${replicas} replica(s) per partition, configured ${replicationFactor}`);
    const isr = isrOf.get(t.name) ?? 1;
    if (isr < minInsyncReplicas)
      out.push(`${t.name} has min.insync.replicas=${isr}, configured ${minInsyncReplicas}`);
  }
  return out;
}

/**
 * Creates an activity's orders topic and its DLQ if missing, with `replicationFactor` replicas and
 * min.insync.replicas (defaultMinInsyncReplicas unless given): the producers use acks=all, so a
 * message acknowledged to the relay is on that many brokers. Topics that exist already (created by
 * hand, by auto-creation, or under other settings) must have at least that replication:
 * TopicReplicationError otherwise, before anything is created. TopicBrokersError when the brokers
 * refuse the replication factor (fewer available than that).
 */
export async function ensureTopics(
  admin: Admin,
  topics: TopicNames,
  partitions: number,
  replicationFactor: number,
  minInsyncReplicas: number = defaultMinInsyncReplicas(replicationFactor),
): Promise<string[]> {
  const existing = new Set(await admin.listTopics());
  const shortfalls = await topicReplicationShortfalls(
    admin,
    [topics.orders, topics.dlq].filter((t) => existing.has(t)),
    replicationFactor,
    minInsyncReplicas,
  );
  if (shortfalls.length > 0) throw new TopicReplicationError(shortfalls);
  const wanted = [topics.orders, topics.dlq].filter((t) => !existing.has(t));
  if (wanted.length === 0) return [];
  try {
    await admin.createTopics({
      waitForLeaders: false,
      topics: wanted.map((topic) => ({
        topic,
        numPartitions: topic === topics.dlq ? 1 : partitions,
        replicationFactor,
        configEntries: topicConfigEntries({ replicationFactor, minInsyncReplicas }),
      })),
    });
  } catch (err) {
    // kafkajs says only "Topic creation errors" / "Replication-factor is invalid".
    if (!refusedForReplication(err)) throw err;
    throw await topicBrokersError(admin, wanted, replicationFactor);
  }
  await waitForLeaders(admin, wanted);
  return wanted;
}

/**
 * Raises `topic` to at least `count` partitions; Kafka never takes partitions away, so a topic with
 * as many or more is left as it is. Returns the count before when partitions were added. A repeat
 * (a pass after a crash, another client) that finds the topic already raised changes nothing. The
 * producers and consumers here use added partitions within KAFKA_METADATA_MAX_AGE_MS.
 */
export async function growPartitions(
  admin: Admin,
  topic: string,
  count: number,
): Promise<number | undefined> {
  const partitionCount = async (): Promise<number> => {
    const n = (await admin.fetchTopicMetadata({ topics: [topic] })).topics[0]?.partitions.length ?? 0;
    if (n === 0) throw new Error(`no partition metadata for topic ${topic}`);
    return n;
  };
  const before = await partitionCount();
  if (before >= count) return undefined;
  try {
    await admin.createPartitions({ topicPartitions: [{ topic, count }] });
  } catch (err) {
    // INVALID_PARTITIONS once another request raised it that far first.
    if ((await partitionCount()) >= count) return undefined;
    throw await partitionsRefusal(admin, topic, before, count, err);
  }
  // The answering broker's metadata may still list the partitions before (seen on three brokers).
  await waitForLeaders(admin, [topic], undefined, count);
  return before;
}

/**
 * The PartitionsNotAddedError of a refused CreatePartitions, in terms a user can act on; errors
 * that are not Kafka's answer (a broker that did not answer, a lost connection) pass unchanged.
 */
async function partitionsRefusal(
  admin: Admin,
  topic: string,
  partitions: number,
  wanted: number,
  err: unknown,
): Promise<Error> {
  const [type] = kafkaErrorTypes(err);
  if (type === 'INVALID_REPLICATION_FACTOR') {
    // Every new partition gets the topic's replication factor. KRaft places replicas on fenced
    // brokers too when it must (measured: one of three down, the partition is added), so this
    // means fewer brokers registered than replicas: brokers unregistered, or a cluster shrunk.
    const [metadata, ids] = await Promise.all([
      admin.fetchTopicMetadata({ topics: [topic] }),
      availableBrokerIds(admin),
    ]);
    const replicas = metadata.topics[0]?.partitions[0]?.replicas.length ?? 0;
    return new PartitionsNotAddedError(
      topic,
      partitions,
      wanted,
      `the topic has ${replicas} replicas per partition and the cluster fewer brokers (` +
        `${ids.length} available: node ids ${ids.join(', ') || 'none'}); retried until it has them`,
    );
  }
  if (type === 'TOPIC_AUTHORIZATION_FAILED' || type === 'CLUSTER_AUTHORIZATION_FAILED') {
    return new PartitionsNotAddedError(
      topic,
      partitions,
      wanted,
      `${type}: this client's Kafka principal needs the Alter operation on the topic ` +
        '(CreatePartitions; docs/operator.md, "Kafka topics")',
    );
  }
  if (type !== undefined) {
    const message = err instanceof Error ? err.message : String(err);
    return new PartitionsNotAddedError(topic, partitions, wanted, `${type}: ${message}`);
  }
  return err instanceof Error ? err : new Error(String(err));
}

/**
 * Resolves once every topic of `topics` has at least `minPartitions` partitions and each a leader
 * that serves it. kafkajs' own `waitForLeaders` asks the
 * broker that took the CreateTopics request and gives up on UNKNOWN_TOPIC_OR_PARTITION, which a
 * broker of a multi-broker KRaft cluster answers until the new topic reached its metadata cache
 * (seen on three brokers, docs/faults.md window 18): here any answer short of every leader is
 * asked again, within `timeoutMs`.
 */
export async function waitForLeaders(
  admin: Admin,
  topics: readonly string[],
  timeoutMs = 30_000,
  minPartitions = 1,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (let delay = 50; ; delay = Math.min(delay * 2, 1_000)) {
    const ready = await admin
      .fetchTopicMetadata({ topics: [...topics] })
      .then((m) =>
        m.topics.every(
          (t) => t.partitions.length >= minPartitions && t.partitions.every((x) => x.leader >= 0),
        ),
      )
      // A leader named in the metadata may not serve its partition yet: the offsets read (sent to
      // each leader) answers NOT_LEADER_OR_FOLLOWER until it does (seen 2026-12-06 on one broker).
      .then(async (named) => {
        if (!named) return false;
        await Promise.all(topics.map((t) => admin.fetchTopicOffsets(t)));
        return true;
      })
      .catch(() => false);
    if (ready) return;
    if (Date.now() >= deadline)
      throw new Error(`topics ${topics.join(', ')}: no leader for every partition within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, delay));
  }
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
    await sleep(delay);
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

/** Committed handled offset per partition (absent: nothing handled there yet). */
export type HandledOffsets = Map<number, bigint>;

export async function handledOffsets(admin: Admin, topics: TopicNames): Promise<HandledOffsets> {
  const committed = await admin.fetchOffsets({ groupId: topics.dlqHandledGroup, topics: [topics.dlq] });
  const out: HandledOffsets = new Map();
  for (const t of committed)
    for (const p of t.partitions) if (BigInt(p.offset) >= 0n) out.set(p.partition, BigInt(p.offset));
  return out;
}

/**
 * Dead letters not yet handled: per partition, the messages from the handled offset (or the
 * oldest message still held, whichever is later: retention may have deleted some) to the end.
 * Unlike the depth (high - low), a replay or an acknowledgement lowers it.
 */
export async function dlqUnhandled(admin: Admin, topics: TopicNames): Promise<number> {
  const [ends, handled] = await Promise.all([
    admin.fetchTopicOffsets(topics.dlq),
    handledOffsets(admin, topics),
  ]);
  let n = 0n;
  for (const p of ends) {
    const low = BigInt(p.low);
    const h = handled.get(p.partition) ?? low;
    const from = h > low ? h : low;
    const high = BigInt(p.high);
    if (high > from) n += high - from;
  }
  return Number(n);
}

/**
 * The handled offsets after handling `handled` (pure). Per partition, the offset moves over the
 * messages that follow it in order as long as each one is handled (now or before): a handled
 * message after an unhandled one does not move it, so the count never hides a dead letter nobody
 * looked at. `messages` are the DLQ's messages as read (partition, offset), in any order.
 */
export function advanceHandled(
  current: HandledOffsets,
  messages: readonly { partition: number; offset: string }[],
  handled: ReadonlySet<string>,
): HandledOffsets {
  const byPartition = new Map<number, bigint[]>();
  for (const m of messages) {
    const list = byPartition.get(m.partition) ?? [];
    list.push(BigInt(m.offset));
    byPartition.set(m.partition, list);
  }
  const next: HandledOffsets = new Map(current);
  for (const [partition, offsets] of byPartition) {
    offsets.sort((x, y) => (x < y ? -1 : x > y ? 1 : 0));
    let at = current.get(partition);
    for (const o of offsets) {
      if (at !== undefined && o < at) continue;
      if (!handled.has(`${partition}:${o}`)) break;
      at = o + 1n;
    }
    if (at !== undefined) next.set(partition, at);
  }
  return next;
}

/**
 * Commits handled offsets for the DLQ (never moving one back: two operators acknowledging at once
 * cannot un-handle each other's messages). Returns the offsets now committed.
 */
export async function commitHandled(
  admin: Admin,
  topics: TopicNames,
  compute: (current: HandledOffsets) => HandledOffsets,
): Promise<HandledOffsets> {
  const current = await handledOffsets(admin, topics);
  const next = compute(current);
  const partitions = [...next]
    .filter(([p, o]) => o > (current.get(p) ?? -1n))
    .map(([partition, offset]) => ({ partition, offset: offset.toString() }));
  if (partitions.length > 0)
    await admin.setOffsets({ groupId: topics.dlqHandledGroup, topic: topics.dlq, partitions });
  const out: HandledOffsets = new Map(current);
  for (const [p, o] of next) if (o > (out.get(p) ?? -1n)) out.set(p, o);
  return out;
}
