/**
 * The consumer role: Kafka -> PostgreSQL. Orders and their journal rows are inserted in one
 * transaction per chunk; the database's unique keys (reservation id; live buyer slot) decide what
 * is new, so a redelivered message never becomes a second order and no "consumed" marker is ever
 * written ahead of the order. Offsets are committed only after the DB commit; then buyers'
 * results are written to Redis (best effort: the api falls back to PostgreSQL and the order-gap
 * job rewrites missing results).
 *
 * Nothing in a message is trusted (Kafka is reachable by more than the relay): every message is
 * checked against the activity's items in PostgreSQL (activity_items, written by the operator
 * before it loads the cache) and against the reservation id's derivation. The order's price and
 * name are taken from PostgreSQL; a message whose price, quantity, slot, buyer or reservation id
 * does not fit goes to the DLQ at once with the reason, never into `orders`.
 *
 * A Kafka message holds one order or, from the relay, a batch of orders (core/order-message.ts,
 * ORDER_BATCH_HEADER). Each order of a batch is checked, retried and sent to the DLQ on its own;
 * a message's offset is committed once all its orders are written, so a chunk never splits one.
 *
 * Failures: transient ones (database or network: a connection lost, a server that cannot write
 * for now, disk full or read-only included; core/db/pool.ts isTransientDbError) are retried with
 * backoff for as long as it takes; a message that fails for any other reason is retried
 * CONSUMER_MAX_ATTEMPTS times and then sent to the DLQ with the error in its headers. One that is
 * not an order message at all (or a batch message whose line count is not its header's) goes to
 * the DLQ at once: it will not parse any better.
 *
 * kafkajs restarts its consumer only after a retriable crash. Some crashes during a broker
 * restart are classed non-retriable (KafkaJSGroupCoordinatorNotFound while the coordinator is
 * still loading), and after one kafkajs stays disconnected while the process looks healthy. So a
 * crash that kafkajs will not restart is restarted here, with a fresh kafkajs consumer and backoff;
 * the uncommitted messages are redelivered and the unique keys absorb them.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Consumer, EachBatchPayload, KafkaMessage, Message, Producer } from 'kafkajs';
import { recordResults } from '../../core/activity-cache.js';
import type { StoredResult } from '../../core/activity-cache.js';
import { crashPoint } from '../../core/crash.js';
import { KAFKA_DISCONNECT_GRACE_MS, settlesWithin } from '../../core/deadline.js';
import { readActivityItems } from '../../core/db/activity-items-store.js';
import type { ActivityItem } from '../../core/db/activity-items-store.js';
import { insertOrders } from '../../core/db/orders-store.js';
import { PARTITION_REQUEST_MAX_BYTES, recordBytes } from '../../core/kafka.js';
import type { InsertOutcome } from '../../core/db/orders-store.js';
import { inTransaction, isTransientDbError } from '../../core/db/pool.js';
import type { Pool } from '../../core/db/pool.js';
import type { Logger } from '../../core/logger.js';
import type { Metrics } from '../../core/metrics.js';
import { ORDER_BATCH_HEADER, orderMessageSchema, orderTextsOf } from '../../core/order-message.js';
import { refusalOf } from '../../core/order-refusal.js';
import type { OrderMessage } from '../../core/order-message.js';
import type { RedisClient } from '../../core/scripts.js';
import { StockGuard } from '../../core/stock-guard.js';
import type { GuardedOrder } from '../../core/stock-guard.js';

export interface ConsumerOptions {
  activityId: string;
  topic: string;
  dlqTopic: string;
  /** Called at start and again after each crash kafkajs does not restart by itself. */
  createConsumer: () => Consumer;
  /** Dead letters' producer: a RenewingProducer in the role (a fresh one after a failed send). */
  dlqProducer: Pick<Producer, 'connect' | 'disconnect' | 'send'>;
  pool: Pool;
  redis: RedisClient;
  metrics: Metrics;
  logger: Logger;
  batchSize: number;
  /** Partitions processed at the same time (default 1). */
  partitionConcurrency?: number;
  maxAttempts: number;
  paymentTimeoutSeconds: number;
}

