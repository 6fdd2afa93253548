// Shared set-up of the after-sale integration tests: a fresh database, a loaded and open activity
// in the real Redis, reservations made through the real Lua script, orders written the way the
// consumer writes them, and the buyer api (with the payment and cancellation routers) on a port.
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { Redis } from 'ioredis';
import type { Admin, Consumer, ConsumerRunConfig, EachBatchPayload, Kafka } from 'kafkajs';
import { SignJWT } from 'jose';
import { loadActivity, readStock, recordResults, setGate } from '../../../core/activity-cache.js';
import { writeBack } from '../../../core/db/stock-store.js';
import { recordActivityItems } from '../../../core/db/activity-items-store.js';
import { insertOrders } from '../../../core/db/orders-store.js';
import { ensureTopics, idempotentProducer, topicsFor } from '../../../core/kafka.js';
import type { TopicNames } from '../../../core/kafka.js';
import { activityKeys } from '../../../core/keys.js';
import { createPool, isTransientDbError } from '../../../core/db/pool.js';
import type { Pool } from '../../../core/db/pool.js';
import { createLogger } from '../../../core/logger.js';
import type { Logger } from '../../../core/logger.js';
import { createMetrics } from '../../../core/metrics.js';
import type { Metrics } from '../../../core/metrics.js';
import { ordersHeldForPayment } from '../../../core/order-lifecycle.js';
import type { LifecycleDeps } from '../../../core/order-lifecycle.js';
import { locateReservation, orderMessageOf, readReservation, reserve } from '../../../core/reservations.js';
import type { OrderMessage } from '../../../core/model.js';
import { registerScripts } from '../../../core/scripts.js';
import { createApiApp } from '../../../runtime/api/app.js';
import { OrderConsumer } from '../../../runtime/consumer/consumer.js';
import { cancelRouter } from '../../../runtime/api/cancel-routes.js';
import { SoldOutFlags } from '../../../runtime/api/sold-out.js';
import { HmacProvider, signNotification } from '../../../runtime/payments/hmac-provider.js';
import { paymentsRouter } from '../../../runtime/payments/routes.js';
import { refundNotificationsRouter } from '../../../runtime/payments/refund-routes.js';
import { refundRouter } from '../../../runtime/api/refund-routes.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

export const TIMEOUT_MS = 180_000;
export const PAYMENT_TIMEOUT_SECONDS = 900;
export const JWT_SECRET = 'after-sale-test-secret-of-at-least-32-chars';
export const PAY_SECRET = 'payment-provider-shared-secret-0123456789';
export const APP_ID = 'fs-app';
export const MERCHANT_ID = 'fs-merchant';

export interface Fixture {
  db: FreshDatabase;
  pool: Pool;
  redis: Redis;
  logger: Logger;
  metrics: Metrics;
  deps: LifecycleDeps;
  close(): Promise<void>;
}

/**
 * The runtime's pool, with a connect timeout suited to a shared CI machine (the production 5 s can
 * expire while 2 cores run several test files and servers).
 */
export function testPool(url: string, max: number, name: string): Pool {
  const pool = createPool(url, max, name);
  (pool as unknown as { options: { connectionTimeoutMillis: number } }).options.connectionTimeoutMillis =
    60_000;
  return pool;
}

/** Runs `fn` again after a transient failure, as the next cron tick or a provider's retry would. */
export async function retryTransient<T>(fn: () => Promise<T>, attempts = 5): Promise<T> {
  for (let i = 1; ; i += 1) {
    try {
      return await fn();
    } catch (err) {
      if (i >= attempts || !isTransientDbError(err)) throw err;
      await new Promise((r) => setTimeout(r, 200 * i));
    }
  }
}

