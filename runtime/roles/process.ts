/**
 * What every role process is made of: its context (logger, metrics, the commands Redis
 * connection, readiness), its HTTP servers, and its closers in shutdown order. A role's start
 * function returns one list of closers, each tagged with its stage; `closeInOrder` runs them
 * stage by stage (a stable order inside a stage), so roles composed into one process (`all`)
 * still stop in the order below.
 */
import type { ReservationAck } from '../../core/durable-ack.js';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Express } from 'express';
import type { RedisOptions } from 'ioredis';
import type { Kafka } from 'kafkajs';
import type { Pool } from '../../core/db/pool.js';
import { topicsFor, waitForTopics } from '../../core/kafka.js';
import type { TopicNames } from '../../core/kafka.js';
import type { Logger } from '../../core/logger.js';
import type { Metrics } from '../../core/metrics.js';
import { createRedis, redisConnectionOf, whenEndedForGood } from '../../core/redis.js';
import type { RedisConnection, RedisEndPolicy } from '../../core/redis.js';
import type { RedisClient } from '../../core/scripts.js';
import type { RuntimeConfig } from '../config.js';
import { createMetricsApp, createServiceApp } from '../http.js';
import type { Readiness } from '../http.js';

/**
 * Shutdown stages, in order: stop taking HTTP; finish the relay's and the consumer's batches in
 * flight; stop the scheduled jobs; close pools and clients (which the stages before still use).
 */
export const SHUTDOWN_STAGES = ['http', 'work', 'jobs', 'clients'] as const;
export type ShutdownStage = (typeof SHUTDOWN_STAGES)[number];

export interface Closer {
  stage: ShutdownStage;
  /** Logged when it runs (the shutdown order is visible in the logs, and tested). */
  name: string;
  close: () => Promise<unknown>;
}

/** The closers in shutdown order: by stage, and in their given order within a stage. */
export function inShutdownOrder(closers: readonly Closer[]): Closer[] {
  return closers
    .map((c, i) => ({ c, i }))
    .sort((a, b) => SHUTDOWN_STAGES.indexOf(a.c.stage) - SHUTDOWN_STAGES.indexOf(b.c.stage) || a.i - b.i)
    .map(({ c }) => c);
}

/** Runs every closer in shutdown order; one that fails is logged and the next still runs. */
export async function closeInOrder(closers: readonly Closer[], logger: Logger): Promise<void> {
  for (const c of inShutdownOrder(closers)) {
    logger.info({ stage: c.stage, closer: c.name }, 'closing');
    await c.close().catch((err: Error) => logger.warn({ err: err.message, closer: c.name }, 'close failed'));
  }
}

/** ready (`ok`, or `consuming` for the consumer) or what is wrong. */
const READY_STATES = new Set(['ok', 'consuming']);

/**
 * What the process can actually do: reachable stores, and each part's own state (the consumer is
 * ready only as a member of its group; a relay or consumer waits for its activity's topics).
 * Not ready until every part of the role has started, nor once it is stopping.
 */
export class RoleReadiness {
  stopping = false;
  started = false;
  private readonly parts = new Map<string, () => string | undefined | Promise<string | undefined>>();

  /** A part's state; undefined = nothing to report (ready as far as it is concerned). */
  report(name: string, state: () => string | undefined | Promise<string | undefined>): void {
    this.parts.set(name, state);
  }

  /** A dependency that is ready while `ping` succeeds. */
  probe(name: string, ping: () => Promise<unknown>): void {
    this.report(name, () =>
      ping().then(
        () => 'ok',
        (err: Error) => `error: ${err.message}`,
      ),
    );
  }

  async check(): Promise<Readiness> {
    if (this.stopping) return { ready: false, checks: { process: 'stopping' } };
    const checks: Record<string, string> = {};
    await Promise.all(
      [...this.parts].map(async ([name, state]) => {
        const s = await state();
        if (s !== undefined) checks[name] = s;
      }),
    );
    const partsReady = Object.values(checks).every((v) => READY_STATES.has(v));
    if (!this.started && partsReady) checks.process = 'starting';
    return { ready: partsReady && this.started, checks };
  }
}

/** What a role's start function is given besides its configuration and connections. */
export interface RoleContext {
  logger: Logger;
  metrics: Metrics;
  /** The commands connection (scripts registered; no auto-pipelining: runtime/main.ts says why). */
  redis: RedisClient;
  redisConnection: RedisConnection;
  /** Another Redis connection of this process, its errors logged like the commands one's. */
  connectRedis: (name: string, options?: RedisOptions) => RedisClient;
  /**
   * `RESERVE_ACK` on the commands connection, decided at first use: how durable a write to Redis
   * must be before PostgreSQL records it (stock returns, core/order-lifecycle.ts stockAck).
   */
  reservationAck: ReservationAck;
  readiness: RoleReadiness;
}

/**
 * ioredis reconnects by itself; without a listener every failed attempt is an "Unhandled error
 * event" on stderr. One warning per connection per 5 s is enough to see an outage in the logs.
 */