class PoisonMessage extends Error {}

/** What a dead letter keeps of a value too large to be an order of ours (deadLetter). */
const DLQ_VALUE_KEPT_BYTES = 64 * 1024;

/**
 * Longest the consumer waits between two heartbeat calls while it sleeps. kafkajs 2.2.4 sends no
 * heartbeat in the background: while a chunk is processed only the consumer's own calls keep it a
 * member of the group. `heartbeat()` of eachBatch sends one only once the heartbeat interval has
 * passed since the last, so calling it often costs nothing.
 */
const HEARTBEAT_SLICE_MS = 250;

const ORDER_CREATED = { event: 'ORDER_CREATED', toStatus: 'UNPAID' } as const;

/** A message that contradicts the activity's own data: sent to the DLQ at once, never retried. */
class RefusedMessage extends Error {
  constructor(
    readonly reason: string,
    detail: string,
  ) {
    super(`refused: ${reason}: ${detail}`);
  }
}

/** Why a message went to the DLQ (`flashsale_dlq_messages_total{reason}`). */
const DLQ_REASONS = ['refused', 'invalid', 'failed'] as const;

/** What the consumer can do right now (its /readyz reports it). */
export type ConsumerState = 'starting' | 'joining' | 'consuming' | 'restarting' | 'stopped';

type GuardedOutcome = InsertOutcome & { guarded: GuardedOrder[] };

/** One order of a Kafka message: its text, and the order or why it is not one. */
interface Parsed {
  message: KafkaMessage;
  /** Its line in a batch message; undefined for a message of one order. */
  index?: number | undefined;
  text: string;
  order?: OrderMessage;
  error?: string;
}

/** How long a stop waits for kafkajs' disconnect (the chunk in flight, the commit, the group leave). */
export const CONSUMER_STOP_GRACE_MS = 5_000;

export class OrderConsumer {
  /** Attempts per offset for messages failing for non-transient reasons. */
  private readonly attempts = new Map<string, number>();
  /** The activity's items from PostgreSQL; re-read when a message does not fit them. */
  private items: Map<string, ActivityItem> | undefined;

  private consumer: Consumer | undefined;
  private stopped = false;
  private state: ConsumerState = 'starting';
  private restartTimer: NodeJS.Timeout | undefined;
  /** Restarts in a row that failed to get going; resets once a batch was processed. */
  private restarts = 0;

  /** The PostgreSQL stock and buyer-limit guard, applied in every insert transaction. */
  private readonly guard: StockGuard;

  constructor(private readonly options: ConsumerOptions) {
    this.guard = new StockGuard(options);
    // Exported from 0, so that the first dead letter is an increase the new-dead-letters alert sees,
    // and the first chunk of orders one the dashboards' increase() and rate() count
    // (core/metrics.ts stockReturnsFromZero says why).
    for (const reason of DLQ_REASONS)
      options.metrics.dlqSent.inc({ activity: options.activityId, reason }, 0);
    for (const status of ['UNPAID', 'CLOSED'] as const)
      options.metrics.orders.inc({ activity: options.activityId, status }, 0);
  }

  async start(): Promise<void> {
    await this.options.dlqProducer.connect();
    await this.run();
  }

  /** 'consuming' once the group assigned partitions; 'joining' while (re)joining the group. */
  status(): ConsumerState {
    return this.state;
  }

