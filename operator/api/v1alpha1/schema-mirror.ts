/**
 * A value-level mirror of the spec and status types. The compiler checks it against types.ts
 * (every field, optional or not, with its JSON type); test/unit/operator/api-schema.test.ts checks
 * it against the CRD's OpenAPI schema. Together they keep the TypeScript types and the CRD from
 * drifting apart: a field added to one side only fails one of the two checks.
 *
 * `required: true` means "always present when read from the API server": listed in the schema's
 * `required` or given a `default`.
 */
import type { FlashSaleActivitySpec, FlashSaleActivityStatus } from './types.js';

type Scalar = string | number | boolean;
type ScalarType<V> = V extends string
  ? 'string'
  : V extends number
    ? 'integer' | 'number'
    : V extends boolean
      ? 'boolean'
      : never;

export type MirrorNode<V> = [V] extends [readonly (infer E)[]]
  ? { type: 'array'; items: MirrorNode<E> }
  : [V] extends [Scalar]
    ? { type: ScalarType<V> }
    : { type: 'object'; properties: Mirror<V> };

export type MirrorField<V, R extends boolean> = MirrorNode<NonNullable<V>> & { required: R };

export type Mirror<T> = {
  [K in keyof T]-?: MirrorField<T[K], undefined extends T[K] ? false : true>;
};

const str = <R extends boolean>(required: R) => ({ type: 'string', required }) as const;
const int = <R extends boolean>(required: R) => ({ type: 'integer', required }) as const;
const bool = <R extends boolean>(required: R) => ({ type: 'boolean', required }) as const;
const roleReplicas = {
  type: 'object',
  required: true,
  properties: { api: int(true), relay: int(true), consumer: int(true) },
} as const;
const roleStatus = {
  type: 'object',
  required: false,
  properties: { deployment: str(false), replicas: int(false), readyReplicas: int(false) },
} as const;

const rateLimit = {
  type: 'object',
  required: false,
  properties: { requests: int(true), perSeconds: int(true) },
} as const;

export const specMirror: Mirror<FlashSaleActivitySpec> = {
  activityId: str(false),
  schedule: {
    type: 'object',
    required: true,
    properties: {
      warmUpAt: str(false),
      warmUpLead: str(false),
      startAt: str(true),
      endAt: str(true),
    },
  },
  items: {
    type: 'array',
    required: false,
    items: {
      type: 'object',
      properties: {
        skuId: str(true),
        name: str(true),
        price: str(true),
        stock: int(true),
        limitPerUser: int(true),
        buckets: int(false),
      },
    },
  },
  catalogRef: { type: 'object', required: false, properties: { name: str(true) } },
  bucketing: {
    type: 'object',
    required: false,
    properties: { stockThreshold: int(false), buckets: int(false) },
  },
  requireOrderCode: bool(true),
  reopenOnRelease: bool(true),
  paused: bool(true),
  trafficShaping: {
    type: 'object',
    required: false,
    properties: { enabled: bool(false), perBuyer: rateLimit, perAddress: rateLimit },
  },
  eligibility: {
    type: 'object',
    required: false,
    properties: {
      preRegistration: bool(false),
      orderCodesPerBuyerPerSku: int(false),
      denyListRef: {
        type: 'object',
        required: false,
        properties: { name: str(true), key: str(true) },
      },
    },
  },
  runtime: {
    type: 'object',
    required: true,
    properties: {
      image: str(false),
      replicas: {
        type: 'object',
        required: true,
        properties: { warmUp: roleReplicas, active: roleReplicas, draining: roleReplicas },
      },
    },
  },
  payment: { type: 'object', required: true, properties: { timeout: str(true) } },
  drain: { type: 'object', required: true, properties: { timeout: str(true) } },
  cleanup: {
    type: 'object',
    required: true,
    properties: { policy: str(true), resultRetention: str(true) },
  },
};

export const statusMirror: Mirror<FlashSaleActivityStatus> = {
  phase: str(false),
  observedGeneration: int(false),
  activityId: str(false),
  conditions: {
    type: 'array',
    required: false,
    items: {
      type: 'object',
      properties: {
        type: str(true),
        status: str(true),
        observedGeneration: int(false),
        lastTransitionTime: str(true),
        reason: str(true),
        message: str(true),
      },
    },
  },
  cache: {
    type: 'object',
    required: false,
    properties: {
      loadedGeneration: int(false),
      syncedGeneration: int(false),
      loads: int(false),
      skus: int(false),
      buckets: {
        type: 'array',
        required: false,
        items: { type: 'object', properties: { skuId: str(true), buckets: int(true) } },
      },
      refusal: {
        type: 'object',
        required: false,
        properties: { generation: int(false), reason: str(false), message: str(false) },
      },
    },
  },
  stock: {
    type: 'object',
    required: false,
    properties: {
      initial: int(false),
      reserved: int(false),
      released: int(false),
      remaining: int(false),
      ordered: int(false),
      paid: int(false),
    },
  },
  backlog: {
    type: 'object',
    required: false,
    properties: {
      halfMessages: int(false),
      oldestHalfMessageAgeSeconds: int(false),
      consumerLag: int(false),
      dlqDepth: int(false),
      dlqUnhandled: int(false),
      orderGap: int(false),
      unconfirmed: int(false),
    },
  },
  runtime: {
    type: 'object',
    required: false,
    properties: { api: roleStatus, relay: roleStatus, consumer: roleStatus },
  },
  timestamps: {
    type: 'object',
    required: false,
    properties: {
      pending: str(false),
      warmingUp: str(false),
      ready: str(false),
      active: str(false),
      draining: str(false),
      writingBack: str(false),
      cleaningUp: str(false),
      settling: str(false),
      completed: str(false),
      failed: str(false),
    },
  },
  drain: {
    type: 'object',
    required: false,
    properties: { deadline: str(false), timedOut: bool(false), leftover: str(false) },
  },
  writeBack: {
    type: 'object',
    required: false,
    properties: {
      writtenAt: str(false),
      generation: int(false),
      remaining: int(false),
      orders: int(false),
      trimmed: int(false),
    },
  },
  cleanup: {
    type: 'object',
    required: false,
    properties: { deletedKeys: int(false), resultsRetainedUntil: str(false) },
  },
  settlement: {
    type: 'object',
    required: false,
    properties: {
      unpaid: int(false),
      paid: int(false),
      closed: int(false),
      closedUnsettled: int(false),
      refundPending: int(false),
      refunding: int(false),
      refunded: int(false),
      unsettled: int(false),
      deadLetters: int(false),
      lastPaymentDeadline: str(false),
    },
  },
  nextCheckAt: str(false),
};
