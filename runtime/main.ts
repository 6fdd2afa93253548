/**
 * The runtime: one program, the role chosen by argument (`api`, `relay`, `consumer`, `jobs`,
 * `all` for local use, or `after-sale`: the platform-level buyer API, payment notifications and
 * sweeper for every activity, running as long as orders live), or a command (`migrate`, `dlq`,
 * `refund`). Each role's start function is in roles/; this file picks one, connects what the role
 * needs (ROLE_NEEDS) and, on SIGTERM or SIGINT, runs the role's closers in order: stop taking HTTP,
 * finish the relay's and the consumer's batches in flight, stop the jobs, close pools and clients
 * (roles/process.ts SHUTDOWN_STAGES).
 */
import { AckDecidedOnFirstUse, defaultAckMode, reservationAckOf } from '../core/durable-ack.js';
import { migrate } from '../core/db/migrate.js';
import { QUERY_TIMEOUT_MS, createPool } from '../core/db/pool.js';
import { createKafka } from '../core/kafka.js';
import { createLogger, redactUrl } from '../core/logger.js';
import type { Logger } from '../core/logger.js';
import { createMetrics } from '../core/metrics.js';
import { describeRedis, exitWhenRedisEnds, usesSentinel } from '../core/redis.js';
import { registerScripts } from '../core/scripts.js';
import { loadRuntimeConfig, ROLE_NEEDS, roles } from './config.js';
import type { Role, RoleConfig, RuntimeConfig } from './config.js';
import { runDlqCli } from './dlq.js';
import { runRefundCli } from './refund-cli.js';
import { START_ROLE } from './roles/index.js';
import type { ClientsOf } from './roles/index.js';
import { closeInOrder, redisFactory, RoleReadiness } from './roles/process.js';
import type { Closer, DatabaseClient, KafkaClient, RoleContext } from './roles/process.js';
import { applyV8Tuning } from './v8-tuning.js';

const isRole = (s: string): s is Role => (roles as readonly string[]).includes(s);

/** Only the connections this role uses: the relay gets no pool and the api no Kafka client. */
function connect<R extends Role>(
  role: R,
  cfg: RoleConfig<R>,
  logger: Logger,
): { clients: ClientsOf<R>; closers: Closer[] } {
  const c = cfg as Partial<RuntimeConfig> & Pick<RuntimeConfig, 'DB_POOL_SIZE'>;
  const clients: Partial<DatabaseClient & KafkaClient> = {};
  const closers: Closer[] = [];
  if (ROLE_NEEDS[role].database && c.DATABASE_URL) {
    const pool = createPool(c.DATABASE_URL, c.DB_POOL_SIZE, `flashsale-${role}`, {
      queryTimeoutMs: QUERY_TIMEOUT_MS,
    });
    clients.pool = pool;
    closers.push({ stage: 'clients', name: 'postgres pool', close: () => pool.end() });
  }
  if (ROLE_NEEDS[role].kafka && c.KAFKA_BROKERS?.length) {
    clients.kafka = createKafka(c.KAFKA_BROKERS, `flashsale-${role}-${process.pid}`, undefined, logger);
  }
  return { clients: clients as ClientsOf<R>, closers };
}

async function runRole<R extends Role>(role: R): Promise<void> {
  const cfg = loadRuntimeConfig(role);
  const c = cfg as Partial<RuntimeConfig>;
  const logger = createLogger(`runtime-${role}`, cfg.LOG_LEVEL);
  const v8Flags = applyV8Tuning(role, cfg);
  const readiness = new RoleReadiness();
  const { redisConnection, connectRedis } = redisFactory(
    cfg,
    logger,
    exitWhenRedisEnds(() => readiness.stopping, logger),
  );
  logger.info(
    {
      role,
      activity: c.ACTIVITY_ID,
      db: c.DATABASE_URL ? redactUrl(c.DATABASE_URL) : undefined,
      redis: describeRedis(redisConnection),
      brokers: c.KAFKA_BROKERS,
      ...(v8Flags.length > 0 ? { v8Flags } : {}),
    },
    'starting',
  );
  // No auto-pipelining: ioredis still sends a command without waiting for the replies before it,
  // but auto-pipelining holds each tick's commands in a pipeline of which only one is in flight, the
  // next queued behind it. Under the api's load that kept every request's command objects alive
  // long enough to be promoted: 2.9 kB per request died in the old generation with it, 0.1 kB
  // without, and with it went the full collections, the api's p99 and part of its throughput
  // (bench/analysis.md, "The api's Redis client"). Batches are explicit (multi, pipeline) where a
  // role writes many commands at once.
  const redis = connectRedis('commands', { enableAutoPipelining: false, maxRetriesPerRequest: 3 });
  registerScripts(redis);
  const ctx: RoleContext = {
    logger,
    metrics: createMetrics(`runtime-${role}`, c.ACTIVITY_ID),
    redis,
    redisConnection,
    connectRedis,
    reservationAck: new AckDecidedOnFirstUse(async () =>
      reservationAckOf(
        redis,
        c.RESERVE_ACK ?? (await defaultAckMode(redis, usesSentinel(redisConnection))),
        cfg.RESERVE_ACK_REPLICAS,
        cfg.RESERVE_ACK_TIMEOUT_MS,
      ),
    ),
    readiness,
  };
  const connections = connect(role, cfg, logger);

  const closers = [
    ...(await START_ROLE[role](ctx, cfg, connections.clients)),
    ...connections.closers,
    { stage: 'clients', name: 'redis', close: () => redis.quit() } satisfies Closer,
  ];

  const shutdown = async (signal: string): Promise<void> => {
    if (ctx.readiness.stopping) return;
    ctx.readiness.stopping = true;
    logger.info({ signal }, 'stopping');
    const force = setTimeout(() => {
      logger.error('shutdown timed out; exiting');
      process.exit(1);
    }, cfg.SHUTDOWN_TIMEOUT_MS);
    force.unref();
    await closeInOrder(closers, logger);
    logger.info('stopped');
    process.exit(0);
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));
  ctx.readiness.started = true;
  logger.info({ role }, 'ready');
}

async function main(): Promise<void> {
  const command = process.argv[2] ?? '';
  if (command === 'migrate') {
    const url = process.env.DATABASE_URL;
    if (!url) throw new Error('invalid configuration:\n  DATABASE_URL: required');
    const applied = await migrate(url);
    process.stdout.write(applied.length ? `applied ${applied.join(', ')}\n` : 'schema up to date\n');
    return;
  }
  if (command === 'dlq') process.exit(await runDlqCli(process.argv.slice(3)));
  if (command === 'refund') process.exit(await runRefundCli(process.argv.slice(3)));
  if (!isRole(command)) {
    process.stderr.write(`usage: runtime <${roles.join('|')}|migrate|dlq|refund>\n`);
    process.exit(2);
  }
  await runRole(command);
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error).message}\n`);
  process.exit(1);
});
