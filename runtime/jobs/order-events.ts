/**
 * The order-event relay (docs/order-events.md): publishes the PostgreSQL outbox `order_events`
 * (written by triggers in the transaction of every order state change) to `<prefix>.order-events`
 * with the idempotent producer, key = order id.
 *
 * One loop: in one transaction, lock a batch of events that are each the oldest unpublished event
 * of their order (SKIP LOCKED), send them, and only after Kafka acknowledged them mark them
 * published and commit. A relay killed after the acks and before the commit leaves them
 * unpublished and unlocked: they are sent again (at least once, same event id), and no later event
 * of the same order can have been sent in between (it was not eligible). Any number of relays,
 * per activity or platform-wide, may run at once: ordering per order holds by construction.
 *
 * `activityId` undefined serves every activity (a platform-level after-sale process).
 *
 * A send that outlives ORDER_EVENTS_SEND_TIMEOUT_MS is cancelled, not abandoned. kafkajs 2.2.4 has
 * no way to stop a send: its idempotent producer retries without end, and a retry that finds the
 * producer disconnected connects it again (producer/sendMessages.js), so a producer merely
 * disconnected would deliver its stale copy of event n whenever Kafka came back, possibly after
 * event n+1 sent since by a fresh producer. Instead the batch's message headers refuse to be read
 * once the send is cancelled: every later attempt fails while encoding its request, before a byte
 * is written, with an error kafkajs does not retry, so the send settles. The transaction rolls back
 * at the timeout (its locks and snapshot are not held through an outage), but this relay sends
 * nothing more, and creates no other producer, until the cancelled send has settled and its
 * producer is disconnected: one producer at a time, none left behind reconnecting.
 *
 * Before its first send the relay prepares the topic (`prepareTopic`: created as configured when
 * missing). An existing topic with less replication than configured is refused
 * (TopicReplicationError): the relay publishes nothing, says so in
 * `flashsale_order_events_topic_under_replicated`, and checks again every
 * ORDER_EVENTS_TOPIC_RETRY_MS; the events wait in PostgreSQL. A missing topic the brokers refuse to
 * create as configured (TopicBrokersError: fewer brokers available than the replication factor)
 * is waited for the same way, logged once, without the gauge. The backlog gauges are sampled from
 * PostgreSQL on their own timer, so they keep rising through a Kafka outage or a refusal instead of
 * freezing with the loop; a sample PostgreSQL does not answer leaves
 * `flashsale_order_events_last_sample_timestamp_seconds` behind. The gauges exist only once this
 * relay has sampled (labelled by topic), so where no relay runs there is no series to read as "0
 * waiting" (FlashSaleOrderEventsRelayMissing).
 */
import type { IHeaders, Producer } from 'kafkajs';
import { crashPoint } from '../../core/crash.js';
import { KAFKA_DISCONNECT_GRACE_MS, settlesWithin } from '../../core/deadline.js';
import {
  claimPublishableEvents,
  eventBacklog,
  markEventsPublished,
  purgePublishedEvents,
} from '../../core/db/order-events-store.js';
import { inTransaction } from '../../core/db/pool.js';
import type { Pool } from '../../core/db/pool.js';
import type { Logger } from '../../core/logger.js';
import { TopicBrokersError, TopicReplicationError } from '../../core/kafka.js';
import type { Metrics } from '../../core/metrics.js';

export interface OrderEventRelayConfig {
  ORDER_EVENTS_BATCH_SIZE: number;
  ORDER_EVENTS_POLL_MS: number;
  ORDER_EVENTS_RETENTION_HOURS: number;
  ORDER_EVENTS_SEND_TIMEOUT_MS: number;
  ORDER_EVENTS_TOPIC_RETRY_MS: number;
  ORDER_EVENTS_BACKLOG_SAMPLE_MS: number;
}

export interface OrderEventRelayDeps {
  cfg: OrderEventRelayConfig;
  activityId: string | undefined;
  topic: string;
  pool: Pool;
  logger: Logger;
  metrics: Metrics;
  createProducer: () => Producer;
  /**
   * Creates the topic if missing and checks an existing one's replication (TopicReplicationError);
   * omitted when the caller made the topic itself. `stopping` is aborted when the relay stops:
   * the relay no longer waits for it then, and the preparation should let go of its connection.
   */
  prepareTopic?: (stopping: AbortSignal) => Promise<void>;
}

