/**
 * The metrics registry. Metric names are part of the product's contract (dashboards, alerts and
 * checks use them): they are defined here and nowhere else.
 */
import client from 'prom-client';
import type { StockReturnVia } from './db/orders-store.js';

export type Metrics = ReturnType<typeof createMetrics>;

/**
 * The `activity` label value of requests for an activity the cache does not know (a made-up id on
 * an api serving every activity): one series for all of them, never one per id.
 */
export const UNKNOWN_ACTIVITY_LABEL = '_unknown';

/** Where a closed order's stock can go: flashsale_stock_returns_total's `via`. */
const STOCK_RETURN_VIAS = [
  'redis',
  'postgres',
  'unresolved',
  'withheld',
] as const satisfies readonly StockReturnVia[];

/**
 * Exports an activity's stock-return counters from 0. Prometheus takes a series' first sample as
 * its baseline, so an `increase()` or `rate()` over a series born with its first event (prom-client
 * makes a labelled series at its first `inc`) never counts that event: a dashboard's count of
 * settled or unresolved returns showed 0 for a process's first batch.
 */
export function stockReturnsFromZero(metrics: Metrics, activityId: string): void {
  for (const via of STOCK_RETURN_VIAS) metrics.stockReturns.inc({ activity: activityId, via }, 0);
}

/**
 * `activityId`: the activity a per-activity runtime process serves. It becomes the `activity` label
 * of every series the process exports that has none of its own (HTTP, process, event loop), so
 * every series of one sale carries the same identity as the operator's (docs/install.md
 * "Monitoring"). A metric's own `activity` label wins (an api serving other activities).
 */
