/**
 * The api role's parts: the buyer API of one activity (ACTIVITY_ID) or of every activity (no
 * ACTIVITY_ID, as in the after-sale role), with the sold-out flags kept fresh by the restock
 * subscriber, the reservation acknowledgement (RESERVE_ACK), admission control and the payment
 * notification routes. Returns the express app; the caller serves it (roles/process.ts serveHttp).
 */
import type { Express } from 'express';
import { defaultAckMode, reservationAckOf } from '../../core/durable-ack.js';
import { activityKeys, activityOfRestockChannel, RESTOCK_CHANNEL_PATTERN } from '../../core/keys.js';
import { usesSentinel } from '../../core/redis.js';
import { AdmissionControl } from '../api/admission.js';
import { createApiApp } from '../api/app.js';
import { cancelRouter } from '../api/cancel-routes.js';
import { PolicyCache } from '../api/policy-cache.js';
import { refundRouter } from '../api/refund-routes.js';
import { SoldOutFlags } from '../api/sold-out.js';
import { trustProxySetting } from '../config.js';
import type { ApiConfig } from '../config.js';
import { providersFromEnv } from '../payments/hmac-provider.js';
import { refundNotificationsRouter } from '../payments/refund-routes.js';
import { paymentsRouter } from '../payments/routes.js';
import type { Closer, DatabaseClient, RoleContext } from './process.js';

export async function startApi(
  ctx: RoleContext,
  cfg: ApiConfig,
  { pool }: DatabaseClient,
): Promise<{ app: Express; closers: Closer[] }> {
  const { logger, metrics, redis } = ctx;
  const activityId = cfg.ACTIVITY_ID;
  const closers: Closer[] = [];

  const soldOut = new SoldOutFlags(cfg.SOLD_OUT_RECHECK_MS);
  const sub = ctx.connectRedis('restock-subscriber');
  sub.on('pmessage', (_p: string, channel: string, sku: string) => {
    const a = activityOfRestockChannel(channel);
    if (a) soldOut.restocked(a, sku);
  });
  sub.on('message', (channel: string, sku: string) => {
    const a = activityOfRestockChannel(channel);
    if (a) soldOut.restocked(a, sku);
  });
  let closed = false;
  await subscribeWhenReachable(
    () =>
      activityId
        ? sub.subscribe(activityKeys(activityId).restockChannel)
        : sub.psubscribe(RESTOCK_CHANNEL_PATTERN),
    logger,
    () => closed,
  );
  closers.push({
    stage: 'clients',
    name: 'restock subscriber',
    close: () => {
      closed = true;
      return sub.quit();
    },
  });

  // RESERVE_ACK unset: wait for a replica whenever there is one to fail over to.
  // On a cluster each reservation's WAIT goes to the node of its scope (ClusterReplicaAck).
  let reservationAck = ctx.reservationAck;
  try {
    const ackMode = cfg.RESERVE_ACK ?? (await defaultAckMode(redis, usesSentinel(ctx.redisConnection)));
    reservationAck = reservationAckOf(redis, ackMode, cfg.RESERVE_ACK_REPLICAS, cfg.RESERVE_ACK_TIMEOUT_MS);
    logger.info(
      { reserveAck: ackMode, replicas: cfg.RESERVE_ACK_REPLICAS, timeoutMs: cfg.RESERVE_ACK_TIMEOUT_MS },
      'reservation acknowledgement',
    );
  } catch (err) {
    // Redis unreachable at start: the after-sale role serves sales PostgreSQL holds alone and must
    // start anyway (an activity's api is not ready without Redis). Decided at the first use.
    logger.warn(
      { err: (err as Error).message },
      'reservation acknowledgement not decided at start (Redis unreachable); decided at its first use',
    );
  }

  const admission = new AdmissionControl({
    metrics,
    maxInFlight: cfg.API_MAX_IN_FLIGHT,
    maxEventLoopDelayMs: cfg.API_MAX_EVENT_LOOP_DELAY_MS,
    sampleIntervalMs: cfg.API_EVENT_LOOP_SAMPLE_MS,
    retryAfterSeconds: cfg.API_SHED_RETRY_AFTER_SECONDS,
  }).start();
  // After the service port: requests still in flight keep being counted until they are answered.
  closers.push({ stage: 'http', name: 'admission control', close: async () => admission.stop() });

  const providers = providersFromEnv(cfg);
  const app = await createApiApp({
    reservationAck,
    metrics,
    ready: () => ctx.readiness.check(),
    admission,
    shedding: () => admission.shedding(),
    trustProxy: trustProxySetting(cfg.API_TRUST_PROXY),
    policies: new PolicyCache(redis, cfg.API_POLICY_REFRESH_MS, logger),
    redis,
    pool,
    soldOut,
    activityId,
    orderCodeTtlSeconds: cfg.ORDER_CODE_TTL_SECONDS,
    auth: cfg,
    bodyLimit: cfg.HTTP_BODY_LIMIT,
    logger,
    extraRouters: [
      cancelRouter({
        pool,
        redis,
        logger,
        metrics,
        paymentTimeoutSeconds: cfg.PAYMENT_TIMEOUT_SECONDS,
        stockAck: reservationAck,
        activityId,
        markers: {
          graceSeconds: cfg.CANCEL_MARKER_GRACE_SECONDS,
          maxPerBuyer: cfg.CANCEL_MARKERS_PER_BUYER,
        },
      }),
      refundRouter({ pool, logger, metrics, activityId }),
    ],
    publicRouters: providers.length
      ? [
          paymentsRouter({
            pool,
            redis,
            logger,
            metrics,
            providers,
            paidTimeToleranceSeconds: cfg.PAYMENT_SIGNATURE_TOLERANCE_SECONDS,
            afterBody: admission.bodyRead(),
          }),
          refundNotificationsRouter({ pool, logger, metrics, providers, afterBody: admission.bodyRead() }),
        ]
      : [],
  });
  return { app, closers };
}

/**
 * Subscribes to the restock channel(s): awaited when Redis answers, else retried in the
 * background, so a pod started during a Redis outage still starts (the after-sale role answers
 * from PostgreSQL for sales written back). Until it succeeds a sold-out flag ends only after
 * SOLD_OUT_RECHECK_MS, as when a restock message is missed. Once subscribed, ioredis subscribes
 * again by itself after every reconnection.
 */
async function subscribeWhenReachable(
  subscribe: () => Promise<unknown>,
  logger: RoleContext['logger'],
  closed: () => boolean,
): Promise<void> {
  const retry = (delayMs: number, err: unknown): void => {
    if (closed()) return;
    logger.warn({ err: (err as Error).message, retryInMs: delayMs }, 'restock subscription failed; retrying');
    setTimeout(() => {
      if (!closed()) subscribe().catch((e: unknown) => retry(Math.min(delayMs * 2, 10_000), e));
    }, delayMs).unref();
  };
  await subscribe().catch((err: unknown) => retry(500, err));
}
