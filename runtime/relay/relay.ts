/**
 * The relay role: the Kafka outbox. Reads half messages from the activity's stream with a
 * consumer group, produces them with an idempotent producer (acks from all in-sync replicas),
 * and acknowledges + deletes stream entries only after Kafka acknowledged them. Entries left
 * pending by a relay that died are reclaimed (XAUTOCLAIM) after RELAY_RECLAIM_IDLE_MS; a relay's
 * own batch that failed (its send, or a command whose reply it lost) is read again at once from its
 * pending list. A message published twice that way is harmless because the consumer's unique keys
 * absorb it.
 *
 * A send that fails is retried with a fresh producer (new producer id): an idempotent producer
 * whose sequence state the broker lost in a restart would otherwise fail every later send.
 *
 * Streams: the activity's outbox and, for SKUs split into stock buckets, one outbox per bucket
 * (each under its bucket's hash tag, so on a cluster each is read from its own node). Every loop
 * works all of them in turn; the list is re-read from the bucket layout every few seconds (a SKU
 * loaded later). With one stream the loop blocks on it as before.
 *
 * Partition key: the buyer id. One buyer's messages stay on one partition, and buyers spread
 * evenly; a hot SKU does not pin one partition.
 *
 * Order batches: the half messages of one read that go to the same partition travel in one Kafka
 * message of up to RELAY_ORDERS_PER_MESSAGE orders (core/order-message.ts, ORDER_BATCH_HEADER).
 * Kafka's cost is per record (kafkajs' encoding and the garbage it leaves were most of the relay's
 * time, and the consumer's decoding most of its Kafka share), so a batch costs about one record.
 * Nothing changes for the guarantees: a batch is sent, acknowledged and deleted from the outbox
 * as one, exactly as its orders were before; a batch sent twice is absorbed order by order.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { hostname } from 'node:os';
import type { Message } from 'kafkajs';
import { CompressionTypes } from 'kafkajs';
import { KAFKA_DISCONNECT_GRACE_MS, settlesWithin } from '../../core/deadline.js';
import { outboxStreams, readMeta, readOutbox } from '../../core/activity-cache.js';
import { crashPoint } from '../../core/crash.js';
import type { PartitionedProducer } from '../../core/kafka.js';
import { createStreamGroup } from '../../core/redis.js';
import { activityKeys } from '../../core/keys.js';
import type { Logger } from '../../core/logger.js';
import type { Metrics } from '../../core/metrics.js';
import { ORDER_BATCH_HEADER, ORDER_BATCH_MAX_BYTES, OUTBOX_FIELDS } from '../../core/order-message.js';
import type { OrderMessage } from '../../core/order-message.js';
import type { RedisClient } from '../../core/scripts.js';

export const RELAY_GROUP = 'relay';

export interface RelayOptions {
  activityId: string;
  topic: string;
  redis: RedisClient;
  /** A separate connection for blocking reads (XREADGROUP BLOCK would stall other commands). */
  blockingRedis: RedisClient;
  /** Called at start and after each failed send. */
  createProducer: () => PartitionedProducer;
  metrics: Metrics;
  logger: Logger;
  batchSize: number;
  /** Orders per Kafka message at most (1: one message per order, as before batches). */
  ordersPerMessage?: number | undefined;
  reclaimIdleMs: number;
  consumerName?: string | undefined;
}

type StreamEntry = [id: string, fields: string[]];

/**
 * One outbox entry as the Kafka message the relay produces: the value is the entry's JSON message
 * byte for byte, the key (buyer id) and headers come from the entry's own fields. Only an entry
 * written before reserve-9.lua wrote those fields (a sale in flight across an upgrade) is parsed
 * for them. Exported for tests.
 */
export function kafkaMessageOf(fields: string[]): Message & { key: string | null; value: string } {
  let value = '{}';
  let key: string | undefined;
  let traceId: string | undefined;
  let reservationId: string | undefined;
  for (let i = 0; i + 1 < fields.length; i += 2) {
    const v = fields[i + 1]!;
    switch (fields[i]) {
      case OUTBOX_FIELDS.message:
        value = v;
        break;
      case OUTBOX_FIELDS.key:
        key = v;
        break;
      case OUTBOX_FIELDS.traceId:
        traceId = v;
        break;
      case OUTBOX_FIELDS.reservationId:
        reservationId = v;
        break;
    }
  }
  if (key === undefined || traceId === undefined) {
    let parsed: Partial<OrderMessage> = {};
    try {
      parsed = JSON.parse(value) as Partial<OrderMessage>;
    } catch {
      // Published as it is: the consumer sends what it cannot parse to the DLQ.
    }
    key = parsed.userId;
    traceId = parsed.traceId;
    reservationId ??= parsed.reservationId;
  }
  return {
    key: key ?? null,
    value,
    headers: { 'trace-id': traceId ?? '', 'reservation-id': reservationId ?? '' },
  };
}