const PURGE_EVERY_MS = 60_000;
/**
 * How long a stop lets a send in flight finish before cancelling it as the send timeout does (the
 * batch rolled back, sent again by the next relay: at least once, in order). A healthy send takes
 * milliseconds; with Kafka away it would hold the stop for ORDER_EVENTS_SEND_TIMEOUT_MS (30 s),
 * past the role's SHUTDOWN_TIMEOUT_MS (20 s).
 */
const STOP_SEND_GRACE_MS = 5_000;

/**
 * Settles as `work` does, or with `undefined` once `stopping` is aborted first (the listener is
 * removed when `work` settles, so a long-lived relay does not collect one per call).
 */
function unlessStopped<T>(work: Promise<T>, stopping: AbortSignal): Promise<{ value: T } | undefined> {
  if (stopping.aborted) return Promise.resolve(undefined);
  return new Promise((resolve, reject) => {
    const onStop = (): void => resolve(undefined);
    stopping.addEventListener('abort', onStop, { once: true });
    work.then(
      (value) => {
        stopping.removeEventListener('abort', onStop);
        resolve({ value });
      },
      (err: unknown) => {
        stopping.removeEventListener('abort', onStop);
        reject(err as Error);
      },
    );
  });
}

/** Thrown by every attempt of a cancelled send; `retriable: false` makes kafkajs give up at once. */
export class OrderEventSendCancelled extends Error {
  readonly retriable = false;
  constructor() {
    super('order-event send cancelled (timed out)');
    this.name = 'OrderEventSendCancelled';
  }
}

/**
 * Headers that throw once `cancelled()` says so. kafkajs reads a message's headers only when it
 * encodes a produce request, once per attempt, just before writing it (protocol/recordBatch/record);
 * the message objects are copied on the way (core/kafka.ts, onePartitionPerRequest), the headers
 * object is not.
 */
export function cancellableHeaders(values: Record<string, string>, cancelled: () => boolean): IHeaders {
  const headers: IHeaders = {};
  for (const [name, value] of Object.entries(values)) {
    Object.defineProperty(headers, name, {
      enumerable: true,
      get: () => {
        if (cancelled()) throw new OrderEventSendCancelled();
        return value;
      },
    });
  }
  return headers;
}

/** A producer whose send failed or was cancelled, and that send (settled = no attempt to come). */
interface RetiredProducer {
  producer: Producer;
  settled: Promise<void>;
}

export class OrderEventRelay {
  private running = false;
  private loop: Promise<void> = Promise.resolve();
  private producer: Producer | undefined;
  private retired: RetiredProducer | undefined;
  private lastPurge = 0;
  private wake: (() => void) | undefined;
  /** Aborted by stop(): whatever waits on Kafka stops waiting (unlessStopped). */
  private stopping = new AbortController();
  /** Cancels the send in flight (set while one is); called STOP_SEND_GRACE_MS after a stop. */
  private abandonSend: (() => void) | undefined;
  private sendsAbandoned = false;
  private topicReady = false;
  private lastRefusal = '';
  private backlogTimer: NodeJS.Timeout | undefined;
  private sampling: Promise<void> | undefined;

  constructor(private readonly d: OrderEventRelayDeps) {}

  async start(): Promise<void> {
    this.running = true;
    this.stopping = new AbortController();
    this.sendsAbandoned = false;
    void this.sampleBacklog();
    this.backlogTimer = setInterval(
      () => void this.sampleBacklog(),
      this.d.cfg.ORDER_EVENTS_BACKLOG_SAMPLE_MS,
    );
    this.backlogTimer.unref();
    this.loop = this.run();
    this.d.logger.info(
      { topic: this.d.topic, scope: this.d.activityId ?? 'every activity' },
      'order-event relay started',
    );
  }