export function createMetrics(component: string, activityId?: string) {
  const registry = new client.Registry();
  registry.setDefaultLabels(activityId ? { component, activity: activityId } : { component });
  client.collectDefaultMetrics({ register: registry, prefix: 'flashsale_' });
  const r = [registry];
  return {
    registry,
    outboxHalfMessages: new client.Gauge({
      name: 'flashsale_outbox_half_messages',
      help: 'Outbox entries (half messages) not yet acknowledged by Kafka',
      labelNames: ['activity'],
      registers: r,
    }),
    redisMemoryUsed: new client.Gauge({
      name: 'flashsale_redis_memory_used_bytes',
      help: "Memory used by the activity's fullest Redis primary (INFO used_memory)",
      labelNames: ['activity'],
      registers: r,
    }),
    redisMemoryMax: new client.Gauge({
      name: 'flashsale_redis_memory_max_bytes',
      help: "maxmemory of the activity's fullest Redis primary (0: no limit)",
      labelNames: ['activity'],
      registers: r,
    }),
    outboxOldestAge: new client.Gauge({
      name: 'flashsale_outbox_oldest_age_seconds',
      help: 'Age of the oldest half message',
      labelNames: ['activity'],
      registers: r,
    }),
    relayPublished: new client.Counter({
      name: 'flashsale_relay_published_total',
      help: 'Half messages published to Kafka and acknowledged',
      labelNames: ['activity'],
      registers: r,
    }),
    relayReclaimed: new client.Counter({
      name: 'flashsale_relay_reclaimed_total',
      help: 'Half messages reclaimed from a relay that stopped acknowledging',
      labelNames: ['activity'],
      registers: r,
    }),
    consumerRetries: new client.Counter({
      name: 'flashsale_consumer_retries_total',
      help: 'Consumer retries by reason',
      labelNames: ['activity', 'reason'],
      registers: r,
    }),
    consumerLag: new client.Gauge({
      name: 'flashsale_consumer_lag',
      help: 'Kafka messages not yet consumed by the order consumer group',
      labelNames: ['activity'],
      registers: r,
    }),
    dlqDepth: new client.Gauge({
      name: 'flashsale_dlq_depth',
      help: 'Messages in the dead-letter topic',
      labelNames: ['topic'],
      registers: r,
    }),
    dlqUnhandled: new client.Gauge({
      name: 'flashsale_dlq_unhandled',
      help: 'Dead letters after the handled offset that `dlq replay` and `dlq ack` advance (0 = every dead letter was replayed or acknowledged)',
      labelNames: ['activity', 'topic'],
      registers: r,
    }),
    dlqSent: new client.Counter({
      name: 'flashsale_dlq_messages_total',
      help: 'Messages sent to the dead-letter topic',
      labelNames: ['activity', 'reason'],
      registers: r,
    }),
    orderGap: new client.Gauge({
      name: 'flashsale_order_gap',
      help: 'Reservations older than the gap threshold with no order in PostgreSQL',
      labelNames: ['activity'],
      registers: r,
    }),
    samplerLastSuccess: new client.Gauge({
      name: 'flashsale_sampler_last_success_timestamp_seconds',
      help: 'When each gauge sampler (redis, order_gap, postgres, kafka) last read its source successfully (Unix seconds); a sampler whose source fails leaves it behind',
      labelNames: ['activity', 'sampler'],
      registers: r,
    }),
    ordersStored: new client.Gauge({
      name: 'flashsale_orders_stored',
      help: 'Orders of the activity in PostgreSQL by status (the postgres sampler)',
      labelNames: ['activity', 'status'],
      registers: r,
    }),
    reservations: new client.Counter({
      name: 'flashsale_reservations_total',
      help: 'Reservation attempts by result',
      labelNames: ['activity', 'result'],
      registers: r,
    }),
    stockRemaining: new client.Gauge({
      name: 'flashsale_stock_remaining',
      help: 'Stock remaining per SKU',
      labelNames: ['activity', 'sku'],
      registers: r,
    }),
    orders: new client.Counter({
      name: 'flashsale_orders_total',
      help: 'Orders by status transition',
      labelNames: ['activity', 'status'],
      registers: r,
    }),
    httpDuration: new client.Histogram({
      name: 'flashsale_http_request_duration_seconds',
      help: 'HTTP request duration',
      labelNames: ['route', 'method', 'code'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers: r,
    }),
    jobRuns: new client.Counter({
      name: 'flashsale_job_runs_total',
      help: 'Scheduled job runs by task and result',
      // Not `job`: Prometheus sets that label on every target, and the runtime's PodMonitor does not
      // honour a pod's own labels (a tenant's pod could forge them), so a `job` label would be
      // renamed `exported_job` and every task would read as the PodMonitor's job.
      labelNames: ['task', 'result'],
      registers: r,
    }),
    payments: new client.Counter({
      name: 'flashsale_payment_notifications_total',
      help: 'Payment notifications by provider and outcome (PAID, ALREADY_PAID, REFUND_PENDING, IGNORED, rejected_*)',
      labelNames: ['provider', 'outcome'],
      registers: r,
    }),
    stockReturns: new client.Counter({
      name: 'flashsale_stock_returns_total',
      help: 'Closed orders whose stock was settled, by where it went (redis, postgres, unresolved, withheld: closed by the stock guard, not returned)',
      labelNames: ['activity', 'via'],
      registers: r,
    }),
    ordersClosed: new client.Counter({
      name: 'flashsale_orders_closed_total',
      help: 'Orders closed, by reason (PAYMENT_TIMEOUT, CANCELLED, GAP_COMPENSATED, OVERSELL_PREVENTED, BUYER_LIMIT_EXCEEDED)',
      labelNames: ['activity', 'reason'],
      registers: r,
    }),
    oversellPrevented: new client.Counter({
      name: 'flashsale_oversell_prevented_total',
      help: 'Orders the PostgreSQL stock guard stored CLOSED because they exceeded the SKU stock (OVERSELL_PREVENTED) or the buyer limit (BUYER_LIMIT_EXCEEDED) while Redis had accepted them',
      labelNames: ['activity', 'sku'],
      registers: r,
    }),
    cancellations: new client.Counter({
      name: 'flashsale_cancellations_total',
      help: 'Buyer cancellations by outcome (cancelled, tombstoned, already_cancelled, already_paid)',
      labelNames: ['activity', 'outcome'],
      registers: r,
    }),
    orderGapRepairs: new client.Counter({
      name: 'flashsale_order_gap_repairs_total',
      help: 'Order-gap repair actions (republished, compensated, abandoned, refused, waiting, skipped, failed)',
      labelNames: ['activity', 'action'],
      registers: r,
    }),
    reconciliationMismatch: new client.Gauge({
      name: 'flashsale_reconciliation_mismatch',
      help: 'Failed checks of the last Redis/ledger/PostgreSQL reconciliation (0 = consistent)',
      labelNames: ['activity'],
      registers: r,
    }),
    reconciliationStockDelta: new client.Gauge({
      name: 'flashsale_reconciliation_stock_delta',
      help: 'Stock held by the source of truth minus stock accounted for by orders and reservations',
      labelNames: ['activity'],
      registers: r,
    }),
    reconciliationRuns: new client.Counter({
      name: 'flashsale_reconciliation_runs_total',
      help: 'Reconciliation runs by result (ok, mismatch, skipped, error)',
      labelNames: ['activity', 'result'],
      registers: r,
    }),
    refunds: new client.Counter({
      name: 'flashsale_refunds_total',
      help: 'Refund steps by outcome (requested, succeeded, retried = provider unavailable or still processing, failed = refused by the provider)',
      labelNames: ['activity', 'outcome'],
      registers: r,
    }),
    refundsFailed: new client.Gauge({
      name: 'flashsale_refunds_failed',
      help: 'Refunds the payment provider refused for good and nobody has retried yet: money still owed back',
      labelNames: ['activity'],
      registers: r,
    }),
    refundPendingOldestAge: new client.Gauge({
      name: 'flashsale_refund_pending_oldest_age_seconds',
      help: 'Age of the oldest money owed back and not yet refunded (pending refunds and surplus payments); 0 when none',
      labelNames: ['activity'],
      registers: r,
    }),
    surplusPayments: new client.Counter({
      name: 'flashsale_surplus_payments_total',
      help: 'Payments that cannot be kept and are refunded automatically, by reason (ORDER_CLOSED = paid after close, PAID_BY_OTHER_TRADE, AMOUNT_MISMATCH, ORDER_NOT_PAYABLE)',
      labelNames: ['activity', 'reason'],
      registers: r,
    }),
    orderEventsPublished: new client.Counter({
      name: 'flashsale_order_events_published_total',
      help: 'Order events published to the order-events topic and acknowledged by Kafka',
      labelNames: ['activity'],
      registers: r,
    }),
    // The order-event relay's gauges carry the topic it publishes to, so a series exists only in a
    // process whose relay has sampled its backlog: an unlabelled gauge would be exported as 0 by
    // every runtime process (api pods included), an "all published" that hides a missing relay.
    orderEventsBacklog: new client.Gauge({
      name: 'flashsale_order_events_unpublished',
      help: 'Order events in the PostgreSQL outbox not yet acknowledged by Kafka (all activities the relay serves), by the topic the relay publishes to',
      labelNames: ['topic'],
      registers: r,
    }),
    orderEventsOldestAge: new client.Gauge({
      name: 'flashsale_order_events_oldest_unpublished_age_seconds',
      help: 'Age of the oldest order event not yet acknowledged by Kafka (all activities the relay serves); 0 when none. Sampled from PostgreSQL, so it keeps rising while Kafka is away',
      labelNames: ['topic'],
      registers: r,
    }),
    orderEventsLastSample: new client.Gauge({
      name: 'flashsale_order_events_last_sample_timestamp_seconds',
      help: 'When the order-event relay last read its backlog from PostgreSQL (Unix seconds); left behind while PostgreSQL does not answer, so the two backlog gauges are that old',
      labelNames: ['topic'],
      registers: r,
    }),
    orderEventsTopicUnderReplicated: new client.Gauge({
      name: 'flashsale_order_events_topic_under_replicated',
      help: '1 while the order-events topic exists with fewer replicas or a lower min.insync.replicas than configured and the relay refuses to publish to it; 0 once it publishes',
      labelNames: ['topic'],
      registers: r,
    }),
    // --- Traffic shaping and admission control (docs/operator.md "Traffic shaping") ---
    rateLimited: new client.Counter({
      name: 'flashsale_rate_limited_total',
      help: 'Requests refused with 429 RATE_LIMITED, by activity and reason (buyer, address)',
      labelNames: ['activity', 'reason'],
      registers: r,
    }),
    shed: new client.Counter({
      name: 'flashsale_shed_total',
      help: 'Requests shed with 503 OVERLOADED before any work, by reason (in_flight, event_loop_delay)',
      labelNames: ['reason'],
      registers: r,
    }),
    eventLoopDelay: new client.Histogram({
      name: 'flashsale_event_loop_delay_seconds',
      help: "The api's event-loop delay as admission control sees it: the p99 of each sampling window",
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
      registers: r,
    }),
    requestsInFlight: new client.Gauge({
      name: 'flashsale_api_requests_in_flight',
      help: 'Buyer requests admitted and not yet answered by this api process',
      registers: r,
    }),
    shedding: new client.Gauge({
      name: 'flashsale_api_shedding',
      help: '1 while this api process sheds load (readiness reports it), else 0',
      registers: r,
    }),
  };
}

export type OperatorMetrics = ReturnType<typeof createOperatorMetrics>;

/** The operator's metrics; names mirror controller-runtime's where they overlap. */
export function createOperatorMetrics() {
  const registry = new client.Registry();
  registry.setDefaultLabels({ component: 'operator' });
  client.collectDefaultMetrics({ register: registry, prefix: 'flashsale_' });
  const r = [registry];
  return {
    registry,
    // Every per-activity series of the operator carries `activity` = the activity id (the label
    // the runtime's series carry) and `name` = the FlashSaleActivity resource's name.
    activityPhase: new client.Gauge({
      name: 'flashsale_activity_phase',
      help: '1 for the phase each activity is in, 0 for the others',
      labelNames: ['activity', 'name', 'namespace', 'phase'],
      registers: r,
    }),
    reconcileTotal: new client.Counter({
      name: 'flashsale_reconcile_total',
      help: 'Reconcile passes by result (success, requeue, error)',
      labelNames: ['result'],
      registers: r,
    }),
    reconcileErrors: new client.Counter({
      name: 'flashsale_reconcile_errors_total',
      help: 'Reconcile passes that ended in an error',
      registers: r,
    }),
    reconcileDuration: new client.Histogram({
      name: 'flashsale_reconcile_duration_seconds',
      help: 'Duration of one reconcile pass',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: r,
    }),
    workqueueDepth: new client.Gauge({
      name: 'flashsale_workqueue_depth',
      help: 'Keys waiting in the operator work queue',
      registers: r,
    }),
    leader: new client.Gauge({
      name: 'flashsale_leader',
      help: '1 while this replica holds the leader Lease',
      registers: r,
    }),
    leaderElectionBlocked: new client.Gauge({
      name: 'flashsale_leader_election_blocked',
      help: '1 while this replica cannot lead: the Lease can be neither read nor created (missing namespace, RBAC)',
      registers: r,
    }),
    activityHalfMessages: new client.Gauge({
      name: 'flashsale_activity_half_messages',
      help: 'Half messages of each activity as last seen by the operator',
      labelNames: ['activity', 'name', 'namespace'],
      registers: r,
    }),
    activityConsumerLag: new client.Gauge({
      name: 'flashsale_activity_consumer_lag',
      help: 'Consumer lag of each activity as last seen by the operator',
      labelNames: ['activity', 'name', 'namespace'],
      registers: r,
    }),
    activityOldestHalfMessageAge: new client.Gauge({
      name: 'flashsale_activity_oldest_half_message_age_seconds',
      help: 'Age of the oldest half message of each activity as last seen by the operator',
      labelNames: ['activity', 'name', 'namespace'],
      registers: r,
    }),
    activityOrderGap: new client.Gauge({
      name: 'flashsale_activity_order_gap',
      help: 'Order gap of each activity as last seen by the operator',
      labelNames: ['activity', 'name', 'namespace'],
      registers: r,
    }),
    activityDlqDepth: new client.Gauge({
      name: 'flashsale_activity_dlq_depth',
      help: 'Messages in the dead-letter topic of each activity as last seen by the operator',
      labelNames: ['activity', 'name', 'namespace'],
      registers: r,
    }),
    // The jobs' flashsale_dlq_unhandled goes with the activity's runtime (scaled to zero at
    // Completed); this one lasts as long as the resource, so FlashSaleDLQUnhandled still sees
    // dead letters nobody handled after the sale.
    activityDlqUnhandled: new client.Gauge({
      name: 'flashsale_activity_dlq_unhandled',
      help: 'Dead letters of each activity neither replayed nor acknowledged, as last seen by the operator',
      labelNames: ['activity', 'name', 'namespace'],
      registers: r,
    }),
    activitySchedule: new client.Gauge({
      name: 'flashsale_activity_schedule_timestamp_seconds',
      help: "Each activity's schedule instants (Unix seconds) by instant: warm_up, start, end",
      labelNames: ['activity', 'name', 'namespace', 'instant'],
      registers: r,
    }),
    activityReplicas: new client.Gauge({
      name: 'flashsale_activity_replicas',
      help: "Replicas of each activity's runtime Deployments by role and state (desired, available), as the operator observed them",
      labelNames: ['activity', 'name', 'namespace', 'role', 'state'],
      registers: r,
    }),
    // Cache restores (operator/reconcile/restore-cache.ts, docs/runbooks/cache-restore.md).
    cacheRestores: new client.Counter({
      name: 'flashsale_cache_restores_total',
      help: "Restores of an activity's Redis cache from PostgreSQL begun by the operator, by reason (CacheEmpty, CacheBehind)",
      labelNames: ['activity', 'name', 'namespace', 'reason'],
      registers: r,
    }),
    cacheRestoreOpenSeconds: new client.Gauge({
      name: 'flashsale_cache_restore_open_seconds',
      help: "Seconds since the activity's open cache restore was detected, by its current step (detected, paused, drained, reloaded), as of the operator's last reconcile pass; absent when none is open",
      labelNames: ['activity', 'name', 'namespace', 'step'],
      registers: r,
    }),
    // The alert's series (FlashSaleCacheRestoreStuck: `time() - it`): the age above is computed
    // only by a reconcile pass, so it stops below any threshold when passes stop (PostgreSQL down,
    // a pass that hangs); this timestamp needs no pass to keep ageing. Set and removed with the age
    // series (operator/reconcile/restore-metrics.ts, update-status.ts forgetActivityMetrics).
    cacheRestoreOpenSince: new client.Gauge({
      name: 'flashsale_cache_restore_open_since_timestamp_seconds',
      help: "When the activity's open cache restore was detected (Unix seconds, the database's clock), by its current step (detected, paused, drained, reloaded); absent when none is open",
      labelNames: ['activity', 'name', 'namespace', 'step'],
      registers: r,
    }),
    ordersUnsettled: new client.Gauge({
      name: 'flashsale_orders_unsettled',
      help: 'Orders and payments of an activity not settled yet (Settling), by what is left: unpaid, closed_unsettled, refund_pending, refunding',
      labelNames: ['activity', 'name', 'namespace', 'status'],
      registers: r,
    }),
  };
}