/**
 * The Kafka messages of a read of outbox entries: each partition's entries (the buyer key through
 * `partitionOf`, the producer's own partitioner) in messages of at most `perMessage` orders and
 * ORDER_BATCH_MAX_BYTES, in the read's order. A message of one order is exactly kafkaMessageOf's;
 * a batch names its partition, has no key and says in its header how many orders it holds.
 * Exported for tests.
 */
export function kafkaMessagesOf(
  entries: readonly string[][],
  perMessage: number,
  partitionOf: (key: string) => number,
): Message[] {
  const singles = entries.map(kafkaMessageOf);
  if (perMessage <= 1) return singles;
  interface Open {
    partition: number;
    items: (Message & { value: string })[];
    bytes: number;
  }
  const open = new Map<number, Open>();
  const out: Message[] = [];
  const close = (o: Open): void => {
    if (o.items.length === 1) out.push({ ...o.items[0]!, partition: o.partition });
    else
      out.push({
        partition: o.partition,
        key: null,
        value: o.items.map((m) => m.value).join('\n'),
        headers: { [ORDER_BATCH_HEADER]: String(o.items.length) },
      });
  };
  for (const m of singles) {
    // A value with a raw newline is not JSON the script wrote (a JSON text never holds one): it
    // travels alone, whole, for the consumer to dead-letter as it is.
    if (m.value.includes('\n')) {
      out.push(m);
      continue;
    }
    // An entry without a buyer (malformed) is partitioned like the others, by its empty key.
    const partition = partitionOf(m.key ?? '');
    const bytes = Buffer.byteLength(m.value) + 1;
    let o = open.get(partition);
    if (o && (o.items.length >= perMessage || o.bytes + bytes > ORDER_BATCH_MAX_BYTES)) {
      close(o);
      o = undefined;
    }
    if (!o) {
      o = { partition, items: [], bytes: 0 };
      open.set(partition, o);
    }
    o.items.push(m);
    o.bytes += bytes;
  }
  for (const o of open.values()) close(o);
  return out;
}

/** How often the list of outbox streams is re-read. */
const STREAMS_REFRESH_MS = 5_000;

/**
 * How long a stop waits for the batch in flight. A healthy batch takes milliseconds; one whose
 * Kafka does not answer is retried by kafkajs for as long as it takes (an idempotent producer
 * never gives up), which held a stop until the role's SHUTDOWN_TIMEOUT_MS (20 s, exit 1). Letting
 * it go is what a SIGKILL does, which the design is built for: the batch's entries stay pending
 * in the outbox and the next relay reclaims them (at least once; the consumer's unique keys absorb
 * a repeat).
 */
export const RELAY_STOP_GRACE_MS = 5_000;

export class Relay {
  private running = false;
  private loop: Promise<void> | undefined;
  private readonly keys;
  private readonly name: string;
  private lastReclaim = 0;
  private producer: PartitionedProducer | undefined;
  /** The outbox stream (and its group) is gone: the activity was cleaned up. */
  private idle = false;
  /** The outbox streams worked (the activity's first), and when the list was read. */
  private streams: string[];
  /** Streams whose group could not be created yet (no stream: the activity was not loaded). */
  private readonly groupless = new Set<string>();
  private streamsReadAt = 0;
  /** Next stream to read (round robin) and the stream of the batch in hand. */
  private turn = 0;
  private stream: string;

  constructor(private readonly options: RelayOptions) {
    this.keys = activityKeys(options.activityId);
    this.name = options.consumerName ?? hostname();
    this.streams = [this.keys.outbox];
    this.stream = this.keys.outbox;
  }

  async start(): Promise<void> {
    // Exported from 0: the first batch is an increase the dashboards' rate() counts
    // (core/metrics.ts stockReturnsFromZero says why).
    this.options.metrics.relayPublished.inc({ activity: this.options.activityId }, 0);
    this.options.metrics.relayReclaimed.inc({ activity: this.options.activityId }, 0);
    await this.refreshStreams(true);
    await this.connectProducer();
    this.running = true;
    this.loop = this.run();
  }

  /** Finishes the batch in flight (or lets it go after RELAY_STOP_GRACE_MS), then stops. */
  async stop(): Promise<void> {
    this.running = false;
    if (this.loop && !(await settlesWithin(this.loop, RELAY_STOP_GRACE_MS))) {
      this.options.logger.warn(
        { graceMs: RELAY_STOP_GRACE_MS },
        'stopping with a batch still in flight (Kafka not answering); its entries stay pending in the outbox for the next relay',
      );
    }
    const producer = this.producer;
    this.producer = undefined;
    if (producer) await settlesWithin(producer.disconnect(), KAFKA_DISCONNECT_GRACE_MS);
  }