  /**
   * Finishes the batch in flight (cancelled after STOP_SEND_GRACE_MS, as at the send timeout),
   * then stops; a topic preparation or a producer connection still waiting for Kafka is not
   * waited for.
   */
  async stop(): Promise<void> {
    this.running = false;
    clearInterval(this.backlogTimer);
    await this.sampling;
    this.stopping.abort();
    this.wake?.();
    const grace = setTimeout(() => {
      this.sendsAbandoned = true;
      this.abandonSend?.();
    }, STOP_SEND_GRACE_MS);
    await this.loop;
    clearTimeout(grace);
    if (this.producer) await settlesWithin(this.producer.disconnect(), KAFKA_DISCONNECT_GRACE_MS);
    this.producer = undefined;
    const r = this.retired;
    this.retired = undefined;
    if (r) {
      // Not settled yet (Kafka still away): disconnected now, and again once the send has
      // settled, since an attempt in between may have connected it again.
      await settlesWithin(r.producer.disconnect(), KAFKA_DISCONNECT_GRACE_MS);
      void r.settled.then(() => r.producer.disconnect().catch(() => undefined));
    }
  }

  /** The producer of a failed or cancelled send is done with once that send has settled. */
  private async dropRetired(r: RetiredProducer): Promise<void> {
    const over = await unlessStopped(r.settled, this.stopping.signal);
    if (!over) return; // stopping: stop() disconnects it
    await r.producer.disconnect().catch(() => undefined);
    if (this.retired === r) this.retired = undefined;
  }

  private async sleep(ms: number): Promise<void> {
    if (!this.running) return; // stop() has already called wake
    await new Promise<void>((resolve) => {
      const t = setTimeout(resolve, ms);
      this.wake = () => {
        clearTimeout(t);
        resolve();
      };
    });
    this.wake = undefined;
  }

  /** The backlog gauges, from PostgreSQL alone; a sample still running is not started again. */
  sampleBacklog(): Promise<void> {
    this.sampling ??= eventBacklog(this.d.pool, this.d.activityId)
      .then((b) => {
        const topic = { topic: this.d.topic };
        this.d.metrics.orderEventsBacklog.set(topic, b.unpublished);
        this.d.metrics.orderEventsOldestAge.set(topic, b.oldestAgeSeconds);
        this.d.metrics.orderEventsLastSample.set(topic, Date.now() / 1000);
      })
      .catch((err: unknown) => {
        this.d.logger.warn({ err: (err as Error).message }, 'order-event backlog not sampled');
      })
      .finally(() => {
        this.sampling = undefined;
      });
    return this.sampling;
  }

  /** True once the topic may be published to; false (and the gauge says why) while it is refused. */
  private async prepareTopic(): Promise<boolean> {
    if (this.topicReady) return true;
    if (this.d.prepareTopic) {
      try {
        const preparing = this.d.prepareTopic(this.stopping.signal);
        if (!(await unlessStopped(preparing, this.stopping.signal))) {
          preparing.catch(() => undefined); // Kafka away: it fails later, nobody waits for it
          return false;
        }
      } catch (err) {
        if (!(err instanceof TopicReplicationError || err instanceof TopicBrokersError)) throw err;
        // The gauge (and its alert) says the topic exists with less replication; one that cannot be
        // created yet, brokers down, is said by the waiting events' age (FlashSaleOrderEventsStalled).
        if (err instanceof TopicReplicationError)
          this.d.metrics.orderEventsTopicUnderReplicated.set({ topic: this.d.topic }, 1);
        if (err.message !== this.lastRefusal) {
          this.lastRefusal = err.message;
          this.d.logger.error(
            {
              topic: this.d.topic,
              ...(err instanceof TopicReplicationError
                ? { shortfalls: err.shortfalls }
                : { brokers: err.brokers }),
            },
            `order events not published: ${err.message}`,
          );
        }
        return false;
      }
      this.d.metrics.orderEventsTopicUnderReplicated.set({ topic: this.d.topic }, 0);
      if (this.lastRefusal)
        this.d.logger.info({ topic: this.d.topic }, 'order-events topic accepted; publishing');
    }
    this.topicReady = true;
    return true;
  }

