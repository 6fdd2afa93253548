/** The runtime's configuration: one typed object from the environment, validated at start. */
import { z } from 'zod';
import { env, readConfig } from '../core/config.js';
import { isSafeId } from '../core/keys.js';

export const roles = ['api', 'relay', 'consumer', 'jobs', 'all'] as const;
export type Role = (typeof roles)[number];

const schema = z
  .object({
    /** PostgreSQL connection URL. */
    DATABASE_URL: z.string().url(),
    /** Redis URL (redis://host:port). */
    REDIS_URL: z.string().url(),
    /** Kafka bootstrap brokers, comma separated host:port. */
    KAFKA_BROKERS: env.list().refine((l) => l.length > 0, 'at least one broker'),
    /** The activity this process serves (required for relay, consumer and jobs). */
    ACTIVITY_ID: z
      .string()
      .optional()
      .refine((v) => v === undefined || isSafeId(v), 'not a safe activity id'),
    HTTP_PORT: env.int(8080),
    HTTP_HOST: z.string().default('0.0.0.0'),
    /** Buyer tokens: an HS256 shared secret (>= 32 bytes) or an RS256 public key (PEM, SPKI). */
    JWT_HS256_SECRET: z.string().min(32, 'use at least 32 characters').optional(),
    JWT_RS256_PUBLIC_KEY: z.string().optional(),
    JWT_ISSUER: z.string().optional(),
    JWT_AUDIENCE: z.string().optional(),
    /** Seconds a buyer has to pay before the order is closed and its stock returned. */
    PAYMENT_TIMEOUT_SECONDS: env.int(900, 1),
    KAFKA_TOPIC_PREFIX: z.string().default('flashsale'),
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
    /** Requests one api process works on at once before it sheds with 503 OVERLOADED; 0 = no cap. */
    API_MAX_IN_FLIGHT: env.int(1000, 0),
    /** Shed while the p99 event-loop delay of the last window exceeds this (ms); 0 = off. */
    API_MAX_EVENT_LOOP_DELAY_MS: env.int(1000, 0),
    /** Length of one event-loop delay sampling window (ms). */
    API_EVENT_LOOP_SAMPLE_MS: env.int(500, 50),
    /** Retry-After (seconds) of a shed request. */
    API_SHED_RETRY_AFTER_SECONDS: env.int(1, 1),
    /** Each api process re-reads an activity's traffic policy from Redis at most this often (ms). */
    API_POLICY_REFRESH_MS: env.int(1000, 0),
    /** A sold-out flag is re-checked against Redis at most this often (restock events reset it at once). */
    SOLD_OUT_RECHECK_MS: env.int(2000, 0),
    /** Half messages per Kafka produce request: each request waits for acks=all, so bigger batches carry more per wait. */
    RELAY_BATCH_SIZE: env.int(2000, 1),
    /** A half message pending this long on a silent relay is reclaimed by another. */
    RELAY_RECLAIM_IDLE_MS: env.int(15_000, 100),
    /** Stable name of this relay in the stream's consumer group (defaults to the host name). */
    RELAY_CONSUMER_NAME: z.string().optional(),
    /**
     * Relay loops per process, each with its own stream consumer name (`<name>-<i>`), blocking
     * Redis connection and Kafka producer: while one waits for Kafka's acks the others read and send.
     */
    RELAY_CONCURRENCY: env.int(4, 1),
    /** Orders per insert transaction (one commit, one results write per batch). */
    CONSUMER_BATCH_SIZE: env.int(2000, 1),
    /** Partitions whose batches are written at the same time (each in its own transaction). */
    CONSUMER_PARTITION_CONCURRENCY: env.int(4, 1),
    /** Attempts before a message that keeps failing for a non-transient reason goes to the DLQ. */
    CONSUMER_MAX_ATTEMPTS: env.int(3, 1),
    /** Reservations older than this with no order count as the order gap. */
    ORDER_GAP_THRESHOLD_SECONDS: env.int(30, 1),
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
    ORDER_GAP_REPUBLISH_INTERVAL_SECONDS: env.int(60, 1),
    ORDER_GAP_MAX_REPUBLISH: env.int(5, 1),
    /** node-cron expression (with seconds) of the Redis/ledger/PostgreSQL reconciliation. */
    RECONCILIATION_CRON: z.string().default('0 */5 * * * *'),
  })
  .refine((c) => !(c.JWT_HS256_SECRET && c.JWT_RS256_PUBLIC_KEY), {
    message: 'set JWT_HS256_SECRET or JWT_RS256_PUBLIC_KEY, not both',
    path: ['JWT_HS256_SECRET'],
  })
  .refine((c) => !c.PAYMENT_HMAC_SECRET || (c.PAYMENT_HMAC_APP_ID && c.PAYMENT_HMAC_MERCHANT_ID), {
    message: 'PAYMENT_HMAC_APP_ID and PAYMENT_HMAC_MERCHANT_ID are required with PAYMENT_HMAC_SECRET',
    path: ['PAYMENT_HMAC_SECRET'],
  });

export type RuntimeConfig = z.infer<typeof schema>;

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

export function loadRuntimeConfig(role: Role, source: NodeJS.ProcessEnv = process.env): RuntimeConfig {
  const cfg = readConfig(schema, source);
  if (role !== 'api' && !cfg.ACTIVITY_ID) {
    throw new Error(`invalid configuration:\n  ACTIVITY_ID: required for the ${role} role`);
  }
  if ((role === 'api' || role === 'all') && !cfg.JWT_HS256_SECRET && !cfg.JWT_RS256_PUBLIC_KEY) {
    throw new Error(
      'invalid configuration:\n  JWT_HS256_SECRET: set it or JWT_RS256_PUBLIC_KEY for the api role',
    );
  }
  return cfg;
}