  private async connectProducer(): Promise<void> {
    const fresh = this.options.createProducer();
    await fresh.connect();
    this.producer = fresh;
  }

  /**
   * Re-reads the outbox streams (the bucket layout) and creates the relay group on new ones. A
   * stream is created with its group only while the activity is loaded (its meta carries the load
   * mark `gen`) and its cleanup has not begun: a relay (re)started before the load, during a
   * cleanup (which deletes the meta hash last) or after it would otherwise leave an outbox key
   * behind the cleanup that nothing deletes. A stream that does not exist yet gets its group when
   * its first entry arrives (idleWhileGone), or at a refresh once the activity is loaded: a relay
   * started before the load tries every groupless stream again, the activity's own too (which gets
   * no entry when every SKU is bucketed).
   */
  private async refreshStreams(first = false): Promise<void> {
    this.streamsReadAt = Date.now();
    const streams = await outboxStreams(this.options.redis, this.options.activityId);
    const fresh = streams.filter(
      (stream) => first || !this.streams.includes(stream) || this.groupless.has(stream),
    );
    const meta = fresh.length > 0 ? await readMeta(this.options.redis, this.options.activityId) : undefined;
    const loaded = meta !== undefined && meta.generation > 0 && meta.cleanupBeganMs === undefined;
    for (const stream of fresh) {
      try {
        await createStreamGroup(this.options.redis, stream, RELAY_GROUP, { mkstream: Boolean(loaded) });
        this.groupless.delete(stream);
      } catch (err) {
        // Not loaded and no stream (yet, or any more): nothing to read until an entry creates it.
        if (!/requires the key to exist/i.test((err as Error).message)) throw err;
        this.groupless.add(stream);
      }
    }
    this.streams = streams;
  }

  private async run(): Promise<void> {
    // Our own entries left pending by a previous incarnation with the same name come first, on
    // every stream.
    const backlog = new Map<string, string>(this.streams.map((s) => [s, '0']));
    const reclaimedAt = new Map<string, number>();
    while (this.running) {
      try {
        // Re-read even with one stream known: a layout read while Redis was empty (lost, before the
        // operator's cache restore rebuilt it, docs/operator.md "Cache restore") names the
        // activity's stream only, and the buckets' streams come back with the restore.
        if (Date.now() - this.streamsReadAt >= STREAMS_REFRESH_MS) {
          await this.refreshStreams();
          for (const s of this.streams) if (!reclaimedAt.has(s)) backlog.set(s, backlog.get(s) ?? '0');
        }
        const [pending] = backlog.entries();
        if (pending) {
          const [stream, cursor] = pending;
          this.stream = stream;
          const mine = await this.read(cursor, false);
          if (mine.length === 0) backlog.delete(stream);
          else {
            await this.publish(mine, false);
            backlog.set(stream, mine[mine.length - 1]![0]);
          }
          continue;
        }
        this.stream = this.streams[this.turn % this.streams.length]!;
        this.turn += 1;
        if (Date.now() - (reclaimedAt.get(this.stream) ?? 0) >= Math.min(this.options.reclaimIdleMs, 5_000)) {
          reclaimedAt.set(this.stream, Date.now());
          this.lastReclaim = Date.now();
          const reclaimed = await this.reclaim();
          if (reclaimed.length > 0) {
            await this.publish(reclaimed, true);
            continue;
          }
        }
        // One stream: block on it. Several (stock buckets, on several nodes): a blocking read
        // cannot span slots, so each gets a short blocking read in turn.
        const fresh = await this.read('>', true);
        if (fresh.length > 0) await this.publish(fresh, false);
      } catch (err) {
        if (!this.running) break;
        // NOGROUP: the stream (and its group) is gone; UNBLOCKED: it was deleted under a blocked read.
        if (/^(NOGROUP|UNBLOCKED)/.test((err as Error).message)) {
          // Nothing of ours is pending in a stream that is gone (or has no group): left out of the
          // backlog, which is read first, the round-robin goes on to the other streams.
          backlog.delete(this.stream);
          await this.idleWhileGone();
          continue;
        }
        this.options.logger.warn({ err }, 'relay batch failed; retrying');
        // The batch's entries stay pending under this relay's name: whether the send failed or the
        // read's reply was lost (a command timed out, e.g. after the process stood still longer than
        // REDIS_COMMAND_TIMEOUT_MS), they are read again from its own pending list first, at once,
        // not only once RELAY_RECLAIM_IDLE_MS has passed.
        backlog.set(this.stream, '0');
        await sleep(500);
        if (this.producer === undefined) {
          await this.connectProducer().catch((e: Error) =>
            this.options.logger.warn({ err: e.message }, 'kafka producer reconnect failed; retrying'),
          );
        }
      }
    }
  }

