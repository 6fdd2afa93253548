/**
 * FlashSaleActivity (flashsale.io/v1alpha1): schema only, no behaviour (see funcs.ts for that).
 * Mirrors crds/flashsale.io_flashsaleactivities.yaml; test/unit/operator/api-schema.test.ts fails
 * when the two drift apart. Fields the CRD defaults are required here: the API server applies
 * the defaults on every read, so the operator always sees them.
 */

export const GROUP = 'flashsale.io';
export const VERSION = 'v1alpha1';
export const API_VERSION = `${GROUP}/${VERSION}`;
export const KIND = 'FlashSaleActivity';
export const PLURAL = 'flashsaleactivities';
/** Held while the activity may still have state in Redis, Kafka consumers or unwritten stock. */
export const FINALIZER = 'flashsale.io/cleanup';
export const FIELD_MANAGER = 'flashsale-operator';

/** The lifecycle, in order; `Failed` can follow any phase. Derived from the conditions. */
export const Phase = {
  Pending: 'Pending',
  WarmingUp: 'WarmingUp',
  Ready: 'Ready',
  Active: 'Active',
  Draining: 'Draining',
  WritingBack: 'WritingBack',
  CleaningUp: 'CleaningUp',
  /** Orders outlive the sale: waiting until every order and payment is settled. */
  Settling: 'Settling',
  Completed: 'Completed',
  Failed: 'Failed',
} as const;
export type Phase = (typeof Phase)[keyof typeof Phase];

export const PHASE_ORDER: readonly Phase[] = [
  Phase.Pending,
  Phase.WarmingUp,
  Phase.Ready,
  Phase.Active,
  Phase.Draining,
  Phase.WritingBack,
  Phase.CleaningUp,
  Phase.Settling,
  Phase.Completed,
];

export const ConditionType = {
  /** The sale can serve buyers (cache loaded, runtime applied); False once it has ended. */
  Ready: 'Ready',
  /** The operator is moving the activity through a lifecycle step. */
  Progressing: 'Progressing',
  /** Something needs attention (a refused edit, a drain timeout, a blocked cleanup, an error). */
  Degraded: 'Degraded',
  /** Terminal outcome: True = Completed, False = Failed, Unknown while running. */
  Succeeded: 'Succeeded',
  /** The gate is closed by spec.paused without ending the sale. */
  Paused: 'Paused',
  /**
   * The phase's runtime Deployments are rolled out and available (the Deployment controller's
   * figures); warm-up ends in Ready only when it is True (docs/operator.md "Runtime readiness").
   */
  RuntimeReady: 'RuntimeReady',
  /**
   * The Redis cache holds what PostgreSQL proves was sold (True), or a restore from PostgreSQL is
   * under way (False, the reason names its step): operator/reconcile/restore-cache.ts.
   */
  CacheConsistent: 'CacheConsistent',
  /**
   * Whether this generation's spec was accepted (True) or an edit of it refused (False,
   * `SpecChangeRefused`): its own condition, since Degraded holds one reason and another one
   * (PartitionsCapped, RuntimeNotReady…) would hide the refusal there.
   */
  SpecAccepted: 'SpecAccepted',
} as const;
export type ConditionType = (typeof ConditionType)[keyof typeof ConditionType];

export type ConditionStatus = 'True' | 'False' | 'Unknown';

