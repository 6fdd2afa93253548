/**
 * The runtime: one program, the role chosen by argument (`api`, `relay`, `consumer`, `jobs`, or
 * `all` for local use). SIGTERM stops in order: stop taking HTTP, finish the relay's and the
 * consumer's batches in flight, stop jobs, close pools.
 */
import type { Server } from 'node:http';
import { hostname } from 'node:os';
import { Redis } from 'ioredis';
import cron from 'node-cron';
import { activityOfRestockChannel, activityKeys, RESTOCK_CHANNEL_PATTERN } from '../core/keys.js';
import { createKafka, idempotentProducer, topicsFor, waitForTopics } from '../core/kafka.js';
import { createLogger, redactUrl } from '../core/logger.js';
import { createMetrics } from '../core/metrics.js';
import { migrate } from '../core/db/migrate.js';
import { createPool } from '../core/db/pool.js';
import { registerScripts } from '../core/scripts.js';
import { createApiApp } from './api/app.js';
import { SoldOutFlags } from './api/sold-out.js';
import { loadRuntimeConfig, roles } from './config.js';
import type { Role } from './config.js';
import { OrderConsumer } from './consumer/consumer.js';
import { createServiceApp } from './http.js';
import { runDlqCli } from './dlq.js';
import { cancelRouter } from './api/cancel-routes.js';
import { scheduleAfterSaleJobs } from './jobs/after-sale.js';
import { sampleGauges } from './jobs/gauges.js';
import { HmacProvider } from './payments/hmac-provider.js';
import { paymentsRouter } from './payments/routes.js';
import { Relay } from './relay/relay.js';