  private async run(): Promise<void> {
    const consumer = this.options.createConsumer();
    this.consumer = consumer;
    this.state = 'joining';
    const mine = (): boolean => this.consumer === consumer && !this.stopped;
    consumer.on(consumer.events.GROUP_JOIN, () => {
      if (mine()) this.state = 'consuming';
    });
    consumer.on(consumer.events.REBALANCING, () => {
      if (mine()) this.state = 'joining';
    });
    consumer.on(consumer.events.CRASH, (e) => {
      if (!mine()) return;
      this.state = 'restarting';
      if (e.payload.restart) return;
      this.scheduleRestart(e.payload.error);
    });
    await consumer.connect();
    await consumer.subscribe({ topic: this.options.topic, fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      // Partitions are independent (the unique keys decide, not the order of arrival), so their
      // batches can be written side by side; within a partition batches stay in order.
      partitionsConsumedConcurrently: this.options.partitionConcurrency ?? 1,
      eachBatch: (payload) => this.onBatch(payload),
    });
  }

  private scheduleRestart(cause: Error): void {
    this.restarts += 1;
    const delay = Math.min(500 * 2 ** Math.min(this.restarts - 1, 6), 30_000);
    this.options.metrics.consumerRetries.inc({
      activity: this.options.activityId,
      reason: 'consumer_restart',
    });
    this.options.logger.warn(
      { err: cause.message, errName: cause.name, delayMs: delay, restarts: this.restarts },
      'kafka consumer stopped on an error kafkajs does not restart; restarting it',
    );
    this.restartTimer = setTimeout(() => {
      this.restartTimer = undefined;
      if (this.stopped) return;
      const old = this.consumer;
      void (async () => {
        await old?.disconnect().catch(() => undefined);
        if (this.stopped) return;
        try {
          await this.run();
        } catch (err) {
          // connect/subscribe failed (the broker is still away): try again later.
          if (!this.stopped) this.scheduleRestart(err as Error);
        }
      })();
    }, delay);
  }

  /** kafkajs finishes the batch in flight before disconnecting. */
  /**
   * Finishes the chunk in flight (its transaction, results and offsets), then leaves the group.
   * What waits on a Kafka that does not answer (the offset commit, the group leave) is let go after
   * CONSUMER_STOP_GRACE_MS: the orders are in PostgreSQL before their offsets are committed, so an
   * offset left uncommitted only means a message read again, which the unique keys absorb.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    this.state = 'stopped';
    if (this.restartTimer) clearTimeout(this.restartTimer);
    if (this.consumer && !(await settlesWithin(this.consumer.disconnect(), CONSUMER_STOP_GRACE_MS))) {
      this.options.logger.warn(
        { graceMs: CONSUMER_STOP_GRACE_MS },
        'stopping without leaving the group (Kafka not answering); offsets not committed are read again',
      );
    }
    await settlesWithin(this.options.dlqProducer.disconnect(), KAFKA_DISCONNECT_GRACE_MS);
  }

  /** The orders of one Kafka message (several when it is a batch). */
  private parse(message: KafkaMessage): Parsed[] {
    const header = message.headers?.[ORDER_BATCH_HEADER];
    const batch = header === undefined ? undefined : String(header);
    const value = message.value?.toString('utf8') ?? '';
    const texts = orderTextsOf(value, batch);
    if (!texts) {
      // Not a batch the relay writes: one dead letter for the whole message, not one per line.
      return [
        {
          message,
          text: value,
          error: `not a batch of orders: its ${ORDER_BATCH_HEADER} header is ${batch}`,
        },
      ];
    }
    return texts.map((text, i) => this.parseOne(message, text, batch === undefined ? undefined : i));
  }

  private parseOne(message: KafkaMessage, text: string, index: number | undefined): Parsed {
    try {
      const raw: unknown = JSON.parse(text);
      const r = orderMessageSchema.safeParse(raw);
      if (!r.success)
        return { message, index, text, error: `invalid order message: ${r.error.issues[0]?.message ?? ''}` };
      if (r.data.activityId !== this.options.activityId)
        return { message, index, text, error: 'message of another activity' };
      return { message, index, text, order: r.data };
    } catch (err) {
      return { message, index, text, error: `unparseable message: ${(err as Error).message}` };
    }
  }

