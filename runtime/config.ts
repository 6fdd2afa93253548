/** The runtime's configuration: one typed object from the environment, validated at start. */
import { z } from 'zod';
import { env, envNumber, readConfig } from '../core/config.js';
import { kafkaSecurityEnvShape, kafkaSecurityFromEnv } from '../core/kafka.js';
import { isSafeId } from '../core/keys.js';
import { ORDER_BATCH_MAX_ORDERS } from '../core/order-message.js';
import { redisEnvIssue, redisEnvShape } from '../core/redis.js';

/**
 * `after-sale` is platform-level (one Deployment from the chart, no ACTIVITY_ID): it serves the
 * buyer API and payment notifications for every activity and sweeps every activity's expired
 * orders, for as long as orders live (docs/after-sale.md "The after-sale tier").
 */
export const roles = ['api', 'relay', 'consumer', 'jobs', 'all', 'after-sale'] as const;
export type Role = (typeof roles)[number];

/**
 * What each role connects to. A role's Secret holds only these (least privilege: the relay never
 * sees the database URL, the api never the Kafka credentials; docs/install.md "Security"), and
 * the configuration requires exactly these.
 */
export const ROLE_NEEDS = {
  api: { database: true, kafka: false },
  relay: { database: false, kafka: true },
  consumer: { database: true, kafka: true },
  jobs: { database: true, kafka: true },
  all: { database: true, kafka: true },
  'after-sale': { database: true, kafka: true },
} as const satisfies Readonly<Record<Role, { database: boolean; kafka: boolean }>>;

/** The longest wait a role asks Redis for besides RESERVE_ACK (relay.ts BLOCK, buckets.ts WAIT). */
const LONGEST_FIXED_REDIS_WAIT_MS = 1000;