  private async run(): Promise<void> {
    while (this.running) {
      try {
        if (!(await this.prepareTopic())) {
          await this.sleep(this.d.cfg.ORDER_EVENTS_TOPIC_RETRY_MS);
          continue;
        }
        if (this.retired) {
          // Nothing is sent before the last send is over: see the head of this file.
          this.d.logger.info('waiting for the cancelled order-event send to settle');
          await this.dropRetired(this.retired);
          continue;
        }
        if (!this.producer) {
          const p = this.d.createProducer();
          const connecting = p.connect();
          try {
            if (!(await unlessStopped(connecting, this.stopping.signal))) {
              // Stopping while Kafka is away: let go of it now, and again once kafkajs has
              // stopped retrying, since a retry in between may have connected it.
              void connecting
                .then(
                  () => p.disconnect(),
                  () => p.disconnect(),
                )
                .catch(() => undefined);
              await p.disconnect().catch(() => undefined);
              break;
            }
          } catch (err) {
            await p.disconnect().catch(() => undefined);
            throw err;
          }
          this.producer = p;
        }
        const sent = await this.publishBatch(this.producer);
        if (Date.now() - this.lastPurge >= PURGE_EVERY_MS) {
          this.lastPurge = Date.now();
          await purgePublishedEvents(this.d.pool, this.d.cfg.ORDER_EVENTS_RETENTION_HOURS * 3600, 5000);
        }
        if (sent === 0) await this.sleep(this.d.cfg.ORDER_EVENTS_POLL_MS);
      } catch (err) {
        if (!this.running) break;
        this.d.logger.warn({ err: (err as Error).message }, 'order-event batch failed; retrying');
        await this.sleep(500);
      }
    }
  }

  /** One batch; returns how many events were published. */
  async publishBatch(producer: Producer): Promise<number> {
    const sent = await inTransaction(this.d.pool, async (c) => {
      const events = await claimPublishableEvents(c, this.d.activityId, this.d.cfg.ORDER_EVENTS_BATCH_SIZE);
      if (events.length === 0) return [];
      let timer: NodeJS.Timeout | undefined;
      let cancelled = false;
      const sending = producer.send({
        topic: this.d.topic,
        acks: -1,
        messages: events.map((e) => ({
          key: e.orderId,
          value: e.payload,
          headers: cancellableHeaders(
            { 'event-id': `${e.orderId}-${e.seq}`, 'activity-id': e.activityId },
            () => cancelled,
          ),
        })),
      });
      try {
        // The transaction (its locks, and a transaction id that holds back vacuum) must not stay
        // open through a Kafka outage: at the timeout the send is cancelled and the batch rolled
        // back, to be sent again once the cancelled send has settled (run()).
        await Promise.race([
          sending,
          new Promise<never>((_, reject) => {
            timer = setTimeout(
              () => reject(new Error('order-event send timed out')),
              this.d.cfg.ORDER_EVENTS_SEND_TIMEOUT_MS,
            );
          }),
          new Promise<never>((_, reject) => {
            const abandon = (): void =>
              reject(new Error('order-event send cancelled: the relay is stopping'));
            if (this.sendsAbandoned) abandon();
            else this.abandonSend = abandon;
          }),
        ]);
      } catch (err) {
        cancelled = true;
        // A failed send may have left its sequence numbers in doubt: a fresh producer sends next,
        // once this one's send is over.
        if (this.producer === producer) this.producer = undefined;
        this.retired = {
          producer,
          settled: sending.then(
            () => undefined,
            () => undefined,
          ),
        };
        throw err;
      } finally {
        clearTimeout(timer);
        this.abandonSend = undefined;
      }
      crashPoint('order-events-after-kafka-ack');
      await markEventsPublished(
        c,
        events.map((e) => e.id),
      );
      return events;
    });
    const perActivity = new Map<string, number>();
    for (const e of sent) perActivity.set(e.activityId, (perActivity.get(e.activityId) ?? 0) + 1);
    for (const [activity, n] of perActivity) this.d.metrics.orderEventsPublished.inc({ activity }, n);
    return sent.length;
  }
}
