/**
 * Scheduled observation of one activity: outbox, stock, orders, consumer lag, the DLQ and the
 * order gap. The order-gap check also repairs the cheap case: a reservation whose order exists in
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
import { countOrders, findByReservationIds } from '../../core/db/orders-store.js';
import type { Pool } from '../../core/db/pool.js';
import { consumerLag, dlqUnhandled, topicDepth } from '../../core/kafka.js';
import type { TopicNames } from '../../core/kafka.js';
import type { Metrics } from '../../core/metrics.js';
import { redisMemory } from '../../core/redis.js';
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

/** Reservations one gap check reads at most. */
export const GAP_PAGE_SIZE = 1000;

/**
 * Where the gap repair's next check reads the ledgers from. Entries the repair holds back on
 * purpose (refused by the consumer, re-published the most times, no reservation hash) stay in the
 * ledger; read from the oldest each time, 1,000 of them would hide every later reservation from
 * the repair. The repair turns the page: after a full page the next check reads the next one, after
 * a short page it starts again from the oldest. A read position only (the ledgers stay the truth);
 * per process and activity.
 */
export class GapPage {
  offset = 0;
  constructor(readonly size = GAP_PAGE_SIZE) {}
}

export async function checkOrderGap(
  d: Omit<GaugeDeps, 'admin' | 'topics' | 'metrics'>,
  now = Date.now(),
  page?: GapPage,
): Promise<OrderGapReport> {
  const olderThan = now - d.gapThresholdSeconds * 1000;
  const size = page?.size ?? GAP_PAGE_SIZE;
  const offset = page?.offset ?? 0;
  const [candidates, total] = await Promise.all([
    unconfirmedReservations(d.redis, d.activityId, olderThan, size, offset),
    countUnconfirmed(d.redis, d.activityId, olderThan),
  ]);

  if (candidates.length === 0) {
    if (page) page.offset = 0;
    return { gap: 0, repairedResults: 0, missing: [] };
  }
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
  // The entries found leave the ledger (their results confirm them): the next page starts after
  // the ones that stay.
  if (page) page.offset = candidates.length < size ? 0 : offset + candidates.length - rows.length;
  const missing = candidates.map((c) => c.reservationId).filter((rid) => !found.has(rid));
  return { gap: Math.max(0, total - rows.length), repairedResults: rows.length, missing };
}

/** The sources the gauges read, each sampled on its own (docs/install.md "Monitoring"). */
export const SAMPLERS = ['redis', 'order_gap', 'postgres', 'kafka'] as const;
export type Sampler = (typeof SAMPLERS)[number];

export interface SampleResult {
  /** Samplers whose source answered, and the error of each one that did not (or was still busy). */
  ok: Sampler[];
  failed: { sampler: Sampler; error: string }[];
  gap: OrderGapReport | undefined;
}

export interface SamplerOptions {
  /** How long one tick waits for a sampler; one still running then is skipped until it ends. */
  timeoutMs?: number;
  now?: () => number;
}

/**
 * The gauge job: one sampler per source, each on its own. A source that fails (Redis down) leaves
 * its own gauges at their last value and its `flashsale_sampler_last_success_timestamp_seconds`
 * behind, and nothing else: the other sources' gauges stay current, and a rule can tell stale from
 * healthy. A source that hangs instead of failing does not hold the others either: a tick waits for
 * a sampler at most `timeoutMs`, and skips a sampler whose previous call has not ended.
 */
export function gaugeSampler(d: GaugeDeps, opts: SamplerOptions = {}): () => Promise<SampleResult> {
  const now = opts.now ?? Date.now;
  const timeoutMs = opts.timeoutMs ?? 10_000;
  const a = { activity: d.activityId };
  const inFlight = new Set<Sampler>();
  let gap: OrderGapReport | undefined;
  // Every sampler's timestamp exists from the start, at the sampler's creation: one whose source
  // is unreachable from the start (a pod started during a Redis outage, a user without INFO) ages
  // like one that stopped, and FlashSaleRuntimeMetricsStale names it. Left unset, its series was
  // absent, and the rule's no-series branch is suppressed by any other sampler's series: silence.
  const started = now() / 1000;
  for (const sampler of SAMPLERS)
    d.metrics.samplerLastSuccess.set({ activity: d.activityId, sampler }, started);
  const samplers: Record<Sampler, () => Promise<void>> = {
    redis: async () => {
      const [outbox, stock, memory] = await Promise.all([
        readOutbox(d.redis, d.activityId),
        readStock(d.redis, d.activityId),
        redisMemory(d.redis),
      ]);
      d.metrics.outboxHalfMessages.set(a, outbox.halfMessages);
      d.metrics.redisMemoryUsed.set(a, memory.usedBytes);
      d.metrics.redisMemoryMax.set(a, memory.maxBytes);
      d.metrics.outboxOldestAge.set(a, outbox.oldestAgeSeconds);
      for (const s of stock.skus.slice(0, MAX_SKU_SERIES))
        d.metrics.stockRemaining.set({ activity: d.activityId, sku: s.skuId }, s.remaining);
    },
    order_gap: async () => {
      gap = await checkOrderGap(d);
      d.metrics.orderGap.set(a, gap.gap);
    },
    postgres: async () => {
      const counts = await countOrders(d.pool, d.activityId);
      for (const [status, n] of Object.entries(counts.byStatus))
        d.metrics.ordersStored.set({ activity: d.activityId, status }, n);
    },
    kafka: async () => {
      // Topics appear when the operator warms the activity up; until then this sampler fails and
      // its timestamp stays at the sampler's creation (the stale alert looks at Active sales only).
      const [lag, depth, unhandled] = await Promise.all([
        consumerLag(d.admin, d.topics.consumerGroup, d.topics.orders),
        topicDepth(d.admin, d.topics.dlq),
        dlqUnhandled(d.admin, d.topics),
      ]);
      d.metrics.consumerLag.set(a, lag);
      d.metrics.dlqDepth.set({ topic: d.topics.dlq }, depth);
      d.metrics.dlqUnhandled.set({ activity: d.activityId, topic: d.topics.dlq }, unhandled);
    },
  };
  const runOne = (sampler: Sampler): Promise<void> => {
    inFlight.add(sampler);
    const run = samplers[sampler]().then(() => {
      d.metrics.samplerLastSuccess.set({ activity: d.activityId, sampler }, now() / 1000);
    });
    void run.finally(() => inFlight.delete(sampler)).catch(() => undefined);
    return run;
  };
  return async () => {
    gap = undefined;
    const result: SampleResult = { ok: [], failed: [], gap: undefined };
    await Promise.all(
      SAMPLERS.map(async (sampler) => {
        if (inFlight.has(sampler)) {
          result.failed.push({ sampler, error: 'the previous sample has not ended' });
          return;
        }
        let timer: NodeJS.Timeout | undefined;
        const timeout = new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
        });
        try {
          await Promise.race([runOne(sampler), timeout]);
          result.ok.push(sampler);
        } catch (err) {
          result.failed.push({ sampler, error: err instanceof Error ? err.message : String(err) });
        } finally {
          clearTimeout(timer);
        }
      }),
    );
    result.gap = gap;
    return result;
  };
}