const schema = z
  .object({
    /** PostgreSQL connection URL (every role but the relay; ROLE_NEEDS). */
    DATABASE_URL: z.string().url().optional(),
    /**
     * Redis: REDIS_URL (redis://host:port), or REDIS_SENTINELS (host:port,...) with
     * REDIS_SENTINEL_MASTER (and REDIS_SENTINEL_PASSWORD); see core/redis.ts.
     */
    ...redisEnvShape,
    /**
     * When the api answers 202: `replica` once the reservation is on RESERVE_ACK_REPLICAS
     * replicas (Redis WAIT), `local` once the primary has it. Unset: `replica` when the primary
     * is reached through Sentinel or has replicas at start, else `local` (docs/install.md).
     */
    RESERVE_ACK: z.enum(['replica', 'local']).optional(),
    RESERVE_ACK_REPLICAS: env.int(1, 1),
    /** How long the api waits for the replicas before answering 503 NOT_REPLICATED (retry with the same requestId). */
    RESERVE_ACK_TIMEOUT_MS: env.int(500, 1),
    /**
     * How long any Redis command of a role may go unanswered before it fails (ioredis
     * `commandTimeout`): a Redis that stalls (a paused VM, a hung disk, a partition) answers nothing
     * and closes nothing, and without it every buyer's request waited as long as the stall. The
     * api answers 503 UNAVAILABLE (retry with the same requestId: a reservation the stalled Redis
     * made after all is replayed). At least a second more than the longest wait a role asks Redis
     * for (RESERVE_ACK_TIMEOUT_MS, the relay's 1 s blocking read, a stock transfer's 1 s WAIT).
     */
    REDIS_COMMAND_TIMEOUT_MS: env.int(5_000, 1),
    /** Kafka bootstrap brokers, comma separated host:port (every role but the api; ROLE_NEEDS). */
    KAFKA_BROKERS: env.list(),
    /** The activity this process serves (required for relay, consumer and jobs). */
    ACTIVITY_ID: z
      .string()
      .optional()
      .refine((v) => v === undefined || isSafeId(v), 'not a safe activity id'),
    HTTP_PORT: env.int(8080),
    HTTP_HOST: z.string().default('0.0.0.0'),
    /**
     * Connections the service port's listening socket holds while the process has not yet
     * accepted them (listen(2)'s backlog; the kernel caps it at net.core.somaxconn). A sale opens
     * with a burst of new connections: past Node's default of 511, the kernel drops the rest's
     * handshakes and the buyers' clients retry them a second later (TCP's SYN retransmission).
     */
    HTTP_BACKLOG: env.int(4096, 1),
    /**
     * Port of /metrics (with /healthz and /readyz), apart from the buyer port so that the buyer
     * Service never exposes it; must differ from HTTP_PORT.
     */
    METRICS_PORT: env.int(9090, 1),
    /**
     * Buyer tokens (runtime/api/auth.ts): an HS256 shared secret (>= 32 bytes), an RS256 public
     * key (PEM, SPKI, >= 2048 bits) or a JSON Web Key Set with a `kid` per key (rotation).
     */
    JWT_HS256_SECRET: z.string().min(32, 'use at least 32 characters').optional(),
    JWT_RS256_PUBLIC_KEY: z.string().optional(),
    JWT_JWKS: z.string().optional(),
    /** Expected `iss` and `aud` of buyer tokens (checked when set; the chart requires both). */
    JWT_ISSUER: z.string().min(1).optional(),
    JWT_AUDIENCE: z.string().min(1).optional(),
    /** A token is refused once this many seconds past its `iat` (which is required), whatever its `exp`. */
    JWT_MAX_TOKEN_AGE_SECONDS: env.int(3600, 1),
    /** Clock skew allowed on `exp`, `nbf` and `iat`. */
    JWT_CLOCK_TOLERANCE_SECONDS: env.int(30, 0),
    /**
     * A cancel marker (cancel by requestId before the reservation arrived) expires this long after
     * the sale's end; and one buyer may leave at most CANCEL_MARKERS_PER_BUYER per activity.
     */
    CANCEL_MARKER_GRACE_SECONDS: env.int(86_400, 1),
    CANCEL_MARKERS_PER_BUYER: env.int(16, 0),
    /** Seconds a buyer has to pay before the order is closed and its stock returned. */
    PAYMENT_TIMEOUT_SECONDS: env.int(900, 1),
    KAFKA_TOPIC_PREFIX: z.string().default('flashsale'),
    /**
     * Replication of the topics this process creates (the order-events topic): -1 = the brokers'
     * default.replication.factor; min.insync.replicas unset = factor - 1 (at least 1), or the
     * brokers' setting with -1. The operator passes its own settings to the pods it creates.
     */
    KAFKA_REPLICATION_FACTOR: envNumber(
      z.coerce
        .number()
        .int()
        .min(-1)
        .refine((n) => n !== 0, 'at least 1, or -1')
        .default(-1),
    ),
    KAFKA_MIN_INSYNC_REPLICAS: envNumber(z.coerce.number().int().min(1).optional()),
    /** Kafka TLS and SASL: read and checked by core/kafka.ts kafkaSecurityFromEnv (README). */
    ...kafkaSecurityEnvShape,
    /** One-time order codes live this long. */
    ORDER_CODE_TTL_SECONDS: env.int(30, 1),
    /** Largest JSON body the api accepts. */
    HTTP_BODY_LIMIT: z.string().default('8kb'),
    // --- Traffic shaping and admission control (docs/operator.md "Traffic shaping and eligibility") ---
    /**
     * Proxy hops in front of the api whose X-Forwarded-For the api believes for the client address:
     * '' = none (the peer address), a number = that many hops, or a comma-separated list of proxy
     * addresses/CIDRs (express `trust proxy`, e.g. `loopback,10.0.0.0/8`).
     */
    API_TRUST_PROXY: z.string().default(''),
    /**
     * Requests one api process works on at once before it sheds with 503 OVERLOADED; 0 = no cap.
     * A request with a body counts once its body is read (a slow client holds no place).
     */
    API_MAX_IN_FLIGHT: env.int(1000, 0),
    /** Shed while the p99 event-loop delay of the last window exceeds this (ms); 0 = off. */
    API_MAX_EVENT_LOOP_DELAY_MS: env.int(1000, 0),
    /** Length of one event-loop delay sampling window (ms). */
    API_EVENT_LOOP_SAMPLE_MS: env.int(500, 50),
    /** Retry-After (seconds) of a shed request. */
    API_SHED_RETRY_AFTER_SECONDS: env.int(1, 1),
    /**
     * V8's allocation-site pretenuring in the api role (runtime/v8-tuning.ts). Off by default: under
     * load V8 takes a request's objects for long-lived and allocates them straight into the old
     * generation, which then needs a full collection every few megabytes in a pod's heap limit.
     */
    API_V8_PRETENURING: env.bool(false),
    /**
     * How far V8 lets the api's old generation grow between full collections, in percent of what
     * was live after the last one (runtime/v8-tuning.ts); 0 = V8's own choice (1.3x in a 512Mi pod).
     */
    API_V8_HEAP_GROWING_PERCENT: env.int(100, 0),
    /**
     * The same for the relay and the consumer (runtime/v8-tuning.ts): with 32 MiB semi-spaces
     * V8's own 1.3x started a full collection after every 7-10 MB promoted, about 10 per second in a
     * drain; 0 = V8's own choice.
     */
    RELAY_V8_HEAP_GROWING_PERCENT: env.int(100, 0),
    CONSUMER_V8_HEAP_GROWING_PERCENT: env.int(100, 0),
    /** Each api process re-reads an activity's traffic policy from Redis at most this often (ms). */
    API_POLICY_REFRESH_MS: env.int(1000, 0),
    /** A sold-out flag is re-checked against Redis at most this often (restock events reset it at once). */
    SOLD_OUT_RECHECK_MS: env.int(2000, 0),
    /** Half messages per Kafka produce request: each request waits for acks=all, so bigger batches carry more per wait. */
    RELAY_BATCH_SIZE: env.int(2000, 1),
    /**
     * Orders per Kafka message at most: a read's half messages bound for one partition travel as one
     * batch message (runtime/relay/relay.ts). 1 sends one message per order, the only format that
     * consumers older than batches read: set it while such consumers still run (CHANGELOG).
     */
    RELAY_ORDERS_PER_MESSAGE: envNumber(
      z.coerce.number().int().min(1).max(ORDER_BATCH_MAX_ORDERS).default(500),
    ),
    /**
     * A half message pending this long on a silent relay (SIGKILLed, or its pod gone) is reclaimed
     * by another: a few seconds, so a crash does not hold orders back. A relay that is merely slow
     * may see its entries sent twice; the consumer's unique keys absorb that.
     */
    RELAY_RECLAIM_IDLE_MS: env.int(5_000, 100),
    /** Stable name of this relay in the stream's consumer group (defaults to the host name). */
    RELAY_CONSUMER_NAME: z.string().optional(),
    /**
     * Relay loops per process, each with its own stream consumer name (`<name>-<i>`), blocking
     * Redis connection and Kafka producer: while one waits for Kafka's acks the others read and send.
     * 8: a backlog of 100,000 drained in 6.2-6.3 s instead of 7.3-7.5 s with 4, the stream empty
     * after 2.9-3.3 s instead of 4.3-4.7 s (bench/analysis.md, drain).
     */
    RELAY_CONCURRENCY: env.int(8, 1),
    /**
     * Orders per insert transaction (one commit, one results write per batch), in whole Kafka
     * messages: a relay's batch message is never split, so a transaction may hold up to
     * RELAY_ORDERS_PER_MESSAGE - 1 more.
     */
    CONSUMER_BATCH_SIZE: env.int(2000, 1),
    /** Partitions whose batches are written at the same time (each in its own transaction). */
    CONSUMER_PARTITION_CONCURRENCY: env.int(4, 1),
    /**
     * Bytes one fetch may bring per partition (kafkajs maxBytesPerPartition): what the consumer
     * holds decoded at a time. 4 MiB drains fastest; 1 MiB lowers its peak RSS by about 30 MB and
     * 256 KiB by about 75 MB, at more CPU per order (docs/capacity.md, memory).
     */
    CONSUMER_FETCH_MAX_BYTES_PER_PARTITION: env.int(4 << 20, 1024),
    /**
     * kafkajs consumer group timing. A SIGKILLed consumer keeps its partitions until the broker
     * misses its heartbeats for the session timeout, and a rebalance waits for members up to the
     * rebalance timeout: both bound how long a crash stalls orders (kafkajs' defaults, 30 s and
     * 60 s, left buyers waiting a minute). The session timeout must lie within the broker's
     * group.min/max.session.timeout.ms (6 s to 30 min by default); the heartbeat interval well
     * below a third of it. The consumer also heartbeats after every chunk it writes, and within a
     * chunk between dead letters, orders written one by one and retry sleeps (kafkajs 2.2.4 sends
     * none in the background).
     */
    CONSUMER_SESSION_TIMEOUT_MS: env.int(8_000, 1_000),
    CONSUMER_HEARTBEAT_INTERVAL_MS: env.int(1_000, 100),
    CONSUMER_REBALANCE_TIMEOUT_MS: env.int(8_000, 1_000),
    /** Attempts before a message that keeps failing for a non-transient reason goes to the DLQ. */
    CONSUMER_MAX_ATTEMPTS: env.int(3, 1),
    /**
     * Reservations older than this with no order count as the order gap (and are repaired): above
     * the time the primary path needs to recover from a crashed relay or consumer (a few seconds,
     * see CONSUMER_SESSION_TIMEOUT_MS), so the repair stays the last resort.
     */
    ORDER_GAP_THRESHOLD_SECONDS: env.int(15, 1),
    /** Run the scheduled jobs in the consumer role too (the jobs role always runs them). */
    JOBS_IN_CONSUMER: env.bool(true),
    /** node-cron expression (with seconds) for the gauges and order-gap check. */
    JOBS_GAUGE_CRON: z.string().default('*/5 * * * * *'),
    DB_POOL_SIZE: env.int(10, 1),
    SHUTDOWN_TIMEOUT_MS: env.int(20_000, 1000),
    LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    // --- After-sale (docs/after-sale.md) ---
    /** Shared secret of the built-in HMAC-SHA256 payment provider; unset = no payment endpoint. */
    PAYMENT_HMAC_SECRET: z.string().min(32, 'use at least 32 characters').optional(),
    /** The previous secret, still accepted while a rotation is in progress. */
    PAYMENT_HMAC_SECRET_PREVIOUS: z.string().min(32, 'use at least 32 characters').optional(),
    /** Our app id and merchant id at the provider; notifications naming others are refused (403). */
    PAYMENT_HMAC_APP_ID: z.string().min(1).optional(),
    PAYMENT_HMAC_MERCHANT_ID: z.string().min(1).optional(),
    /** Provider name in the notification URL (/v1/payments/<name>/notifications) and payment rows. */
    PAYMENT_HMAC_PROVIDER_NAME: z
      .string()
      .regex(/^[a-z][a-z0-9-]{0,15}$/)
      .default('hmac'),
    /** Largest accepted age (and clock skew) of a notification's signed timestamp; 0 disables the check. */
    PAYMENT_SIGNATURE_TOLERANCE_SECONDS: env.int(300, 0),
    /** node-cron expression (with seconds) of the payment-timeout sweeper. */
    PAYMENT_SWEEP_CRON: z.string().default('*/10 * * * * *'),
    /** Orders closed per sweeper transaction, and batches per run. */
    PAYMENT_SWEEP_BATCH_SIZE: env.int(500, 1),
    PAYMENT_SWEEP_MAX_BATCHES: env.int(20, 1),
    /** A closed order whose stock is still unsettled this long after closing is settled again by the sweeper. */
    STOCK_SETTLE_GRACE_SECONDS: env.int(30, 0),
    /** Re-publish reservations with no order (order gap) from their ledger entries. */
    ORDER_GAP_REPAIR: env.bool(true),
    /** Seconds between two re-publications of one reservation, and the most re-publications before a human is needed. */
    ORDER_GAP_REPUBLISH_INTERVAL_SECONDS: env.int(20, 1),
    ORDER_GAP_MAX_REPUBLISH: env.int(5, 1),
    /** node-cron expression (with seconds) of the Redis/ledger/PostgreSQL reconciliation. */
    RECONCILIATION_CRON: z.string().default('0 */5 * * * *'),
    /** Reconciliation reports older than this many days are deleted (an activity's newest is kept); 0 = keep all. */
    RECONCILIATION_REPORT_RETENTION_DAYS: env.int(30, 0),
    /**
     * Buyers' pre-registrations of a sale that ended more than this many days ago are deleted by
     * the after-sale role (on RECONCILIATION_CRON); 0 = keep all.
     */
    REGISTRATION_RETENTION_DAYS: env.int(30, 0),
    // --- Refunds and order events (docs/after-sale.md "Refunds", docs/order-events.md) ---
    /** The built-in provider's refund endpoint (signed POST); unset = refunds wait PENDING (alerted). */
    PAYMENT_HMAC_REFUND_URL: z.string().url().optional(),
    /** A refund call is abandoned after this long and retried later with the same refund id. */
    REFUND_PROVIDER_TIMEOUT_MS: env.int(10_000, 100),
    /** node-cron expression (with seconds) of the refund worker. */
    REFUND_WORKER_CRON: z.string().default('*/5 * * * * *'),
    /** Refunds claimed (and surplus payments taken) per worker run. */
    REFUND_BATCH_SIZE: env.int(50, 1),
    /** Retry backoff of refund calls: base * 2^attempt seconds, at most max (never under the call timeout). */
    REFUND_RETRY_BASE_SECONDS: env.int(5, 1),
    REFUND_RETRY_MAX_SECONDS: env.int(600, 1),
    /** Run the order-event relay (outbox -> <prefix>.order-events) in the processes that run jobs. */
    ORDER_EVENTS_RELAY: env.bool(true),
    /** Events per Kafka send (one transaction each), and the idle poll interval of the relay. */
    ORDER_EVENTS_BATCH_SIZE: env.int(500, 1),
    ORDER_EVENTS_POLL_MS: env.int(500, 10),
    /** Partitions of the order-events topic when the relay creates it. */
    ORDER_EVENTS_PARTITIONS: env.int(6, 1),
    /** A Kafka send of the relay taking longer is abandoned (rolled back) and sent again. */
    ORDER_EVENTS_SEND_TIMEOUT_MS: env.int(30_000, 100),
    /** Published events are kept in the outbox this long, then purged. */
    ORDER_EVENTS_RETENTION_HOURS: env.int(24, 0),
    /** An order-events topic refused for its replication is checked again this often. */
    ORDER_EVENTS_TOPIC_RETRY_MS: env.int(30_000, 100),
    /** The outbox backlog gauges are sampled from PostgreSQL this often. */
    ORDER_EVENTS_BACKLOG_SAMPLE_MS: env.int(15_000, 100),
  })
  .refine(
    (c) => c.KAFKA_REPLICATION_FACTOR < 1 || (c.KAFKA_MIN_INSYNC_REPLICAS ?? 1) <= c.KAFKA_REPLICATION_FACTOR,
    {
      // Kafka accepts such a topic and then refuses every acks=all write to it (NOT_ENOUGH_REPLICAS).
      message: 'KAFKA_MIN_INSYNC_REPLICAS must be at most KAFKA_REPLICATION_FACTOR',
      path: ['KAFKA_MIN_INSYNC_REPLICAS'],
    },
  )
  .refine((c) => c.CONSUMER_HEARTBEAT_INTERVAL_MS * 3 <= c.CONSUMER_SESSION_TIMEOUT_MS, {
    message: 'CONSUMER_HEARTBEAT_INTERVAL_MS must be at most a third of CONSUMER_SESSION_TIMEOUT_MS',
    path: ['CONSUMER_HEARTBEAT_INTERVAL_MS'],
  })
  .refine(
    (c) =>
      c.REDIS_COMMAND_TIMEOUT_MS >= Math.max(c.RESERVE_ACK_TIMEOUT_MS, LONGEST_FIXED_REDIS_WAIT_MS) + 1000,
    {
      message: `must be at least 1000 more than RESERVE_ACK_TIMEOUT_MS and than ${LONGEST_FIXED_REDIS_WAIT_MS} (the relay's blocking read): a wait Redis is asked for must not time out`,
      path: ['REDIS_COMMAND_TIMEOUT_MS'],
    },
  )
  .superRefine((c, ctx) => {
    const issue = redisEnvIssue(c);
    if (issue) ctx.addIssue({ code: z.ZodIssueCode.custom, path: [issue.path], message: issue.message });
  })
  .refine((c) => [c.JWT_HS256_SECRET, c.JWT_RS256_PUBLIC_KEY, c.JWT_JWKS].filter(Boolean).length <= 1, {
    message: 'set one of JWT_HS256_SECRET, JWT_RS256_PUBLIC_KEY and JWT_JWKS, not both or more',
    path: ['JWT_HS256_SECRET'],
  })
  .refine((c) => c.METRICS_PORT !== c.HTTP_PORT, {
    message: 'must differ from HTTP_PORT (metrics stay off the buyer port)',
    path: ['METRICS_PORT'],
  })
  .refine((c) => !c.PAYMENT_HMAC_SECRET || (c.PAYMENT_HMAC_APP_ID && c.PAYMENT_HMAC_MERCHANT_ID), {
    message: 'PAYMENT_HMAC_APP_ID and PAYMENT_HMAC_MERCHANT_ID are required with PAYMENT_HMAC_SECRET',
    path: ['PAYMENT_HMAC_SECRET'],
  });

