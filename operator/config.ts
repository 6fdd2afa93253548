/**
 * The operator's configuration: one typed object read from the environment and validated at
 * start-up. Every variable is documented in docs/operator.md ("Configuration").
 */
import { hostname } from 'node:os';
import type { V1EnvVar, V1TopologySpreadConstraint, V1Volume, V1VolumeMount } from '@kubernetes/client-node';
import { z } from 'zod';
import { redisConnectionOf, redisEnvIssue, redisEnvShape } from '../core/redis.js';
import type { RedisConnection } from '../core/redis.js';
import { env, envNumber, readConfig } from '../core/config.js';
import { defaultMinInsyncReplicas, kafkaSecurityEnvShape, kafkaSecurityFromEnv } from '../core/kafka.js';
import { MAX_BUCKETS } from '../core/buckets.js';
import { MAX_SEMI_SPACE_MIB } from '../core/young-generation.js';
import { DEFAULT_TRAFFIC_POLICY, POLICY_LIMITS } from '../core/traffic-policy.js';
import type { TrafficPolicy } from '../core/traffic-policy.js';

const D = DEFAULT_TRAFFIC_POLICY;

const quantities = z.record(z.string(), z.union([z.string(), z.number()]).transform(String));
const resourcesSchema = z.object({ requests: quantities.optional(), limits: quantities.optional() }).strict();
export type ContainerResources = z.infer<typeof resourcesSchema>;

/** A JSON environment value parsed with `schema` ('' = `empty`); a parse error names the variable. */
function jsonEnv<T extends z.ZodType>(schema: T, empty: z.infer<T>) {
  return z
    .string()
    .default('')
    .transform((text, zctx): z.infer<T> => {
      if (text.trim() === '') return empty;
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch (err) {
        zctx.addIssue({ code: 'custom', message: `not JSON: ${String(err)}` });
        return z.NEVER;
      }
      const parsed = schema.safeParse(value);
      if (!parsed.success) {
        for (const i of parsed.error.issues) {
          zctx.addIssue({ code: 'custom', message: `${i.path.join('.') || '(root)'}: ${i.message}` });
        }
        return z.NEVER;
      }
      return parsed.data as z.infer<T>;
    });
}

// Kubernetes objects passed through to the runtime pods: the fields the operator relies on are
// checked here, the rest by the API server's schema when the Deployment is applied.
const named = z.object({ name: z.string().min(1) }).passthrough();
// Each role's pods read only their role's Secret (ARCHITECTURE.md): secrets for the runtime go into
// that Secret (the chart's runtime.extraSecretData), never into an extra variable or volume.
const NO_SECRETS = 'no Secret references: put secrets in the role Secret (runtime.extraSecretData)';
const envVarSchema = named
  .refine((e) => !('value' in e && 'valueFrom' in e), 'set value or valueFrom, not both')
  .refine((e) => !JSON.stringify(e.valueFrom ?? {}).includes('"secretKeyRef"'), NO_SECRETS);
const volumeSchema = named.refine(
  (v) => !('secret' in v) && !JSON.stringify(v.projected ?? {}).includes('"secret"'),
  NO_SECRETS,
);
const volumeMountSchema = named.extend({ mountPath: z.string().min(1) }).passthrough();
const spreadSchema = z
  .object({
    maxSkew: z.number().int().min(1),
    topologyKey: z.string().min(1),
    whenUnsatisfiable: z.enum(['DoNotSchedule', 'ScheduleAnyway']),
  })
  .passthrough();
const roleSettingsSchema = z
  .object({
    /** PriorityClass of the role's pods ('' = the cluster's default). */
    priorityClassName: z.string().default(''),
    /** Seconds the pod sleeps in preStop before SIGTERM (endpoints and load balancers let go first). */
    preStopSeconds: z.number().int().min(0).max(300).default(0),
    /** Spread constraints; a constraint without labelSelector gets the role's pod labels. */
    topologySpreadConstraints: z.array(spreadSchema).default([]),
    /** A PodDisruptionBudget for the role while the sale is Active (protect-runtime.ts). */
    disruptionBudget: z.boolean().default(true),
    /**
     * MiB per V8 semi-space, on the container's command line (core/young-generation.ts); 0 = the
     * image's NODE_OPTIONS (8). Unset: the role's default (api 0, relay 16, consumer 16).
     */
    semiSpaceMiB: z.number().int().min(0).max(MAX_SEMI_SPACE_MIB).optional(),
    /** Resources of this role's containers instead of RUNTIME_RESOURCES ({} = RUNTIME_RESOURCES). */
    resources: resourcesSchema.optional().transform((r) => (r?.requests || r?.limits ? r : undefined)),
  })
  .strict();