async function main(): Promise<void> {
  if (process.argv[2] === 'migrate') {
    const url = process.env.DATABASE_URL;
    if (!url) throw new Error('invalid configuration:\n  DATABASE_URL: required');
    const applied = await migrate(url);
    process.stdout.write(applied.length ? `applied ${applied.join(', ')}\n` : 'schema up to date\n');
    return;
  }
  if (process.argv[2] === 'dlq') {
    process.exit(await runDlqCli(process.argv.slice(3)));
  }
  const role = (process.argv[2] ?? '') as Role;
  if (!roles.includes(role)) {
    process.stderr.write(`usage: runtime <${roles.join('|')}|migrate|dlq>\n`);
    process.exit(2);
  }
  const cfg = loadRuntimeConfig(role);
  const logger = createLogger(`runtime-${role}`, cfg.LOG_LEVEL);
  const metrics = createMetrics(`runtime-${role}`);
  const has = (r: Role): boolean => role === r || role === 'all';
  logger.info(
    {
      role,
      activity: cfg.ACTIVITY_ID,
      db: redactUrl(cfg.DATABASE_URL),
      redis: redactUrl(cfg.REDIS_URL),
      brokers: cfg.KAFKA_BROKERS,
    },
    'starting',
  );

  // ioredis auto-pipelining batches concurrent commands into one round trip per tick.
  const redis = new Redis(cfg.REDIS_URL, { enableAutoPipelining: true, maxRetriesPerRequest: 3 });
  // ioredis reconnects by itself; without a listener every failed attempt is an "Unhandled error
  // event" on stderr. One warning per connection per 5 s is enough to see an outage in the logs.
  const logRedisErrors = (client: Redis, connection: string): void => {
    let last = 0;
    client.on('error', (err: Error) => {
      if (Date.now() - last < 5_000) return;
      last = Date.now();
      logger.warn({ err: err.message, connection }, 'redis connection error; reconnecting');
    });
  };
  logRedisErrors(redis, 'commands');
  registerScripts(redis);
  const pool = createPool(cfg.DATABASE_URL, cfg.DB_POOL_SIZE, `flashsale-${role}`);
  const kafka = createKafka(cfg.KAFKA_BROKERS, `flashsale-${role}-${process.pid}`);
  const activityId = cfg.ACTIVITY_ID;
  const topics = activityId ? topicsFor(activityId, cfg.KAFKA_TOPIC_PREFIX) : undefined;
  let stopping = false;
  const closers: (() => Promise<unknown>)[] = [];

  let waitingForTopics = false;
  const ready = async (): Promise<boolean> => {
    if (stopping || waitingForTopics) return false;
    await redis.ping();
    if (has('consumer') || has('jobs')) await pool.query('SELECT 1');
    return true;
  };

  let server: Server;
  if (has('api')) {
    const soldOut = new SoldOutFlags(cfg.SOLD_OUT_RECHECK_MS);
    const sub = new Redis(cfg.REDIS_URL);
    logRedisErrors(sub, 'restock-subscriber');
    sub.on('pmessage', (_p: string, channel: string, sku: string) => {
      const a = activityOfRestockChannel(channel);
      if (a) soldOut.restocked(a, sku);
    });
    sub.on('message', (channel: string, sku: string) => {
      const a = activityOfRestockChannel(channel);
      if (a) soldOut.restocked(a, sku);
    });
    if (activityId) await sub.subscribe(activityKeys(activityId).restockChannel);
    else await sub.psubscribe(RESTOCK_CHANNEL_PATTERN);
    closers.push(() => sub.quit());
    const app = await createApiApp({
      metrics,
      ready,
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
          activityId,
        }),
      ],
      publicRouters: cfg.PAYMENT_HMAC_SECRET
        ? [
            paymentsRouter({
              pool,
              redis,
              logger,
              metrics,
              providers: [
                new HmacProvider({
                  name: cfg.PAYMENT_HMAC_PROVIDER_NAME,
                  secrets: [cfg.PAYMENT_HMAC_SECRET, cfg.PAYMENT_HMAC_SECRET_PREVIOUS].filter(
                    (x): x is string => Boolean(x),
                  ),
                  appId: cfg.PAYMENT_HMAC_APP_ID ?? '',
                  merchantId: cfg.PAYMENT_HMAC_MERCHANT_ID ?? '',
                  toleranceSeconds: cfg.PAYMENT_SIGNATURE_TOLERANCE_SECONDS,
                }),
              ],
            }),
          ]
        : [],
    });
    server = app.listen(cfg.HTTP_PORT, cfg.HTTP_HOST);
  } else {
    server = createServiceApp({ metrics, ready }).listen(cfg.HTTP_PORT, cfg.HTTP_HOST);
  }
  server.keepAliveTimeout = 65_000;
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  logger.info({ port: cfg.HTTP_PORT }, 'http listening');

  // The relay publishes to the activity's topic and the consumer subscribes to it (and produces to
  // its DLQ); the operator creates both at warm-up. Started earlier, they wait (not ready) rather
  // than fail.
  if ((has('relay') || has('consumer')) && activityId && topics) {
    const admin = kafka.admin();
    await admin.connect();
    waitingForTopics = true;
    let waited = false;
    await waitForTopics(admin, [topics.orders, ...(has('consumer') ? [topics.dlq] : [])], {
      onWaiting: (missing) => {
        waited = true;
        logger.info(
          { missing },
          "waiting for the activity's Kafka topics (the operator creates them at warm-up)",
        );
      },
    });
    waitingForTopics = false;
    if (waited) logger.info("the activity's Kafka topics exist; starting");
    await admin.disconnect();
  }

  const relays: Relay[] = [];
  if (has('relay') && activityId && topics) {
    const baseName = cfg.RELAY_CONSUMER_NAME ?? hostname();
    for (let i = 0; i < cfg.RELAY_CONCURRENCY; i += 1) {
      const blocking = new Redis(cfg.REDIS_URL, { maxRetriesPerRequest: null });
      logRedisErrors(blocking, `relay-blocking-reads-${i}`);
      const relay = new Relay({
        activityId,
        topic: topics.orders,
        redis,
        blockingRedis: blocking,
        createProducer: () => idempotentProducer(kafka),
        metrics,
        logger,
        batchSize: cfg.RELAY_BATCH_SIZE,
        reclaimIdleMs: cfg.RELAY_RECLAIM_IDLE_MS,
        consumerName: `${baseName}-${i}`,
      });
      await relay.start();
      relays.push(relay);
      closers.push(async () => {
        await relay.stop();
        blocking.disconnect();
      });
    }
  }

  let consumer: OrderConsumer | undefined;
  if (has('consumer') && activityId && topics) {
    consumer = new OrderConsumer({
      activityId,
      topic: topics.orders,
      dlqTopic: topics.dlq,
      createConsumer: () =>
        kafka.consumer({
          groupId: topics.consumerGroup,
          allowAutoTopicCreation: false,
          maxBytesPerPartition: 4 << 20,
        }),
      dlqProducer: idempotentProducer(kafka),
      pool,
      redis,
      metrics,
      logger,
      batchSize: cfg.CONSUMER_BATCH_SIZE,
      partitionConcurrency: cfg.CONSUMER_PARTITION_CONCURRENCY,
      maxAttempts: cfg.CONSUMER_MAX_ATTEMPTS,
      paymentTimeoutSeconds: cfg.PAYMENT_TIMEOUT_SECONDS,
    });
    await consumer.start();
    const c = consumer;
    closers.push(() => c.stop());
  }

  if ((has('jobs') || (role === 'consumer' && cfg.JOBS_IN_CONSUMER)) && activityId && topics) {
    const admin = kafka.admin();
    await admin.connect();
    const task = cron.schedule(
      cfg.JOBS_GAUGE_CRON,
      async () => {
        try {
          await sampleGauges({
            activityId,
            redis,
            pool,
            admin,
            topics,
            metrics,
            gapThresholdSeconds: cfg.ORDER_GAP_THRESHOLD_SECONDS,
          });
          metrics.jobRuns.inc({ job: 'gauges', result: 'ok' });
        } catch (err) {
          metrics.jobRuns.inc({ job: 'gauges', result: 'error' });
          logger.warn({ err: (err as Error).message }, 'gauge job failed');
        }
      },
      { name: `gauges-${activityId}`, noOverlap: true },
    );
    const gapProducer = idempotentProducer(kafka);
    await gapProducer.connect();
    const afterSale = scheduleAfterSaleJobs({
      cfg,
      activityId,
      topic: topics.orders,
      redis,
      pool,
      logger,
      metrics,
      producer: gapProducer,
    });
    closers.unshift(async () => {
      await task.stop();
      await afterSale.stop();
      await gapProducer.disconnect();
      await admin.disconnect();
    });
  } else if (relays[0]) {
    const r = relays[0];
    const timer = setInterval(() => void r.sampleGauges().catch(() => undefined), 1000);
    closers.unshift(async () => clearInterval(timer));
  }

  const shutdown = async (signal: string): Promise<void> => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'stopping');
    const force = setTimeout(() => {
      logger.error('shutdown timed out; exiting');
      process.exit(1);
    }, cfg.SHUTDOWN_TIMEOUT_MS);
    force.unref();
    await new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeIdleConnections();
    });
    for (const close of closers) {
      await close().catch((err: Error) => logger.warn({ err: err.message }, 'close failed'));
    }
    await pool.end();
    await redis.quit();
    logger.info('stopped');
    process.exit(0);
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));
  logger.info({ role }, 'ready');
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error).message}\n`);
  process.exit(1);
});
