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
 */
import type { Producer } from 'kafkajs';
import { crashPoint } from '../../core/crash.js';
import {
  claimPublishableEvents,
  markEventsPublished,
  purgePublishedEvents,
  unpublishedEvents,
} from '../../core/db/order-events-store.js';
import { inTransaction } from '../../core/db/pool.js';
import type { Pool } from '../../core/db/pool.js';
import type { Logger } from '../../core/logger.js';
import type { Metrics } from '../../core/metrics.js';

export interface OrderEventRelayConfig {
  ORDER_EVENTS_BATCH_SIZE: number;
  ORDER_EVENTS_POLL_MS: number;
  ORDER_EVENTS_RETENTION_HOURS: number;
  ORDER_EVENTS_SEND_TIMEOUT_MS: number;
}

export interface OrderEventRelayDeps {
  cfg: OrderEventRelayConfig;
  activityId: string | undefined;
  topic: string;
  pool: Pool;
  logger: Logger;
  metrics: Metrics;
  createProducer: () => Producer;
}

const PURGE_EVERY_MS = 60_000;

export class OrderEventRelay {
  private running = false;
  private loop: Promise<void> = Promise.resolve();
  private producer: Producer | undefined;
  private lastPurge = 0;
  private wake: (() => void) | undefined;

  constructor(private readonly d: OrderEventRelayDeps) {}

  async start(): Promise<void> {
    this.running = true;
    this.loop = this.run();
  }

  /** Finishes the batch in flight, then stops. */
  async stop(): Promise<void> {
    this.running = false;
    this.wake?.();
    await this.loop;
    await this.producer?.disconnect().catch(() => undefined);
  }

  private async sleep(ms: number): Promise<void> {
    await new Promise<void>((resolve) => {
      const t = setTimeout(resolve, ms);
      this.wake = () => {
        clearTimeout(t);
        resolve();
      };
    });
    this.wake = undefined;
  }

  private async run(): Promise<void> {
    while (this.running) {
      try {
        if (!this.producer) {
          const p = this.d.createProducer();
          await p.connect();
          this.producer = p;
        }
        const sent = await this.publishBatch(this.producer);
        if (Date.now() - this.lastPurge >= PURGE_EVERY_MS) {
          this.lastPurge = Date.now();
          this.d.metrics.orderEventsBacklog.set(await unpublishedEvents(this.d.pool, this.d.activityId));
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
      try {
        // The idempotent producer retries without end while Kafka is down; the transaction (and
        // its snapshot, which holds back vacuum) must not stay open that long: give up, roll
        // back, and send the batch again with a fresh producer.
        await Promise.race([
          producer.send({
            topic: this.d.topic,
            acks: -1,
            messages: events.map((e) => ({
              key: e.orderId,
              value: e.payload,
              headers: { 'event-id': `${e.orderId}-${e.seq}`, 'activity-id': e.activityId },
            })),
          }),
          new Promise<never>((_, reject) => {
            timer = setTimeout(
              () => reject(new Error('order-event send timed out')),
              this.d.cfg.ORDER_EVENTS_SEND_TIMEOUT_MS,
            );
          }),
        ]);
      } catch (err) {
        // This producer is done with; the batch is sent again by a fresh one.
        if (this.producer === producer) this.producer = undefined;
        void producer.disconnect().catch(() => undefined);
        throw err;
      } finally {
        clearTimeout(timer);
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