const roleSettingsDefaults = roleSettingsSchema.parse({});
const rolesSchema = z
  .object({
    api: roleSettingsSchema.default(roleSettingsDefaults),
    relay: roleSettingsSchema.default(roleSettingsDefaults),
    consumer: roleSettingsSchema.default(roleSettingsDefaults),
  })
  .strict();
export type RuntimeRoleSettings = Omit<z.infer<typeof roleSettingsSchema>, 'topologySpreadConstraints'> & {
  topologySpreadConstraints: V1TopologySpreadConstraint[];
};

const durationSeconds = (def: number, min = 0) => envNumber(z.coerce.number().min(min).default(def));

export const operatorConfigSchema = z
  .object({
    DATABASE_URL: z.string().min(1),
    /** REDIS_URL, or REDIS_SENTINELS + REDIS_SENTINEL_MASTER (core/redis.ts). */
    ...redisEnvShape,
    /**
     * The longest the operator waits for one Redis reply: its longest commands are warm-up
     * pipelines (100,000 SKUs in about a second here) and WAITs of at most a second.
     */
    REDIS_COMMAND_TIMEOUT_MS: env.int(10_000, 2_000),
    KAFKA_BROKERS: env.list().refine((l) => l.length > 0, 'at least one broker'),
    KAFKA_TOPIC_PREFIX: z.string().min(1).default('flashsale'),
    KAFKA_TOPIC_PARTITIONS: env.int(3, 1),
    /**
     * The most partitions the operator gives an orders topic for its consumer replicas
     * (grow-partitions.ts): tenants share the brokers, and partitions can never be removed.
     */
    KAFKA_MAX_TOPIC_PARTITIONS: env.int(64, 1),
    KAFKA_REPLICATION_FACTOR: env.int(1, 1),
    /** min.insync.replicas of the topics created; unset = replication factor - 1, at least 1. */
    KAFKA_MIN_INSYNC_REPLICAS: envNumber(z.coerce.number().int().min(1).optional()),
    /** Kafka TLS and SASL: read and checked by core/kafka.ts kafkaSecurityFromEnv (README). */
    ...kafkaSecurityEnvShape,
    /**
     * Namespaces to watch, comma-separated (the ClusterRole bound by a RoleBinding in each); empty =
     * every namespace (needs the ClusterRole bound cluster-wide).
     */
    WATCH_NAMESPACE: env.list(),
    /** The operator's own namespace (downward API); holds the leader Lease. */
    POD_NAMESPACE: z.string().default('flashsale-system'),
    POD_NAME: z.string().optional(),
    OPERATOR_IDENTITY: z.string().optional(),
    LEADER_ELECTION: env.bool(true),
    LEASE_NAME: z.string().default('flashsale-operator'),
    LEASE_NAMESPACE: z.string().optional(),
    LEASE_DURATION_SECONDS: durationSeconds(15, 1),
    LEASE_RENEW_DEADLINE_SECONDS: durationSeconds(10, 1),
    LEASE_RETRY_PERIOD_SECONDS: durationSeconds(2, 0.1),
    HTTP_PORT: env.int(8081),
    WORKERS: env.int(2, 1),
    RELIST_SECONDS: durationSeconds(300, 1),
    STATUS_REFRESH_SECONDS: durationSeconds(10, 0),
    DRAIN_CHECK_SECONDS: durationSeconds(2, 0.1),
    CLEANUP_RETRY_SECONDS: durationSeconds(5, 0.1),
    /**
     * A cache restore (operator/reconcile/restore-cache.ts) reloads only once the gate has been
     * paused this long and the backlog is empty: a relay that read a batch just before Redis lost
     * it produces it to Kafka within this time, and the wait for consumer lag 0 then covers it.
     */
    RESTORE_SETTLE_SECONDS: durationSeconds(15, 0),
    /**
     * Settling: payments and refunds change an activity's orders without any Kubernetes event,
     * so the settlement is re-checked this often (besides the exact instant of the last deadline).
     */
    SETTLE_CHECK_SECONDS: durationSeconds(30, 0.1),
    ORDER_GAP_THRESHOLD_SECONDS: durationSeconds(30, 0),
    RETRY_BASE_MS: env.int(500, 1),
    RETRY_MAX_SECONDS: durationSeconds(60, 1),
    DEFAULT_WARM_UP_LEAD: z
      .string()
      .regex(/^(?:\d+(?:ms|s|m|h))+$/, 'a duration such as 5m')
      .default('5m'),
    RUNTIME_IMAGE: z.string().min(1).default('ghcr.io/flashsale/flashsale:0.1.0'),
    /**
     * Images an activity may choose with spec.runtime.image besides RUNTIME_IMAGE: exact
     * references (`repo:tag`, `repo@sha256:…`) or bare digests (`sha256:…`, any reference pinned
     * to that digest). Empty: spec.runtime.image may only repeat RUNTIME_IMAGE.
     */
    RUNTIME_ALLOWED_IMAGES: env
      .list()
      .refine(
        (l) => l.every((i) => !/\s/.test(i) && (!i.startsWith('sha256:') || /^sha256:[0-9a-f]{64}$/.test(i))),
        'image references or sha256:<64 hex> digests, comma-separated',
      ),
    RUNTIME_IMAGE_PULL_POLICY: z.enum(['Always', 'IfNotPresent', 'Never']).default('IfNotPresent'),
    /** Base name of the runtime Secrets: each role reads only `<name>-<role>` (api, relay, consumer). */
    RUNTIME_SECRET_NAME: z.string().min(1).default('flashsale-runtime'),
    RUNTIME_SERVICE_ACCOUNT: z.string().default(''),
    RUNTIME_HTTP_PORT: env.int(8080, 1),
    /** Port of the runtime's /metrics (apart from the buyer port; not behind the api Service). */
    RUNTIME_METRICS_PORT: env.int(9090, 1),
    /** Resources of every runtime container, as JSON: {"requests":{"cpu":"250m"},"limits":{...}}. */
    RUNTIME_RESOURCES: z
      .string()
      .default('')
      .transform((text, zctx) => {
        if (text.trim() === '') return undefined;
        try {
          return resourcesSchema.parse(JSON.parse(text));
        } catch (err) {
          zctx.addIssue({ code: 'custom', message: `not a resources object: ${String(err)}` });
          return z.NEVER;
        }
      }),
    /** Secrets (names, comma-separated) the runtime pods pull their image with. */
    RUNTIME_IMAGE_PULL_SECRETS: env.list(),
    /** More environment variables of every runtime container (JSON list of EnvVar). */
    RUNTIME_EXTRA_ENV: jsonEnv(z.array(envVarSchema), []),
    /** More volumes of the runtime pods and their mounts (JSON lists; e.g. a private CA bundle). */
    RUNTIME_EXTRA_VOLUMES: jsonEnv(z.array(volumeSchema), []),
    RUNTIME_EXTRA_VOLUME_MOUNTS: jsonEnv(z.array(volumeMountSchema), []),
    /**
     * Per-role pod settings, JSON: {"api":{"priorityClassName":"…","preStopSeconds":5,
     * "topologySpreadConstraints":[…],"disruptionBudget":true,"semiSpaceMiB":0,"resources":{…}},
     * "relay":{…},…}.
     */
    RUNTIME_ROLE_SETTINGS: jsonEnv(rolesSchema, rolesSchema.parse({})),
    LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    // Defaults of spec.trafficShaping and spec.eligibility (docs/operator.md).
    TRAFFIC_SHAPING_ENABLED: env.bool(D.shaping.enabled),
    // Held to the policy's bounds here: a default out of them would fail every activity's warm-up.
    TRAFFIC_PER_BUYER_REQUESTS: env.int(D.shaping.perBuyer.requests, 0, POLICY_LIMITS.requests),
    TRAFFIC_PER_BUYER_SECONDS: env.int(D.shaping.perBuyer.perSeconds, 1, POLICY_LIMITS.perSeconds),
    TRAFFIC_PER_ADDRESS_REQUESTS: env.int(D.shaping.perAddress.requests, 0, POLICY_LIMITS.requests),
    TRAFFIC_PER_ADDRESS_SECONDS: env.int(D.shaping.perAddress.perSeconds, 1, POLICY_LIMITS.perSeconds),
    ORDER_CODES_PER_BUYER_PER_SKU: env.int(
      D.eligibility.orderCodesPerBuyerPerSku,
      0,
      POLICY_LIMITS.orderCodesPerBuyerPerSku,
    ),
    /**
     * Defaults of spec.bucketing: a SKU without its own bucket count and with at least this much
     * stock is split (0 = never); unset = 15,000 on a Redis Cluster of several primaries, else 0
     * (core/buckets.ts defaultAutoBucketing).
     */
    AUTO_BUCKETS_STOCK_THRESHOLD: envNumber(
      z.coerce
        .number()
        .int()
        .min(0)
        .refine((n) => n === 0 || n >= 2, '0 (never split) or at least 2')
        .optional(),
    ),
    /** Buckets of such a SKU (2..64); unset = 2 per primary of the Redis Cluster. */
    AUTO_BUCKETS: envNumber(z.coerce.number().int().min(2).max(MAX_BUCKETS).optional()),
  })
  .superRefine((c, ctx) => {
    const issue = redisEnvIssue(c);
    if (issue) ctx.addIssue({ code: z.ZodIssueCode.custom, path: [issue.path], message: issue.message });
  })
  .refine((c) => (c.KAFKA_MIN_INSYNC_REPLICAS ?? 1) <= c.KAFKA_REPLICATION_FACTOR, {
    // Kafka accepts such a topic and then refuses every acks=all write to it (NOT_ENOUGH_REPLICAS).
    message: 'KAFKA_MIN_INSYNC_REPLICAS must be at most KAFKA_REPLICATION_FACTOR',
    path: ['KAFKA_MIN_INSYNC_REPLICAS'],
  })
  .refine(
    (c) =>
      c.AUTO_BUCKETS === undefined ||
      !c.AUTO_BUCKETS_STOCK_THRESHOLD ||
      c.AUTO_BUCKETS <= c.AUTO_BUCKETS_STOCK_THRESHOLD,
    {
      message:
        'AUTO_BUCKETS cannot exceed AUTO_BUCKETS_STOCK_THRESHOLD (a SKU at the threshold needs a unit per bucket)',
      path: ['AUTO_BUCKETS'],
    },
  )
  .refine((c) => c.LEASE_RENEW_DEADLINE_SECONDS < c.LEASE_DURATION_SECONDS, {
    message: 'LEASE_RENEW_DEADLINE_SECONDS must be less than LEASE_DURATION_SECONDS',
    path: ['LEASE_RENEW_DEADLINE_SECONDS'],
  })
  .refine((c) => c.LEASE_RETRY_PERIOD_SECONDS < c.LEASE_RENEW_DEADLINE_SECONDS, {
    message: 'LEASE_RETRY_PERIOD_SECONDS must be less than LEASE_RENEW_DEADLINE_SECONDS',
    path: ['LEASE_RETRY_PERIOD_SECONDS'],
  });