export type RuntimeConfig = z.infer<typeof schema>;

/** The settings every role may read; the connections and the activity are per role (below). */
type SharedConfig = Omit<RuntimeConfig, 'DATABASE_URL' | 'KAFKA_BROKERS' | 'ACTIVITY_ID'>;
type NeedsOf<R extends Role> = (typeof ROLE_NEEDS)[R];

/**
 * One role's configuration, derived from ROLE_NEEDS: a role that needs no database has no
 * DATABASE_URL in its type (nor in the object loadRuntimeConfig returns), one that needs no Kafka
 * no KAFKA_BROKERS; the activity roles have an ACTIVITY_ID, the platform-level after-sale role none.
 * `all` has everything, so its configuration is also every other role's.
 */
export type RoleConfig<R extends Role> = SharedConfig &
  (NeedsOf<R>['database'] extends true ? { DATABASE_URL: string } : unknown) &
  (NeedsOf<R>['kafka'] extends true ? { KAFKA_BROKERS: string[] } : unknown) &
  (R extends 'after-sale'
    ? unknown
    : R extends 'api'
      ? { ACTIVITY_ID?: string | undefined }
      : { ACTIVITY_ID: string });

export type ApiConfig = RoleConfig<'api'>;
export type RelayConfig = RoleConfig<'relay'>;
export type ConsumerConfig = RoleConfig<'consumer'>;
export type JobsConfig = RoleConfig<'jobs'>;
export type AfterSaleConfig = RoleConfig<'after-sale'>;
export type AllConfig = RoleConfig<'all'>;