  private async onBatch(p: EachBatchPayload): Promise<void> {
    const { batch } = p;
    // Chunks of about CONSUMER_BATCH_SIZE orders, always whole messages: an offset is resolved only
    // when every order of its message is written.
    for (let i = 0; i < batch.messages.length;) {
      if (!p.isRunning() || p.isStale()) return;
      const chunk: Parsed[] = [];
      while (i < batch.messages.length && chunk.length < this.options.batchSize)
        for (const parsed of this.parse(batch.messages[i++]!)) chunk.push(parsed);
      await this.processChunk(chunk, p);
      p.resolveOffset(chunk[chunk.length - 1]!.message.offset);
      // With autoCommit off, kafkajs commits only the offsets it is handed.
      await p.commitOffsetsIfNecessary(p.uncommittedOffsets());
      await p.heartbeat();
      this.restarts = 0;
    }
  }

  /**
   * Splits parsed orders into those that fit the activity's items (price and name rebuilt from
   * PostgreSQL) and those refused. The items are read once and re-read when something does not
   * fit (an item added during the sale) before anything is refused.
   */
  private async check(parsed: Parsed[]): Promise<{ good: Parsed[]; refused: [Parsed, RefusedMessage][] }> {
    const judge = (items: Map<string, ActivityItem>) =>
      parsed.map((c) => ({ c, why: refusalOf(c.order!, items.get(c.order!.skuId)) }));
    this.items ??= await readActivityItems(this.options.pool, this.options.activityId);
    let verdicts = judge(this.items);
    if (verdicts.some((v) => v.why)) {
      this.items = await readActivityItems(this.options.pool, this.options.activityId);
      verdicts = judge(this.items);
    }
    const items = this.items;
    const good: Parsed[] = [];
    const refused: [Parsed, RefusedMessage][] = [];
    for (const { c, why } of verdicts) {
      if (why) {
        refused.push([c, new RefusedMessage(why[0], why[1])]);
        continue;
      }
      const item = items.get(c.order!.skuId)!;
      good.push({ ...c, order: { ...c.order!, unitPrice: item.price, itemName: item.name } });
    }
    return { good, refused };
  }

  private async processChunk(chunk: Parsed[], p: EachBatchPayload): Promise<void> {
    // An unparseable or invalid message will not parse next time either: dead-lettered at once,
    // all of the chunk's in one send. Attempts with pauses for each would let a few thousand junk
    // lines, from anyone who can write to the topic, hold every order behind them for minutes.
    const poison = chunk.filter((c) => c.error);
    if (poison.length > 0) {
      await this.toDlq(
        poison.map((c) => ({ c, err: new PoisonMessage(c.error) })),
        p,
        1,
      );
      await this.beat(p);
    }
    let good: Parsed[] = [];
    for (let delay = 100; ; delay = Math.min(delay * 2, 5_000)) {
      try {
        const checked = await this.check(chunk.filter((c) => c.order));
        if (checked.refused.length > 0) {
          await this.toDlq(
            checked.refused.map(([c, err]) => ({ c, err })),
            p,
            1,
          );
          await this.beat(p);
        }
        good = checked.good;
        break;
      } catch (err) {
        if (!p.isRunning() || !isTransientDbError(err)) throw err;
        this.options.metrics.consumerRetries.inc({ activity: this.options.activityId, reason: 'transient' });
        await this.pause(delay, p);
      }
    }

    let delay = 100;
    for (;;) {
      try {
        const outcome = await this.insert(good.map((g) => g.order!));
        await this.afterCommit(
          good.map((g) => g.order!),
          outcome,
        );
        return;
      } catch (err) {
        if (!p.isRunning()) throw err;
        if (isTransientDbError(err)) {
          this.options.metrics.consumerRetries.inc({
            activity: this.options.activityId,
            reason: 'transient',
          });
          this.options.logger.warn(
            { err: (err as Error).message, delayMs: delay },
            'transient failure; retrying batch',
          );
          await this.pause(delay, p);
          delay = Math.min(delay * 2, 5_000);
          continue;
        }
        if (good.length > 1) {
          // Isolate the message that fails: insert one by one, heartbeating between them (a chunk
          // of hundreds of orders written one at a time can outlast the session timeout).
          for (const g of good) {
            await this.beat(p);
            await this.processChunk([g], p);
          }
          return;
        }
        const only = good[0];
        if (!only) return;
        const done = await this.failed(only, err as Error, p);
        if (done) return;
        good = [only];
      }
    }
  }