/** A fresh database and the suite's Redis, or the Redis at `redisUrl` (a private one). */
export async function setUp(poolSize = 10, redisUrl = testEnv().redisUrl): Promise<Fixture> {
  const db = await freshDatabase();
  const pool = testPool(db.url, poolSize, 'after-sale-test');
  const redis = new Redis(redisUrl, { enableAutoPipelining: true, maxRetriesPerRequest: 3 });
  registerScripts(redis);
  const logger = createLogger('after-sale-test', process.env.TEST_LOG_LEVEL ?? 'silent');
  const metrics = createMetrics('after-sale-test');
  return {
    db,
    pool,
    redis,
    logger,
    metrics,
    deps: { pool, redis, logger, metrics, paymentTimeoutSeconds: PAYMENT_TIMEOUT_SECONDS },
    close: async () => {
      await pool.end();
      redis.disconnect();
      await db.drop();
    },
  };
}

export interface ActivitySpec {
  stock: number;
  price?: string;
  limitPerUser?: number;
  skuId?: string;
  /** Whether a released unit frees the buyer's slot (default false). */
  reopenOnRelease?: boolean;
  /** Stock buckets of the SKU (ARCHITECTURE.md "Stock buckets"); none by default. */
  buckets?: number;
}

/**
 * Loads a one-SKU activity into Redis and opens its gate; returns its id. With `pool`, the items
 * are also recorded in PostgreSQL as the operator does (the consumer checks orders against them).
 */
export async function openActivity(
  redis: Redis,
  spec: ActivitySpec,
  pool?: Pool,
): Promise<{ activityId: string; skuId: string }> {
  const activityId = uniqueId('as');
  const skuId = spec.skuId ?? 'sku-1';
  const now = Date.now();
  const items = [
    {
      skuId,
      name: '秒杀商品 flash item',
      price: spec.price ?? '19.90',
      stock: spec.stock,
      limitPerUser: spec.limitPerUser ?? 1,
      ...(spec.buckets ? { buckets: spec.buckets } : {}),
    },
  ];
  if (pool) await recordActivityItems(pool, activityId, 1, items);
  await loadActivity(redis, {
    id: activityId,
    generation: 1,
    startAt: new Date(now - 60_000),
    endAt: new Date(now + 3_600_000),
    requireOrderCode: false,
    reopenOnRelease: spec.reopenOnRelease ?? false,
    items,
  });
  await setGate(redis, activityId, 'open');
  return { activityId, skuId };
}

/**
 * `openActivity` with the activity's own order and DLQ topics under `topicPrefix` (one partition,
 * one replica), for the tests that run a consumer or read the DLQ.
 */
export async function openActivityWithTopics(
  f: Pick<Fixture, 'redis' | 'pool'>,
  admin: Admin,
  topicPrefix: string,
  spec: ActivitySpec,
): Promise<{ activityId: string; skuId: string; topics: TopicNames }> {
  const opened = await openActivity(f.redis, spec, f.pool);
  const topics = topicsFor(opened.activityId, topicPrefix);
  await ensureTopics(admin, topics, 1, 1);
  return { ...opened, topics };
}

/** The order message the relay would send for each reservation, from Redis' ledger, in order. */
export async function orderMessagesOf(
  redis: Redis,
  activityId: string,
  reservationIds: readonly string[],
): Promise<OrderMessage[]> {
  return Promise.all(
    reservationIds.map(async (rid) => {
      const reservation = await readReservation(redis, activityId, rid);
      if (!reservation) throw new Error(`reservation ${rid} of ${activityId} not in Redis`);
      return orderMessageOf(activityId, reservation);
    }),
  );
}

/**
 * What the operator's write-back does (operator/reconcile/write-back.ts): freeze the gate, then
 * write Redis' stock to PostgreSQL with `orders` as the order count, marking the closed orders whose
 * unit the snapshot holds for a payment.
 */