  /**
   * The outbox stream is gone (cleanup deleted the activity's keys): nothing can be relayed any
   * more. Said once, then a quiet check every second (never re-creating the stream, which would
   * leave a key behind the cleanup); should the stream come back, its group is created again.
   */
  private async idleWhileGone(): Promise<void> {
    if (!this.idle) {
      this.idle = true;
      this.options.logger.info(
        "the activity's outbox is gone (cleaned up, or not loaded yet): the relay idles",
      );
    }
    await sleep(1_000);
    if ((await this.options.redis.exists(this.stream).catch(() => 0)) === 0) return;
    try {
      await createStreamGroup(this.options.redis, this.stream, RELAY_GROUP, { mkstream: false });
    } catch {
      return;
    }
    this.idle = false;
    this.options.logger.info("the activity's outbox is back: the relay resumes");
  }

  private async read(cursor: string, block: boolean): Promise<StreamEntry[]> {
    const client = block ? this.options.blockingRedis : this.options.redis;
    const args: (string | number)[] = ['GROUP', RELAY_GROUP, this.name, 'COUNT', this.options.batchSize];
    if (block) args.push('BLOCK', this.streams.length > 1 ? 50 : 1000);
    args.push('STREAMS', this.stream, cursor);
    const reply = (await (client.xreadgroup as (...a: (string | number)[]) => Promise<unknown>)(...args)) as
      [string, StreamEntry[]][] | null;
    return (reply?.[0]?.[1] ?? []).filter((e) => e[1] !== null && e[1].length > 0);
  }

  private async reclaim(): Promise<StreamEntry[]> {
    const reply = (await this.options.redis.xautoclaim(
      this.stream,
      RELAY_GROUP,
      this.name,
      this.options.reclaimIdleMs,
      '0-0',
      'COUNT',
      this.options.batchSize,
    )) as [string, (StreamEntry | null)[], string[]?];
    const claimed = reply[1] ?? [];
    // Entries whose payload vanished (deleted while pending) are only acknowledged: Redis 7 lists
    // their ids apart; Redis 6.2 answers an id with a nil payload (acknowledged too), or a bare nil
    // with no id, which stays pending, claimed again, never published, never a reason to fail.
    const deleted = [
      ...(reply[2] ?? []),
      ...claimed.flatMap((e) => (e !== null && e[1] === null ? [e[0]] : [])),
    ];
    if (deleted.length > 0) await this.options.redis.xack(this.stream, RELAY_GROUP, ...deleted);
    return claimed.filter((e): e is StreamEntry => e !== null && e[1] !== null);
  }

  private async publish(entries: StreamEntry[], reclaimed: boolean): Promise<void> {
    const producer = this.producer;
    if (!producer) throw new Error('no kafka producer');
    const perMessage = this.options.ordersPerMessage ?? 1;
    const messages = kafkaMessagesOf(
      entries.map((e) => e[1]),
      perMessage,
      perMessage > 1 ? await producer.partitionerFor(this.options.topic) : () => 0,
    );
    crashPoint('relay-before-kafka-send');
    try {
      await producer.send({
        topic: this.options.topic,
        acks: -1,
        compression: CompressionTypes.None,
        messages,
      });
    } catch (err) {
      // This producer is done with; the batch is retried with a fresh one (see run()).
      this.producer = undefined;
      void producer.disconnect().catch(() => undefined);
      throw err;
    }
    crashPoint('relay-after-kafka-ack');
    const ids = entries.map((e) => e[0]);
    const stream = this.stream;
    // Delete, then acknowledge: a relay that dies between the two leaves ids pending whose entries
    // are gone, which the next reclaim only acknowledges; never an acknowledged entry left in the
    // stream (a half message no relay would read again). Not a MULTI: a Redis at its maxmemory
    // refuses every command queued in one, but takes XDEL and XACK, and deleting these entries is
    // what frees its memory (test/integration/order-path/redis-full.test.ts).
    const replies = await this.options.redis
      .pipeline()
      .xdel(stream, ...ids)
      .xack(stream, RELAY_GROUP, ...ids)
      .exec();
    const failed = replies?.find(([err]) => err)?.[0];
    if (failed) throw failed;
    this.options.metrics.relayPublished.inc({ activity: this.options.activityId }, entries.length);
    if (reclaimed)
      this.options.metrics.relayReclaimed.inc({ activity: this.options.activityId }, entries.length);
  }

  async sampleGauges(): Promise<void> {
    const f = await readOutbox(this.options.redis, this.options.activityId);
    this.options.metrics.outboxHalfMessages.set({ activity: this.options.activityId }, f.halfMessages);
    this.options.metrics.outboxOldestAge.set({ activity: this.options.activityId }, f.oldestAgeSeconds);
  }
}