  /**
   * A heartbeat if the heartbeat interval has passed (kafkajs throttles it), so that a chunk that
   * takes long (retries, dead letters, orders isolated one by one) keeps the member in its group:
   * without one for the session timeout the member is evicted, its commit fails and the chunk is
   * processed again after the rejoin (every poison order dead-lettered once more). A failed
   * heartbeat is left to the commit after the chunk, which sees the rebalance or eviction too.
   */
  private async beat(p: EachBatchPayload): Promise<void> {
    await p.heartbeat().catch(() => undefined);
  }

  /** Sleeps, heartbeating at least every HEARTBEAT_SLICE_MS however long the sleep. */
  private async pause(ms: number, p: EachBatchPayload): Promise<void> {
    for (let left = ms; left > 0; left -= HEARTBEAT_SLICE_MS) {
      await sleep(Math.min(left, HEARTBEAT_SLICE_MS));
      await this.beat(p);
    }
  }

  /** Counts a non-transient failure; returns true once the message went to the DLQ. */
  private async failed(c: Parsed, err: Error, p: EachBatchPayload): Promise<boolean> {
    const key = `${p.batch.partition}:${c.message.offset}:${c.index ?? ''}`;
    const n = (this.attempts.get(key) ?? 0) + 1;
    this.attempts.set(key, n);
    this.options.metrics.consumerRetries.inc({ activity: this.options.activityId, reason: 'poison' });
    if (n < this.options.maxAttempts) {
      await this.pause(50 * n, p);
      return false;
    }
    await this.toDlq([{ c, err }], p, n);
    this.attempts.delete(key);
    return true;
  }

  /**
   * A dead letter holds one order as a message of its own, so that `dlq replay` sends back that
   * order alone; one from a batch gets the key and headers a message of one order has, and the
   * order's line in the batch. All of them in one send: the producer splits a send into requests
   * the topic's message size takes (core/kafka.ts `requestsOf`), so thousands of junk lines cost a
   * few requests, not one round trip each.
   */
  private async toDlq(
    letters: { c: Parsed; err: Error }[],
    p: EachBatchPayload,
    attempts: number,
  ): Promise<void> {
    await this.options.dlqProducer.send({
      topic: this.options.dlqTopic,
      acks: -1,
      messages: letters.map(({ c, err }) => this.deadLetter(c, err, p, attempts)),
    });
    for (const { c, err } of letters) {
      this.options.metrics.dlqSent.inc({
        activity: this.options.activityId,
        reason: (err instanceof RefusedMessage
          ? 'refused'
          : err instanceof PoisonMessage
            ? 'invalid'
            : 'failed') satisfies (typeof DLQ_REASONS)[number],
      });
      this.options.logger.error(
        { offset: c.message.offset, index: c.index, partition: p.batch.partition, err: err.message },
        'message sent to DLQ',
      );
    }
  }