export async function freezeAndWriteBack(
  f: Pick<Fixture, 'redis' | 'pool'>,
  activityId: string,
  orders: number,
): Promise<void> {
  await setGate(f.redis, activityId, 'frozen');
  const s = await readStock(f.redis, activityId);
  const heldForPayment = await ordersHeldForPayment(f.redis, f.pool, activityId);
  await writeBack(f.pool, {
    activityId,
    generation: 1,
    skus: s.skus,
    reserved: s.reserved,
    released: s.released,
    orders,
    writtenBy: 'test',
    heldForPayment,
  });
}

/** Reserves one unit for each user through reserve-9.lua; returns the reservation ids in order. */
export async function reserveFor(
  redis: Redis,
  activityId: string,
  skuId: string,
  users: string[],
  quantity = 1,
): Promise<string[]> {
  const out: string[] = [];
  const chunk = 500;
  for (let i = 0; i < users.length; i += chunk) {
    const rs = await Promise.all(
      users.slice(i, i + chunk).map((userId) =>
        reserve(redis, {
          activityId,
          userId,
          skuId,
          quantity,
          requestId: `req-${userId}`,
          traceId: `trace-${userId}`,
        }),
      ),
    );
    out.push(...rs.map((r) => r.reservationId));
  }
  return out;
}

/** Writes the orders of these reservations as the consumer does (insert + results). */
export async function materialize(
  pool: Pool,
  redis: Redis,
  activityId: string,
  reservationIds: string[],
): Promise<Map<string, string>> {
  // In whichever scope holds it (the activity's, or a stock bucket's), as the order-gap repair finds it.
  const records = await Promise.all(
    reservationIds.map(async (rid) => (await locateReservation(redis, activityId, rid))?.record),
  );
  const messages = records.map((r, i) => {
    if (!r) throw new Error(`no reservation ${reservationIds[i]}`);
    return orderMessageOf(activityId, r);
  });
  const ids = new Map<string, string>();
  for (let i = 0; i < messages.length; i += 1000) {
    const batch = messages.slice(i, i + 1000);
    const outcome = await insertOrders(pool, batch, PAYMENT_TIMEOUT_SECONDS);
    await recordResults(
      redis,
      activityId,
      [...outcome.inserted].map(([rid, orderId]) => ({
        reservationId: rid,
        userId: batch.find((m) => m.reservationId === rid)!.userId,
        // Confirmed in its own scope's ledger (a stock bucket's too), as the consumer does.
        skuId: batch.find((m) => m.reservationId === rid)!.skuId,
        result: { status: 'CREATED' as const, orderId },
      })),
    );
    for (const [rid, id] of outcome.inserted) ids.set(rid, id);
  }
  return ids;
}

/** Moves every unpaid order of the activity past its payment deadline. */
export async function expireAll(pool: Pool, activityId: string): Promise<number> {
  const r = await pool.query(
    `UPDATE orders SET expires_at = now() - interval '1 second' WHERE activity_id = $1 AND status = 'UNPAID'`,
    [activityId],
  );
  return r.rowCount ?? 0;
}

export async function buyerToken(userId: string): Promise<string> {
  return new SignJWT({})
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(userId)
    .setIssuedAt()
    .setExpirationTime('10m')
    .sign(new TextEncoder().encode(JWT_SECRET));
}

/** The built-in provider as the tests configure it; `refundUrl` points at a fake provider. */
export function testProvider(refundUrl?: string, refundTimeoutMs = 2000): HmacProvider {
  return new HmacProvider({
    name: 'hmac',
    secrets: [PAY_SECRET],
    appId: APP_ID,
    merchantId: MERCHANT_ID,
    toleranceSeconds: 300,
    refundUrl,
    refundTimeoutMs,
  });
}

export interface Api {
  url: string;
  close(): Promise<void>;
}

