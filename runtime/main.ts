/**
 * The runtime: one program, the role chosen by argument (`api`, `relay`, `consumer`, `jobs`,
 * `all` for local use, or `after-sale`: the platform-level buyer API, payment notifications and
 * sweeper for every activity, running as long as orders live). SIGTERM stops in order: stop taking HTTP, finish the relay's and the
 * consumer's batches in flight, stop jobs, close pools.
 */
import type { Server } from 'node:http';
import { hostname } from 'node:os';
import type { Kafka } from 'kafkajs';
import cron from 'node-cron';
import { activityOfRestockChannel, activityKeys, RESTOCK_CHANNEL_PATTERN } from '../core/keys.js';
import { createKafka, idempotentProducer, topicsFor, waitForTopics } from '../core/kafka.js';
import { createLogger, redactUrl } from '../core/logger.js';
import { createMetrics } from '../core/metrics.js';
import { migrate } from '../core/db/migrate.js';
import { createPool } from '../core/db/pool.js';
import type { Pool } from '../core/db/pool.js';
import { createRedis, describeRedis, isCluster, redisConnectionOf, usesSentinel } from '../core/redis.js';
import { ClusterReplicaAck, connectedReplicas, localAck, ReplicaAck } from '../core/durable-ack.js';
import { registerScripts } from '../core/scripts.js';
import type { RedisClient } from '../core/scripts.js';
import { createApiApp } from './api/app.js';
import { SoldOutFlags } from './api/sold-out.js';
import { AdmissionControl } from './api/admission.js';
import { PolicyCache } from './api/policy-cache.js';
import { loadRuntimeConfig, roles, trustProxySetting } from './config.js';
import type { Role } from './config.js';
import { OrderConsumer } from './consumer/consumer.js';
import { createMetricsApp, createServiceApp } from './http.js';
import type { Readiness } from './http.js';
import { runDlqCli } from './dlq.js';
import { cancelRouter } from './api/cancel-routes.js';
import { scheduleAfterSaleJobs, scheduleSettlementSweeper } from './jobs/after-sale.js';
import { sampleGauges } from './jobs/gauges.js';
import { startMoneyJobs } from './jobs/money.js';
import { providersFromEnv } from './payments/hmac-provider.js';
import { refundNotificationsRouter } from './payments/refund-routes.js';
import { paymentsRouter } from './payments/routes.js';
import { refundRouter } from './api/refund-routes.js';
import { runRefundCli } from './refund-cli.js';
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
  if (process.argv[2] === 'refund') {
    process.exit(await runRefundCli(process.argv.slice(3)));
  }
  const role = (process.argv[2] ?? '') as Role;
  if (!roles.includes(role)) {
    process.stderr.write(`usage: runtime <${roles.join('|')}|migrate|dlq|refund>\n`);
    process.exit(2);
  }
  const cfg = loadRuntimeConfig(role);
  const logger = createLogger(`runtime-${role}`, cfg.LOG_LEVEL);
  const metrics = createMetrics(`runtime-${role}`);
  const has = (r: Role): boolean => role === r || role === 'all' || (role === 'after-sale' && r === 'api');
  logger.info(
    {
      role,
      activity: cfg.ACTIVITY_ID,
      db: cfg.DATABASE_URL ? redactUrl(cfg.DATABASE_URL) : undefined,
      redis: describeRedis(redisConnectionOf(cfg)),
      brokers: cfg.KAFKA_BROKERS,
    },
    'starting',
  );

  // ioredis auto-pipelining batches concurrent commands into one round trip per tick.
  const redisConnection = redisConnectionOf(cfg);
  const redis = createRedis(redisConnection, { enableAutoPipelining: true, maxRetriesPerRequest: 3 });
  // ioredis reconnects by itself; without a listener every failed attempt is an "Unhandled error
  // event" on stderr. One warning per connection per 5 s is enough to see an outage in the logs.
  const logRedisErrors = (client: RedisClient, connection: string): void => {
    let last = 0;
    client.on('error', (err: Error) => {
      if (Date.now() - last < 5_000) return;
      last = Date.now();
      logger.warn({ err: err.message, connection }, 'redis connection error; reconnecting');
    });
  };
  logRedisErrors(redis, 'commands');
  registerScripts(redis);
  // Only the connections this role uses (ROLE_NEEDS in config.ts): the relay is given no database
  // URL and the api no Kafka brokers, so neither is created for them.
  const pool = cfg.DATABASE_URL
    ? createPool(cfg.DATABASE_URL, cfg.DB_POOL_SIZE, `flashsale-${role}`)
    : undefined;
  const kafka =
    cfg.KAFKA_BROKERS.length > 0
      ? createKafka(cfg.KAFKA_BROKERS, `flashsale-${role}-${process.pid}`)
      : undefined;
  const db = (): Pool => {
    if (!pool) throw new Error(`the ${role} role has no DATABASE_URL`);
    return pool;
  };
  const bus = (): Kafka => {
    if (!kafka) throw new Error(`the ${role} role has no KAFKA_BROKERS`);
    return kafka;
  };
  const activityId = cfg.ACTIVITY_ID;
  const topics = activityId ? topicsFor(activityId, cfg.KAFKA_TOPIC_PREFIX) : undefined;
  let stopping = false;
  const closers: (() => Promise<unknown>)[] = [];

  let consumer: OrderConsumer | undefined;
  // What this process can actually do: reachable stores, and for the consumer whether it is a
  // member of its group with partitions (while it joins, it writes no orders).
  // Relay and consumer started before the operator created their topics wait for them, not ready.
  let waitingForTopics = false;
  // Not ready until every part of the role has started (the relay loops have joined their group).
  let started = false;
  const ready = async (): Promise<Readiness> => {
    if (stopping) return { ready: false, checks: { process: 'stopping' } };
    const checks: Record<string, string> = {};
    if (waitingForTopics) checks.topics = "waiting for the activity's Kafka topics";
    else if (!started) checks.process = 'starting';
    const probe = async (name: string, fn: () => Promise<unknown>): Promise<void> => {
      checks[name] = await fn().then(
        () => 'ok',
        (err: Error) => `error: ${err.message}`,
      );
    };
    await Promise.all([
      probe('redis', () => redis.ping()),
      ...(has('consumer') || has('jobs') || role === 'after-sale'
        ? [probe('postgres', () => db().query('SELECT 1'))]
        : []),
    ]);
    if (has('consumer') && activityId) checks.consumer = consumer?.status() ?? 'starting';
    const ok = Object.values(checks).every((v) => v === 'ok' || v === 'consuming');
    return { ready: ok, checks };
  };

  const providers = providersFromEnv(cfg);
  let server: Server;
  if (has('api')) {
    const soldOut = new SoldOutFlags(cfg.SOLD_OUT_RECHECK_MS);
    const sub = createRedis(redisConnection);
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
    // RESERVE_ACK unset: wait for a replica whenever there is one to fail over to.
    // On a cluster each reservation's WAIT goes to the node of its scope (ClusterReplicaAck).
    const ackMode =
      cfg.RESERVE_ACK ??
      (usesSentinel(redisConnection) || isCluster(redis) || (await connectedReplicas(redis)) > 0
        ? 'replica'
        : 'local');
    const reservationAck =
      ackMode === 'replica'
        ? isCluster(redis)
          ? new ClusterReplicaAck(redis, cfg.RESERVE_ACK_REPLICAS, cfg.RESERVE_ACK_TIMEOUT_MS)
          : new ReplicaAck(redis, cfg.RESERVE_ACK_REPLICAS, cfg.RESERVE_ACK_TIMEOUT_MS)
        : localAck;
    logger.info(
      { reserveAck: ackMode, replicas: cfg.RESERVE_ACK_REPLICAS, timeoutMs: cfg.RESERVE_ACK_TIMEOUT_MS },
      'reservation acknowledgement',
    );
    const admission = new AdmissionControl({
      metrics,
      maxInFlight: cfg.API_MAX_IN_FLIGHT,
      maxEventLoopDelayMs: cfg.API_MAX_EVENT_LOOP_DELAY_MS,
      sampleIntervalMs: cfg.API_EVENT_LOOP_SAMPLE_MS,
      retryAfterSeconds: cfg.API_SHED_RETRY_AFTER_SECONDS,
    }).start();
    closers.push(async () => admission.stop());
    const app = await createApiApp({
      reservationAck,
      metrics,
      ready,
      admission,
      shedding: () => admission.shedding(),
      trustProxy: trustProxySetting(cfg.API_TRUST_PROXY),
      policies: new PolicyCache(redis, cfg.API_POLICY_REFRESH_MS, logger),
      redis,
      pool: db(),
      soldOut,
      activityId,
      orderCodeTtlSeconds: cfg.ORDER_CODE_TTL_SECONDS,
      auth: cfg,
      bodyLimit: cfg.HTTP_BODY_LIMIT,
      logger,
      extraRouters: [
        cancelRouter({
          pool: db(),
          redis,
          logger,
          metrics,
          paymentTimeoutSeconds: cfg.PAYMENT_TIMEOUT_SECONDS,
          activityId,
          markers: {
            graceSeconds: cfg.CANCEL_MARKER_GRACE_SECONDS,
            maxPerBuyer: cfg.CANCEL_MARKERS_PER_BUYER,
          },
        }),
        refundRouter({ pool: db(), logger, metrics, activityId }),
      ],
      publicRouters: providers.length
        ? [
            paymentsRouter({
              pool: db(),
              redis,
              logger,
              metrics,
              providers,
              paidTimeToleranceSeconds: cfg.PAYMENT_SIGNATURE_TOLERANCE_SECONDS,
            }),
            refundNotificationsRouter({ pool: db(), logger, metrics, providers }),
          ]
        : [],
    });
    server = app.listen(cfg.HTTP_PORT, cfg.HTTP_HOST);
  } else {
    server = createServiceApp({ metrics, ready }).listen(cfg.HTTP_PORT, cfg.HTTP_HOST);
  }
  server.keepAliveTimeout = 65_000;
  const metricsServer = createMetricsApp({ metrics, ready }).listen(cfg.METRICS_PORT, cfg.HTTP_HOST);
  await Promise.all(
    [server, metricsServer].map(
      (s) =>
        new Promise<void>((resolve, reject) => {
          s.once('listening', resolve);
          s.once('error', reject);
        }),
    ),
  );
  logger.info({ port: cfg.HTTP_PORT, metricsPort: cfg.METRICS_PORT }, 'http listening');

  // The relay publishes to the activity's topic and the consumer subscribes to it (and produces to
  // its DLQ); the operator creates both at warm-up. Started earlier, they wait (not ready) rather
  // than fail.
  if ((has('relay') || has('consumer')) && activityId && topics) {
    const admin = bus().admin();
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

  /** Refunds and order events: of one activity, or (undefined) of every activity. */
  const moneyJobs = (of: string | undefined): ReturnType<typeof startMoneyJobs> =>
    startMoneyJobs({ cfg, activityId: of, pool: db(), logger, metrics, kafka: bus(), providers });

  const relays: Relay[] = [];
  if (has('relay') && activityId && topics) {
    const baseName = cfg.RELAY_CONSUMER_NAME ?? hostname();
    for (let i = 0; i < cfg.RELAY_CONCURRENCY; i += 1) {
      const blocking = createRedis(redisConnection, { maxRetriesPerRequest: null });
      logRedisErrors(blocking, `relay-blocking-reads-${i}`);
      const relay = new Relay({
        activityId,
        topic: topics.orders,
        redis,
        blockingRedis: blocking,
        createProducer: () => idempotentProducer(bus()),
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

  // The consumer joins its group in the background: the jobs below (gauges, order-gap check and
  // repair) must run while it joins, which can take as long as the session timeout of a member
  // that died.
  let consumerStarted: Promise<void> | undefined;
  if (has('consumer') && activityId && topics) {
    consumer = new OrderConsumer({
      activityId,
      topic: topics.orders,
      dlqTopic: topics.dlq,
      createConsumer: () =>
        bus().consumer({
          groupId: topics.consumerGroup,
          allowAutoTopicCreation: false,
          maxBytesPerPartition: 4 << 20,
          sessionTimeout: cfg.CONSUMER_SESSION_TIMEOUT_MS,
          heartbeatInterval: cfg.CONSUMER_HEARTBEAT_INTERVAL_MS,
          rebalanceTimeout: cfg.CONSUMER_REBALANCE_TIMEOUT_MS,
        }),
      dlqProducer: idempotentProducer(bus()),
      pool: db(),
      redis,
      metrics,
      logger,
      batchSize: cfg.CONSUMER_BATCH_SIZE,
      partitionConcurrency: cfg.CONSUMER_PARTITION_CONCURRENCY,
      maxAttempts: cfg.CONSUMER_MAX_ATTEMPTS,
      paymentTimeoutSeconds: cfg.PAYMENT_TIMEOUT_SECONDS,
    });
    consumerStarted = consumer.start();
    // Awaited below, once the jobs are scheduled; a failure then still ends the process.
    consumerStarted.catch(() => undefined);
    const c = consumer;
    closers.push(() => c.stop());
  }

  if ((has('jobs') || (role === 'consumer' && cfg.JOBS_IN_CONSUMER)) && activityId && topics) {
    const admin = bus().admin();
    await admin.connect();
    const task = cron.schedule(
      cfg.JOBS_GAUGE_CRON,
      async () => {
        try {
          await sampleGauges({
            activityId,
            redis,
            pool: db(),
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
    const gapProducer = idempotentProducer(bus());
    await gapProducer.connect();
    const afterSale = scheduleAfterSaleJobs({
      cfg,
      activityId,
      topic: topics.orders,
      redis,
      pool: db(),
      logger,
      metrics,
      producer: gapProducer,
    });
    const money = await moneyJobs(activityId);
    closers.unshift(async () => {
      await money.stop();
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

  if (role === 'after-sale') {
    const sweeper = scheduleSettlementSweeper({ cfg, redis, pool: db(), logger, metrics });
    // Refunds and order events of every activity, for as long as orders live: an activity's own
    // jobs stop when its runtime is scaled to zero at Completed.
    const money = await moneyJobs(undefined);
    closers.unshift(async () => {
      await money.stop();
      await sweeper.stop();
    });
  }

  // A consumer that cannot connect or subscribe at all still ends the process (its restart is the
  // recovery), as before; but only after the jobs were scheduled.
  await consumerStarted;

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
    metricsServer.close();
    metricsServer.closeAllConnections();
    for (const close of closers) {
      await close().catch((err: Error) => logger.warn({ err: err.message }, 'close failed'));
    }
    await pool?.end();
    await redis.quit();
    logger.info('stopped');
    process.exit(0);
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));
  started = true;
  logger.info({ role }, 'ready');
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error).message}\n`);
  process.exit(1);
});