export interface OperatorConfig {
  databaseUrl: string;
  redis: RedisConnection;
  /** A Redis command unanswered this long fails the pass (retried with backoff). */
  redisCommandTimeoutMs: number;
  kafkaBrokers: string[];
  kafka: {
    topicPrefix: string;
    partitions: number;
    /** KAFKA_MAX_TOPIC_PARTITIONS (at least `partitions`). */
    maxPartitions: number;
    replicationFactor: number;
    minInsyncReplicas: number;
  };
  /** The namespaces watched; empty = every namespace. */
  watchNamespaces: string[];
  identity: string;
  leaderElection: {
    enabled: boolean;
    namespace: string;
    name: string;
    leaseDurationMs: number;
    renewDeadlineMs: number;
    retryPeriodMs: number;
  };
  httpPort: number;
  workers: number;
  relistMs: number;
  statusRefreshMs: number;
  drainCheckMs: number;
  cleanupRetryMs: number;
  restoreSettleMs: number;
  settleCheckMs: number;
  orderGapThresholdMs: number;
  retryBaseMs: number;
  retryMaxMs: number;
  defaultWarmUpLead: string;
  runtime: {
    image: string;
    /** Other images spec.runtime.image may name (exact references or `sha256:` digests). */
    allowedImages: string[];
    imagePullPolicy: 'Always' | 'IfNotPresent' | 'Never';
    secretName: string;
    serviceAccount: string | undefined;
    httpPort: number;
    metricsPort: number;
    resources: ContainerResources | undefined;
    imagePullSecrets: string[];
    extraEnv: V1EnvVar[];
    extraVolumes: V1Volume[];
    extraVolumeMounts: V1VolumeMount[];
    roles: Record<'api' | 'relay' | 'consumer', RuntimeRoleSettings>;
  };
  logLevel: string;
  /** Applied where an activity's spec leaves trafficShaping / eligibility fields out. */
  trafficPolicy: TrafficPolicy;
  /** Applied where spec.bucketing leaves a field out; unset = core/buckets.ts defaultAutoBucketing. */
  autoBuckets: { stockThreshold?: number | undefined; buckets?: number | undefined };
}