/** API_TRUST_PROXY as express' `trust proxy` value. */
export function trustProxySetting(value: string): boolean | number | string[] {
  const v = value.trim();
  if (v === '' || v === 'false' || v === '0') return false;
  if (/^\d+$/.test(v)) return Number(v);
  return v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
}

export function loadRuntimeConfig<R extends Role>(
  role: R,
  source: NodeJS.ProcessEnv = process.env,
): RoleConfig<R> {
  const cfg = readConfig(schema, source);
  if (role === 'after-sale' && cfg.ACTIVITY_ID) {
    throw new Error(
      'invalid configuration:\n  ACTIVITY_ID: the after-sale role serves every activity; unset it',
    );
  }
  const needs = ROLE_NEEDS[role];
  if (needs.database && !cfg.DATABASE_URL) {
    throw new Error(`invalid configuration:\n  DATABASE_URL: required for the ${role} role`);
  }
  if (needs.kafka && cfg.KAFKA_BROKERS.length === 0) {
    throw new Error(`invalid configuration:\n  KAFKA_BROKERS: at least one broker, for the ${role} role`);
  }
  if (role !== 'api' && role !== 'after-sale' && !cfg.ACTIVITY_ID) {
    throw new Error(`invalid configuration:\n  ACTIVITY_ID: required for the ${role} role`);
  }
  if (
    (role === 'api' || role === 'all' || role === 'after-sale') &&
    !cfg.JWT_HS256_SECRET &&
    !cfg.JWT_RS256_PUBLIC_KEY &&
    !cfg.JWT_JWKS
  ) {
    throw new Error(
      `invalid configuration:\n  JWT_HS256_SECRET: set it, JWT_RS256_PUBLIC_KEY or JWT_JWKS for the ${role} role`,
    );
  }
  // Validated here so that a bad Kafka security setting stops the start with its variable named.
  kafkaSecurityFromEnv(source);
  // The role's slice: what it does not need is not handed to it, even when the environment has it.
  const { DATABASE_URL, KAFKA_BROKERS, ACTIVITY_ID, ...shared } = cfg;
  return {
    ...shared,
    ...(needs.database ? { DATABASE_URL } : {}),
    ...(needs.kafka ? { KAFKA_BROKERS } : {}),
    ...(role === 'after-sale' ? {} : { ACTIVITY_ID }),
  } as RoleConfig<R>;
}