/** Condition reasons (CamelCase, stable: alerts and tests match on them). */
export const Reason = {
  // Progressing / Ready
  WaitingForWarmUp: 'WaitingForWarmUp',
  WarmingUp: 'WarmingUp',
  CacheLoaded: 'CacheLoaded',
  WaitingForStart: 'WaitingForStart',
  SaleOpen: 'SaleOpen',
  SaleRunning: 'SaleRunning',
  SaleEnded: 'SaleEnded',
  Draining: 'Draining',
  WritingBack: 'WritingBack',
  CleaningUp: 'CleaningUp',
  Settling: 'Settling',
  Completed: 'Completed',
  InProgress: 'InProgress',
  // Degraded
  AsExpected: 'AsExpected',
  SpecAccepted: 'SpecAccepted',
  DrainTimedOut: 'DrainTimedOut',
  SpecChangeRefused: 'SpecChangeRefused',
  CleanupBlocked: 'CleanupBlocked',
  DenyListUnavailable: 'DenyListUnavailable',
  ReconcileError: 'ReconcileError',
  /** spec.runtime.image is not one the operator allows (RUNTIME_IMAGE, RUNTIME_ALLOWED_IMAGES). */
  ImageNotAllowed: 'ImageNotAllowed',
  // Paused
  PausedBySpec: 'PausedBySpec',
  NotPaused: 'NotPaused',
  /** spec.paused is set, and the operator has not closed the gate yet (it could not reach it). */
  PausePending: 'PausePending',
  /** More consumer replicas than KAFKA_MAX_TOPIC_PARTITIONS: the topic got that many partitions. */
  PartitionsCapped: 'PartitionsCapped',
  /** spec.paused was cleared, and the gate is still closed (the operator could not reach it). */
  ResumePending: 'ResumePending',
  // RuntimeReady
  RuntimeAvailable: 'RuntimeAvailable',
  RuntimeUnavailable: 'RuntimeUnavailable',
  NoRuntime: 'NoRuntime',
  // Degraded: the runtime is not available when buyers need it
  RuntimeNotReady: 'RuntimeNotReady',
  // CacheConsistent
  CacheMatches: 'CacheMatches',
  /** A restore's steps (False while under way), then Restored (True). */
  RestorePausing: 'RestorePausing',
  RestoreDraining: 'RestoreDraining',
  RestoreReloading: 'RestoreReloading',
  RestoreResuming: 'RestoreResuming',
  Restored: 'Restored',
  // Failed (Succeeded=False)
  CacheLost: 'CacheLost',
  ScheduleMissed: 'ScheduleMissed',
  ActivityIdInUse: 'ActivityIdInUse',
  CatalogEmpty: 'CatalogEmpty',
  /** Rows of the catalogRef the CRD would refuse inline (an unsafe sku id, an empty name). */
  CatalogInvalid: 'CatalogInvalid',
  /** The activity's Kafka topics exist with less replication than the operator's settings. */
  TopicsUnderReplicated: 'TopicsUnderReplicated',
  /** Fewer Kafka brokers are available than the replication factor the topics are created with. */
  TooFewKafkaBrokers: 'TooFewKafkaBrokers',
  /** The orders topic has fewer partitions than consumer replicas and Kafka refused to add them. */
  PartitionsNotAdded: 'PartitionsNotAdded',
} as const;
export type Reason = (typeof Reason)[keyof typeof Reason];

/** Event reasons (CamelCase); one per lifecycle milestone, not one per operation. */
export const EventReason = {
  WarmUpStarted: 'WarmUpStarted',
  TopicsCreated: 'TopicsCreated',
  /** The activity's topics exist with less replication than configured: warm-up held (Warning). */
  TopicsUnderReplicated: 'TopicsUnderReplicated',
  /** Too few Kafka brokers available to create the activity's topics as configured (Warning). */
  TooFewKafkaBrokers: 'TooFewKafkaBrokers',
  /** Partitions added to the orders topic for the consumer replicas the spec asks for. */
  PartitionsAdded: 'PartitionsAdded',
  /** Kafka refused (or did not answer) adding them; consumers beyond the partitions idle (Warning). */
  PartitionsNotAdded: 'PartitionsNotAdded',
  CacheLoaded: 'CacheLoaded',
  /** startAt came while the runtime was not available: the gate stays shut until it is. */
  StartDelayed: 'StartDelayed',
  SaleOpened: 'SaleOpened',
  SalePaused: 'SalePaused',
  SaleResumed: 'SaleResumed',
  SpecChangeApplied: 'SpecChangeApplied',
  SpecChangeRefused: 'SpecChangeRefused',
  DrainStarted: 'DrainStarted',
  Drained: 'Drained',
  DrainTimedOut: 'DrainTimedOut',
  WroteBack: 'WroteBack',
  /** The write-back left out units Redis counted beyond PostgreSQL's stock (Warning). */
  StockTrimmed: 'StockTrimmed',
  CleanupBlocked: 'CleanupBlocked',
  CleanedUp: 'CleanedUp',
  Settled: 'Settled',
  ReleasedUnsettled: 'ReleasedUnsettled',
  Completed: 'Completed',
  Failed: 'Failed',
  FinalizerRemoved: 'FinalizerRemoved',
  /** Redis came back empty or behind mid-sale: a restore from PostgreSQL began (Warning). */
  CacheDivergenceDetected: 'CacheDivergenceDetected',
  CacheRestorePaused: 'CacheRestorePaused',
  CacheRestoreDrained: 'CacheRestoreDrained',
  CacheRestoreReloaded: 'CacheRestoreReloaded',
  CacheRestoreResumed: 'CacheRestoreResumed',
} as const;
export type EventReason = (typeof EventReason)[keyof typeof EventReason];

export const RUNTIME_ROLES = ['api', 'relay', 'consumer'] as const;
export type RuntimeRole = (typeof RUNTIME_ROLES)[number];

export interface RoleReplicas {
  api: number;
  relay: number;
  consumer: number;
}

export interface Schedule {
  warmUpAt?: string;
  /** Duration (`10m`, `90s`); warm-up begins this long before startAt. */
  warmUpLead?: string;
  startAt: string;
  endAt: string;
}

export interface ItemSpec {
  skuId: string;
  name: string;
  /** Decimal string, at most 2 decimals. */
  price: string;
  stock: number;
  limitPerUser: number;
  /** Stock buckets of a hot SKU (2..64, at most `stock`; fixed once warm-up began). */
  buckets?: number;
}