export function loadOperatorConfig(environment: NodeJS.ProcessEnv = process.env): OperatorConfig {
  const c = readConfig(operatorConfigSchema, environment);
  kafkaSecurityFromEnv(environment);
  return {
    databaseUrl: c.DATABASE_URL,
    redis: redisConnectionOf(c),
    redisCommandTimeoutMs: c.REDIS_COMMAND_TIMEOUT_MS,
    kafkaBrokers: c.KAFKA_BROKERS,
    kafka: {
      topicPrefix: c.KAFKA_TOPIC_PREFIX,
      partitions: c.KAFKA_TOPIC_PARTITIONS,
      maxPartitions: Math.max(c.KAFKA_MAX_TOPIC_PARTITIONS, c.KAFKA_TOPIC_PARTITIONS),
      replicationFactor: c.KAFKA_REPLICATION_FACTOR,
      minInsyncReplicas: c.KAFKA_MIN_INSYNC_REPLICAS ?? defaultMinInsyncReplicas(c.KAFKA_REPLICATION_FACTOR),
    },
    watchNamespaces: [...new Set(c.WATCH_NAMESPACE)],
    identity: c.OPERATOR_IDENTITY || c.POD_NAME || hostname(),
    leaderElection: {
      enabled: c.LEADER_ELECTION,
      namespace: c.LEASE_NAMESPACE || c.POD_NAMESPACE,
      name: c.LEASE_NAME,
      leaseDurationMs: c.LEASE_DURATION_SECONDS * 1000,
      renewDeadlineMs: c.LEASE_RENEW_DEADLINE_SECONDS * 1000,
      retryPeriodMs: c.LEASE_RETRY_PERIOD_SECONDS * 1000,
    },
    httpPort: c.HTTP_PORT,
    workers: c.WORKERS,
    relistMs: c.RELIST_SECONDS * 1000,
    statusRefreshMs: c.STATUS_REFRESH_SECONDS * 1000,
    drainCheckMs: c.DRAIN_CHECK_SECONDS * 1000,
    cleanupRetryMs: c.CLEANUP_RETRY_SECONDS * 1000,
    restoreSettleMs: c.RESTORE_SETTLE_SECONDS * 1000,
    settleCheckMs: c.SETTLE_CHECK_SECONDS * 1000,
    orderGapThresholdMs: c.ORDER_GAP_THRESHOLD_SECONDS * 1000,
    retryBaseMs: c.RETRY_BASE_MS,
    retryMaxMs: c.RETRY_MAX_SECONDS * 1000,
    defaultWarmUpLead: c.DEFAULT_WARM_UP_LEAD,
    runtime: {
      image: c.RUNTIME_IMAGE,
      allowedImages: c.RUNTIME_ALLOWED_IMAGES,
      imagePullPolicy: c.RUNTIME_IMAGE_PULL_POLICY,
      secretName: c.RUNTIME_SECRET_NAME,
      serviceAccount: c.RUNTIME_SERVICE_ACCOUNT || undefined,
      httpPort: c.RUNTIME_HTTP_PORT,
      metricsPort: c.RUNTIME_METRICS_PORT,
      resources: c.RUNTIME_RESOURCES,
      imagePullSecrets: [...new Set(c.RUNTIME_IMAGE_PULL_SECRETS)],
      extraEnv: c.RUNTIME_EXTRA_ENV as V1EnvVar[],
      extraVolumes: c.RUNTIME_EXTRA_VOLUMES as V1Volume[],
      extraVolumeMounts: c.RUNTIME_EXTRA_VOLUME_MOUNTS as V1VolumeMount[],
      roles: c.RUNTIME_ROLE_SETTINGS as Record<'api' | 'relay' | 'consumer', RuntimeRoleSettings>,
    },
    logLevel: c.LOG_LEVEL,
    trafficPolicy: {
      shaping: {
        enabled: c.TRAFFIC_SHAPING_ENABLED,
        perBuyer: { requests: c.TRAFFIC_PER_BUYER_REQUESTS, perSeconds: c.TRAFFIC_PER_BUYER_SECONDS },
        perAddress: { requests: c.TRAFFIC_PER_ADDRESS_REQUESTS, perSeconds: c.TRAFFIC_PER_ADDRESS_SECONDS },
      },
      eligibility: {
        preRegistration: D.eligibility.preRegistration,
        orderCodesPerBuyerPerSku: c.ORDER_CODES_PER_BUYER_PER_SKU,
      },
    },
    autoBuckets: { stockThreshold: c.AUTO_BUCKETS_STOCK_THRESHOLD, buckets: c.AUTO_BUCKETS },
  };
}