/** The real buyer api (createApiApp) with the payment and cancellation routers, on a free port. */
export async function startApi(
  f: Pick<Fixture, 'pool' | 'redis' | 'logger' | 'metrics'>,
  pool?: Pool,
  opts: { soldOutRecheckMs?: number } = {},
): Promise<Api> {
  const p = pool ?? f.pool;
  const provider = testProvider();
  const app = await createApiApp({
    metrics: f.metrics,
    ready: async () => true,
    redis: f.redis,
    pool: p,
    // 0 by default: every submission reaches the reserve script. With a recheck interval the api
    // answers a SKU it saw sold out from its own flag (runtime/api/sold-out.ts), as in production.
    soldOut: new SoldOutFlags(opts.soldOutRecheckMs ?? 0),
    activityId: undefined,
    orderCodeTtlSeconds: 30,
    auth: { JWT_HS256_SECRET: JWT_SECRET },
    bodyLimit: '8kb',
    logger: f.logger,
    extraRouters: [
      cancelRouter({
        pool: p,
        redis: f.redis,
        logger: f.logger,
        metrics: f.metrics,
        paymentTimeoutSeconds: PAYMENT_TIMEOUT_SECONDS,
        activityId: undefined,
      }),
      refundRouter({ pool: p, logger: f.logger, metrics: f.metrics, activityId: undefined }),
    ],
    publicRouters: [
      paymentsRouter({
        pool: p,
        redis: f.redis,
        logger: f.logger,
        metrics: f.metrics,
        // Payment times are judged exactly here (one machine, one clock): a payment after the
        // deadline is late by any margin.
        paidTimeToleranceSeconds: 0,
        providers: [provider],
      }),
      refundNotificationsRouter({ pool: p, logger: f.logger, metrics: f.metrics, providers: [provider] }),
    ],
  });
  const server: Server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

export interface Notification {
  orderId: string;
  tradeNo: string;
  amount: string;
  status?: string;
  appId?: string;
  merchantId?: string;
}

export function notificationBody(n: Notification): string {
  return JSON.stringify({
    app_id: n.appId ?? APP_ID,
    merchant_id: n.merchantId ?? MERCHANT_ID,
    out_trade_no: n.orderId,
    trade_no: n.tradeNo,
    total_amount: n.amount,
    trade_status: n.status ?? 'TRADE_SUCCESS',
    gmt_payment: new Date().toISOString(),
  });
}

export interface HttpReply {
  status: number;
  body: Record<string, unknown>;
  headers: Record<string, string>;
}

async function reply(res: Response): Promise<HttpReply> {
  const text = await res.text();
  let body: Record<string, unknown> = {};
  try {
    body = JSON.parse(text) as Record<string, unknown>;
  } catch {
    body = { text };
  }
  const out = { status: res.status, body };
  // Not enumerable: tests compare whole replies by status and body (toEqual), and read a header
  // (Retry-After) by name when it is what they are about.
  Object.defineProperty(out, 'headers', { value: Object.fromEntries(res.headers), enumerable: false });
  return out as HttpReply;
}

/** Posts a notification signed like the provider does (or with the given signature header). */
export async function notify(
  api: Api,
  n: Notification | string,
  opts: { secret?: string; signature?: string | null; timestamp?: number; provider?: string } = {},
): Promise<HttpReply> {
  const body = typeof n === 'string' ? n : notificationBody(n);
  const t = opts.timestamp ?? Math.floor(Date.now() / 1000);
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  const sig =
    opts.signature === undefined ? signNotification(opts.secret ?? PAY_SECRET, body, t) : opts.signature;
  if (sig !== null) headers['x-fs-signature'] = sig;
  const res = await fetch(`${api.url}/v1/payments/${opts.provider ?? 'hmac'}/notifications`, {
    method: 'POST',
    headers,
    body,
  });
  return reply(res);
}

/** Like a provider: re-sends the notification while the answer is 5xx (bounded). */
export async function notifyUntilAnswered(api: Api, n: Notification, attempts = 10): Promise<HttpReply> {
  for (let i = 1; ; i += 1) {
    const r = await notify(api, n);
    if (r.status < 500 || i >= attempts) return r;
    await new Promise((resolve) => setTimeout(resolve, 200 * i));
  }
}

export async function buyerCall(
  api: Api,
  method: 'GET' | 'POST' | 'DELETE',
  path: string,
  userId: string,
  body?: unknown,
): Promise<HttpReply> {
  const headers: Record<string, string> = { authorization: `Bearer ${await buyerToken(userId)}` };
  if (body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(`${api.url}${path}`, {
    method,
    headers,
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  return reply(res);
}

/** A buyer's order calls on one activity (docs/after-sale.md): submit, poll and both cancellations. */
export function buyerOrders(api: Api, activityId: string, skuId: string) {
  const orders = `/v1/activities/${activityId}/orders`;
  return {
    submit: (user: string, requestId: string, sku = skuId) =>
      buyerCall(api, 'POST', orders, user, { skuId: sku, quantity: 1, requestId }),
    poll: (user: string, rid: string) => buyerCall(api, 'GET', `${orders}/${rid}`, user),
    cancel: (user: string, rid: string) => buyerCall(api, 'DELETE', `${orders}/${rid}`, user),
    cancelByRequest: (user: string, requestId: string) =>
      buyerCall(api, 'DELETE', `${orders}?requestId=${requestId}`, user),
  };
}

export type BuyerOrders = ReturnType<typeof buyerOrders>;

export async function countRows(pool: Pool, sql: string, params: unknown[] = []): Promise<number> {
  const r = await pool.query<{ n: string }>(sql, params);
  return Number(r.rows[0]?.n ?? 0);
}

export async function skuStock(redis: Redis, activityId: string, skuId: string): Promise<number> {
  return Number(await redis.hget(activityKeys(activityId).sku(skuId), 'stock'));
}

export async function counters(redis: Redis, activityId: string): Promise<Record<string, number>> {
  const h = await redis.hgetall(activityKeys(activityId).counters);
  return Object.fromEntries(Object.entries(h).map(([k, v]) => [k, Number(v)]));
}

/**
 * A kafkajs consumer whose batches are observed: `processed()` is the highest offset per partition
 * whose eachBatch call returned. (The order consumer's own committed offsets are not a usable
 * signal: see the report on commitOffsetsIfNecessary with autoCommit off.)
 */
export function observedConsumer(consumer: Consumer): {
  consumer: Consumer;
  processed: () => Map<number, number>;
} {
  const done = new Map<number, number>();
  const run = consumer.run.bind(consumer);
  const wrapped: Consumer = Object.assign(Object.create(consumer) as Consumer, {
    run: (config?: ConsumerRunConfig) =>
      run({
        ...config,
        ...(config?.eachBatch
          ? {
              eachBatch: async (p: EachBatchPayload) => {
                await config.eachBatch!(p);
                const last = p.batch.messages.at(-1);
                if (last)
                  done.set(
                    p.batch.partition,
                    Math.max(done.get(p.batch.partition) ?? -1, Number(last.offset)),
                  );
              },
            }
          : {}),
      }),
  });
  return { consumer: wrapped, processed: () => new Map(done) };
}

/** The real consumer on the fixture's database and Redis, with small batches and 2 attempts. */
export function orderConsumerFor(
  f: Fixture,
  kafka: Kafka,
  activityId: string,
  topics: TopicNames,
  createConsumer: () => Consumer,
): OrderConsumer {
  return new OrderConsumer({
    activityId,
    topic: topics.orders,
    dlqTopic: topics.dlq,
    createConsumer,
    dlqProducer: idempotentProducer(kafka),
    pool: f.pool,
    redis: f.redis,
    metrics: f.metrics,
    logger: f.logger,
    batchSize: 100,
    maxAttempts: 2,
    paymentTimeoutSeconds: PAYMENT_TIMEOUT_SECONDS,
  });
}

export async function until<T>(
  what: string,
  fn: () => Promise<T | undefined>,
  timeoutMs = 60_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