/**
 * Automatic stock buckets for the SKUs that give no `buckets` of their own (catalog items
 * included); absent fields take the operator's AUTO_BUCKETS_STOCK_THRESHOLD and AUTO_BUCKETS.
 */
export interface BucketingSpec {
  /** SKUs with at least this much stock are split; 0 = never. */
  stockThreshold?: number;
  /** Buckets of such a SKU (2..64, at most its stock). */
  buckets?: number;
}

export interface CatalogRef {
  name: string;
}

export interface RuntimeSpec {
  image?: string;
  replicas: {
    warmUp: RoleReplicas;
    active: RoleReplicas;
    draining: RoleReplicas;
  };
}

export type CleanupPolicy = 'Delete' | 'Retain';

export interface RateLimitSpec {
  requests: number;
  perSeconds: number;
}

/** Fields left out take the operator's defaults (docs/operator.md "Traffic shaping and eligibility"). */
export interface TrafficShapingSpec {
  enabled?: boolean;
  perBuyer?: RateLimitSpec;
  perAddress?: RateLimitSpec;
}

export interface EligibilitySpec {
  preRegistration?: boolean;
  orderCodesPerBuyerPerSku?: number;
  /** A ConfigMap (same namespace) listing denied buyer ids under `key`. */
  denyListRef?: { name: string; key: string };
}

export interface FlashSaleActivitySpec {
  activityId?: string;
  schedule: Schedule;
  items?: ItemSpec[];
  catalogRef?: CatalogRef;
  bucketing?: BucketingSpec;
  requireOrderCode: boolean;
  reopenOnRelease: boolean;
  paused: boolean;
  trafficShaping?: TrafficShapingSpec;
  eligibility?: EligibilitySpec;
  runtime: RuntimeSpec;
  payment: { timeout: string };
  drain: { timeout: string };
  cleanup: { policy: CleanupPolicy; resultRetention: string };
}

/** metav1.Condition. */
export interface Condition {
  type: string;
  status: ConditionStatus;
  observedGeneration?: number;
  lastTransitionTime: string;
  reason: string;
  message: string;
}

export interface RoleStatus {
  deployment?: string;
  replicas?: number;
  readyReplicas?: number;
}

export interface CacheStatus {
  loadedGeneration?: number;
  syncedGeneration?: number;
  loads?: number;
  skus?: number;
  /** The bucket count of each bucketed SKU as loaded (fixed from its first load on). */
  buckets?: { skuId: string; buckets: number }[];
  refusal?: { generation?: number; reason?: string; message?: string };
}

export interface StockStatus {
  initial?: number;
  reserved?: number;
  released?: number;
  remaining?: number;
  ordered?: number;
  paid?: number;
}

export interface BacklogStatus {
  halfMessages?: number;
  oldestHalfMessageAgeSeconds?: number;
  consumerLag?: number;
  dlqDepth?: number;
  /** Dead letters neither replayed nor acknowledged (core/kafka.ts dlqUnhandled). */
  dlqUnhandled?: number;
  orderGap?: number;
  unconfirmed?: number;
}

export interface PhaseTimestamps {
  pending?: string;
  warmingUp?: string;
  ready?: string;
  active?: string;
  draining?: string;
  writingBack?: string;
  cleaningUp?: string;
  settling?: string;
  completed?: string;
  failed?: string;
}

export interface FlashSaleActivityStatus {
  phase?: Phase;
  observedGeneration?: number;
  activityId?: string;
  conditions?: Condition[];
  cache?: CacheStatus;
  stock?: StockStatus;
  backlog?: BacklogStatus;
  runtime?: { api?: RoleStatus; relay?: RoleStatus; consumer?: RoleStatus };
  timestamps?: PhaseTimestamps;
  drain?: { deadline?: string; timedOut?: boolean; leftover?: string };
  writeBack?: {
    writtenAt?: string;
    generation?: number;
    remaining?: number;
    orders?: number;
    /** Units Redis counted beyond PostgreSQL's stock (it forgot reservations), not written back. */
    trimmed?: number;
  };
  cleanup?: { deletedKeys?: number; resultsRetainedUntil?: string };
  settlement?: SettlementStatus;
  nextCheckAt?: string;
}

export interface SettlementStatus {
  unpaid?: number;
  paid?: number;
  closed?: number;
  closedUnsettled?: number;
  refundPending?: number;
  refunding?: number;
  refunded?: number;
  unsettled?: number;
  /** Dead letters neither replayed nor acknowledged; left out while Kafka does not answer. */
  deadLetters?: number;
  lastPaymentDeadline?: string;
}

export interface ObjectMeta {
  name: string;
  namespace: string;
  uid: string;
  generation: number;
  resourceVersion: string;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  finalizers?: string[];
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

export interface FlashSaleActivity {
  apiVersion: typeof API_VERSION;
  kind: typeof KIND;
  metadata: ObjectMeta;
  spec: FlashSaleActivitySpec;
  status?: FlashSaleActivityStatus;
}