function logRedisErrors(client: RedisClient, connection: string, logger: Logger): void {
  let last = 0;
  client.on('error', (err: Error) => {
    if (Date.now() - last < 5_000) return;
    last = Date.now();
    logger.warn({ err: err.message, connection }, 'redis connection error; reconnecting');
  });
}

/** The process's Redis connection settings, and how its roles open further connections. */
export function redisFactory(
  cfg: Parameters<typeof redisConnectionOf>[0] & { REDIS_COMMAND_TIMEOUT_MS: number },
  logger: Logger,
  onEnd?: RedisEndPolicy,
): { redisConnection: RedisConnection; connectRedis: RoleContext['connectRedis'] } {
  const redisConnection = redisConnectionOf(cfg);
  return {
    redisConnection,
    connectRedis: (name, options) => {
      const client = createRedis(redisConnection, {
        commandTimeout: cfg.REDIS_COMMAND_TIMEOUT_MS,
        ...options,
      });
      logRedisErrors(client, name, logger);
      if (onEnd) whenEndedForGood(client, onEnd, name);
      return client;
    },
  };
}

/** The connections of a role: a pool when it needs PostgreSQL, Kafka when it needs Kafka. */
export interface DatabaseClient {
  pool: Pool;
}
export interface KafkaClient {
  kafka: Kafka;
}

type HttpConfig = Pick<RuntimeConfig, 'HTTP_PORT' | 'HTTP_HOST' | 'HTTP_BACKLOG' | 'METRICS_PORT'>;

/**
 * Listens on the service port (the api's app, or /healthz and /readyz only) and on the metrics
 * port; both are closed first at shutdown (in-flight requests finish, idle connections close).
 */
export async function serveHttp(ctx: RoleContext, cfg: HttpConfig, app?: Express): Promise<Closer[]> {
  const ready = (): Promise<Readiness> => ctx.readiness.check();
  const server = (app ?? createServiceApp({ metrics: ctx.metrics, ready })).listen({
    port: cfg.HTTP_PORT,
    host: cfg.HTTP_HOST,
    backlog: cfg.HTTP_BACKLOG,
  });
  server.keepAliveTimeout = 65_000;
  const metricsServer = createMetricsApp({ metrics: ctx.metrics, ready }).listen(
    cfg.METRICS_PORT,
    cfg.HTTP_HOST,
  );
  await Promise.all(
    [server, metricsServer].map(
      (s) =>
        new Promise<void>((resolve, reject) => {
          s.once('listening', resolve);
          s.once('error', reject);
        }),
    ),
  );
  ctx.logger.info({ port: cfg.HTTP_PORT, metricsPort: cfg.METRICS_PORT }, 'http listening');
  // Stopping to take HTTP must also end keep-alive connections that never go idle under load
  // (server.close() alone waits for them until the shutdown times out): once closing, every
  // response says `Connection: close`, and connections are closed as soon as they are idle.
  let closing = false;
  server.on('request', (_req: IncomingMessage, res: ServerResponse) => {
    if (closing && !res.headersSent) res.setHeader('connection', 'close');
  });
  const closeServer = (s: Server): Promise<void> =>
    new Promise<void>((resolve) => {
      closing = true;
      const sweep = setInterval(() => s.closeIdleConnections(), 50);
      s.close(() => {
        clearInterval(sweep);
        resolve();
      });
      s.closeIdleConnections();
    });
  return [
    { stage: 'http', name: 'service port', close: () => closeServer(server) },
    {
      stage: 'http',
      name: 'metrics port',
      close: async () => {
        metricsServer.close();
        metricsServer.closeAllConnections();
      },
    },
  ];
}

/**
 * The relay publishes to the activity's topic and the consumer subscribes to it (and produces to
 * its DLQ); the operator creates both at warm-up. Started earlier, they wait (not ready) rather
 * than fail.
 */
export async function waitForActivityTopics(
  ctx: RoleContext,
  kafka: Kafka,
  cfg: Pick<RuntimeConfig, 'KAFKA_TOPIC_PREFIX'> & { ACTIVITY_ID: string },
  opts: { dlq: boolean },
): Promise<TopicNames> {
  const topics = topicsFor(cfg.ACTIVITY_ID, cfg.KAFKA_TOPIC_PREFIX);
  const admin = kafka.admin();
  await admin.connect();
  let waiting = true;
  ctx.readiness.report('topics', () => (waiting ? "waiting for the activity's Kafka topics" : undefined));
  let waited = false;
  try {
    await waitForTopics(admin, [topics.orders, ...(opts.dlq ? [topics.dlq] : [])], {
      onWaiting: (missing) => {
        waited = true;
        ctx.logger.info(
          { missing },
          "waiting for the activity's Kafka topics (the operator creates them at warm-up)",
        );
      },
    });
  } finally {
    await admin.disconnect();
  }
  waiting = false;
  if (waited) ctx.logger.info("the activity's Kafka topics exist; starting");
  return topics;
}