  /**
   * One dead letter. A record larger than one produce request may carry (key, value and headers,
   * PARTITION_REQUEST_MAX_BYTES) is not an order of ours: it keeps the first DLQ_VALUE_KEPT_BYTES
   * of its value and the dlq-* headers only, its size in `dlq-truncated`, so that it fits the DLQ
   * topic's message size, which a refused send (MESSAGE_TOO_LARGE) would retry for ever.
   */
  private deadLetter(c: Parsed, err: Error, p: EachBatchPayload, attempts: number): Message {
    const fromBatch = c.index !== undefined;
    const value = fromBatch ? Buffer.from(c.text) : (c.message.value ?? Buffer.alloc(0));
    const dlqHeaders = {
      'dlq-error': err.message.slice(0, 1000),
      ...(err instanceof RefusedMessage ? { 'dlq-reason': err.reason } : {}),
      'dlq-attempts': String(attempts),
      'dlq-original-topic': p.batch.topic,
      'dlq-original-partition': String(p.batch.partition),
      'dlq-original-offset': c.message.offset,
    };
    const letter: Message = {
      key: fromBatch ? (c.order?.userId ?? null) : c.message.key,
      value,
      headers: {
        ...(fromBatch
          ? {
              'trace-id': c.order?.traceId ?? '',
              'reservation-id': c.order?.reservationId ?? '',
              'dlq-original-index': String(c.index),
            }
          : c.message.headers),
        ...dlqHeaders,
      },
    };
    const size = recordBytes(letter);
    if (size <= PARTITION_REQUEST_MAX_BYTES) return letter;
    return {
      key: null,
      value: value.subarray(0, DLQ_VALUE_KEPT_BYTES),
      headers: { ...dlqHeaders, 'dlq-truncated': String(size) },
    };
  }

  private async insert(orders: OrderMessage[]): Promise<GuardedOutcome> {
    await this.guard.prepare(orders);
    // inTransaction drops a connection whose query timed out (a server that stopped answering)
    // instead of handing it to the next batch, which would wait on it again.
    const result = await inTransaction(this.options.pool, async (client) => {
      // Each inserted order's ORDER_CREATED journal row is written by the same statement.
      const outcome = await insertOrders(client, orders, this.options.paymentTimeoutSeconds, ORDER_CREATED);
      const guarded = [
        ...(await this.guard.enforce(client, orders, outcome.inserted)),
        ...(await this.guard.closeSlotConflicts(client, orders, outcome.rejected)),
      ];
      crashPoint('consumer-before-db-commit');
      return { ...outcome, guarded };
    });
    crashPoint('consumer-after-db-commit');
    return result;
  }

  private async afterCommit(orders: OrderMessage[], outcome: GuardedOutcome): Promise<void> {
    if (outcome.inserted.size > 0)
      this.options.metrics.orders.inc(
        { activity: this.options.activityId, status: 'UNPAID' },
        outcome.inserted.size,
      );
    const byRid = new Map(orders.map((o) => [o.reservationId, o]));
    const guarded = new Map(outcome.guarded.map((g) => [g.order.reservationId, g.reason]));
    const results: StoredResult[] = [];
    for (const [rid, orderId] of outcome.inserted) {
      const reason = guarded.get(rid);
      results.push({
        reservationId: rid,
        userId: byRid.get(rid)!.userId,
        skuId: byRid.get(rid)!.skuId,
        result: reason ? { status: 'FAILED', reason } : { status: 'CREATED', orderId },
      });
    }
    await this.guard.compensate(outcome.guarded);
    for (const [rid, row] of outcome.existing) {
      const result =
        row.status === 'CLOSED'
          ? { status: 'FAILED' as const, reason: 'CLOSED' }
          : { status: 'CREATED' as const, orderId: row.id };
      results.push({
        reservationId: rid,
        userId: byRid.get(rid)!.userId,
        skuId: byRid.get(rid)!.skuId,
        result,
      });
    }
    for (const rid of outcome.rejected) {
      // Another live order holds this buyer slot: the database refused a second one, and the
      // guard stored it CLOSED (settled with the guard's closures above), unless another path
      // closed it first and settles it itself.
      const o = byRid.get(rid)!;
      results.push({
        reservationId: rid,
        userId: o.userId,
        skuId: o.skuId,
        result: { status: 'FAILED', reason: guarded.get(rid) ?? 'LIMIT_REACHED' },
      });
    }
    crashPoint('consumer-before-results');
    await recordResults(this.options.redis, this.options.activityId, results).catch((err: Error) =>
      this.options.logger.warn(
        { err: err.message },
        'result update failed; the order-gap job will rewrite it',
      ),
    );
  }
}
