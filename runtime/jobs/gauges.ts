/**
 * Scheduled observation of one activity: outbox, stock, consumer lag, DLQ depth and the order
 * gap. The order-gap check also repairs the cheap case: a reservation whose order exists in
 * PostgreSQL but whose result never reached Redis (failure window 5) is confirmed here.
 */
import type { Admin } from 'kafkajs';
import {
  readOutbox,
  readStock,
  recordResults,
  unconfirmedReservations,
  countUnconfirmed,
} from '../../core/activity-cache.js';
import { findByReservationIds } from '../../core/db/orders-store.js';
import type { Pool } from '../../core/db/pool.js';
import { consumerLag, topicDepth } from '../../core/kafka.js';
import type { TopicNames } from '../../core/kafka.js';
import type { Metrics } from '../../core/metrics.js';
import type { RedisClient } from '../../core/scripts.js';

/** Per-SKU gauges stop here: an activity with 100k SKUs must not explode label cardinality. */
const MAX_SKU_SERIES = 500;

export interface GaugeDeps {
  activityId: string;
  redis: RedisClient;
  pool: Pool;
  admin: Admin;
  topics: TopicNames;
  metrics: Metrics;
  gapThresholdSeconds: number;
}

export interface OrderGapReport {
  gap: number;
  repairedResults: number;
  missing: string[];
}

export async function checkOrderGap(
  d: Omit<GaugeDeps, 'admin' | 'topics' | 'metrics'>,
  now = Date.now(),
): Promise<OrderGapReport> {
  const olderThan = now - d.gapThresholdSeconds * 1000;
  const [candidates, total] = await Promise.all([
    unconfirmedReservations(d.redis, d.activityId, olderThan, 1000),
    countUnconfirmed(d.redis, d.activityId, olderThan),
  ]);
  if (candidates.length === 0) return { gap: 0, repairedResults: 0, missing: [] };
  const rows = await findByReservationIds(
    d.pool,
    candidates.map((c) => c.reservationId),
  );
  await recordResults(
    d.redis,
    d.activityId,
    rows.map((r) => ({
      reservationId: r.reservationId,
      userId: r.userId,
      skuId: r.skuId,
      result:
        r.status === 'CLOSED'
          ? { status: 'FAILED', reason: r.closeReason ?? 'CLOSED' }
          : { status: 'CREATED', orderId: r.id },
    })),
  );
  const found = new Set(rows.map((r) => r.reservationId));
  const missing = candidates.map((c) => c.reservationId).filter((rid) => !found.has(rid));
  return { gap: Math.max(0, total - rows.length), repairedResults: rows.length, missing };
}

export async function sampleGauges(d: GaugeDeps): Promise<OrderGapReport> {
  const a = { activity: d.activityId };
  const [outbox, stock, gap] = await Promise.all([
    readOutbox(d.redis, d.activityId),
    readStock(d.redis, d.activityId),
    checkOrderGap(d),
  ]);
  d.metrics.outboxHalfMessages.set(a, outbox.halfMessages);
  d.metrics.outboxOldestAge.set(a, outbox.oldestAgeSeconds);
  for (const s of stock.skus.slice(0, MAX_SKU_SERIES))
    d.metrics.stockRemaining.set({ activity: d.activityId, sku: s.skuId }, s.remaining);
  d.metrics.orderGap.set(a, gap.gap);
  try {
    d.metrics.consumerLag.set(a, await consumerLag(d.admin, d.topics.consumerGroup, d.topics.orders));
    d.metrics.dlqDepth.set({ topic: d.topics.dlq }, await topicDepth(d.admin, d.topics.dlq));
  } catch {
    // Topics appear when the operator warms the activity up; until then there is nothing to show.
  }
  return gap;
}
