import { ConfigError } from '../../../core/config.js';
import { loadOperatorConfig } from '../../../operator/config.js';

const required = {
  DATABASE_URL: 'postgres://u:p@db/flashsale',
  REDIS_URL: 'redis://redis:6379',
  KAFKA_BROKERS: 'k1:9092, k2:9092',
};

describe('operator configuration', () => {
  it('has the documented defaults', () => {
    const c = loadOperatorConfig({ ...required, POD_NAME: 'op-7d9f' });
    expect(c).toMatchObject({
      redisCommandTimeoutMs: 10_000,
      kafkaBrokers: ['k1:9092', 'k2:9092'],
      kafka: {
        topicPrefix: 'flashsale',
        partitions: 3,
        maxPartitions: 64,
        replicationFactor: 1,
        minInsyncReplicas: 1,
      },
      watchNamespaces: [],
      identity: 'op-7d9f',
      leaderElection: {
        enabled: true,
        namespace: 'flashsale-system',
        name: 'flashsale-operator',
        leaseDurationMs: 15_000,
        renewDeadlineMs: 10_000,
        retryPeriodMs: 2_000,
      },
      httpPort: 8081,
      workers: 2,
      relistMs: 300_000,
      statusRefreshMs: 10_000,
      drainCheckMs: 2_000,
      orderGapThresholdMs: 30_000,
      defaultWarmUpLead: '5m',
      runtime: {
        image: 'ghcr.io/flashsale/flashsale:0.1.0',
        imagePullPolicy: 'IfNotPresent',
        allowedImages: [],
        secretName: 'flashsale-runtime',
        serviceAccount: undefined,
        httpPort: 8080,
        metricsPort: 9090,
        resources: undefined,
      },
    });
  });

  it('puts the Lease in LEASE_NAMESPACE, else the pod namespace', () => {
    expect(loadOperatorConfig({ ...required, POD_NAMESPACE: 'ops' }).leaderElection.namespace).toBe('ops');
    expect(
      loadOperatorConfig({ ...required, POD_NAMESPACE: 'ops', LEASE_NAMESPACE: 'le' }).leaderElection
        .namespace,
    ).toBe('le');
  });

  it('derives min.insync.replicas from the replication factor unless KAFKA_MIN_INSYNC_REPLICAS is set', () => {
    expect(loadOperatorConfig({ ...required, KAFKA_REPLICATION_FACTOR: '3' }).kafka).toMatchObject({
      replicationFactor: 3,
      minInsyncReplicas: 2,
    });
    expect(
      loadOperatorConfig({ ...required, KAFKA_REPLICATION_FACTOR: '5', KAFKA_MIN_INSYNC_REPLICAS: '3' })
        .kafka,
    ).toMatchObject({ replicationFactor: 5, minInsyncReplicas: 3 });
  });

  it('leaves automatic bucketing to the Redis it finds unless told (AUTO_BUCKETS_*)', () => {
    expect(loadOperatorConfig(required).autoBuckets).toEqual({
      stockThreshold: undefined,
      buckets: undefined,
    });
    expect(
      loadOperatorConfig({ ...required, AUTO_BUCKETS_STOCK_THRESHOLD: '5000', AUTO_BUCKETS: '6' })
        .autoBuckets,
    ).toEqual({ stockThreshold: 5000, buckets: 6 });
    expect(
      loadOperatorConfig({ ...required, AUTO_BUCKETS_STOCK_THRESHOLD: '0', AUTO_BUCKETS: '64' }).autoBuckets,
    ).toEqual({ stockThreshold: 0, buckets: 64 });
  });

  it('bounds each Redis command by REDIS_COMMAND_TIMEOUT_MS', () => {
    expect(loadOperatorConfig({ ...required, REDIS_COMMAND_TIMEOUT_MS: '30000' }).redisCommandTimeoutMs).toBe(
      30_000,
    );
  });

  it.each([
    [{ DATABASE_URL: undefined }, /DATABASE_URL/],
    // Below the operator's one-second WAITs plus a margin: a wait it asks for would time out.
    [{ REDIS_COMMAND_TIMEOUT_MS: '1999' }, /REDIS_COMMAND_TIMEOUT_MS/],
    [{ REDIS_COMMAND_TIMEOUT_MS: 'soon' }, /REDIS_COMMAND_TIMEOUT_MS/],
    [
      { KAFKA_REPLICATION_FACTOR: '3', KAFKA_MIN_INSYNC_REPLICAS: '4' },
      /KAFKA_MIN_INSYNC_REPLICAS must be at most KAFKA_REPLICATION_FACTOR/,
    ],
    [{ KAFKA_MIN_INSYNC_REPLICAS: '0' }, /KAFKA_MIN_INSYNC_REPLICAS/],
    [{ KAFKA_BROKERS: ' , ' }, /KAFKA_BROKERS: at least one broker/],
    [
      { LEASE_RENEW_DEADLINE_SECONDS: '20' },
      /LEASE_RENEW_DEADLINE_SECONDS must be less than LEASE_DURATION_SECONDS/,
    ],
    [{ LEASE_RETRY_PERIOD_SECONDS: '12' }, /LEASE_RETRY_PERIOD_SECONDS/],
    [{ WORKERS: '0' }, /WORKERS/],
    [{ LEADER_ELECTION: 'maybe' }, /LEADER_ELECTION/],
    [{ DEFAULT_WARM_UP_LEAD: '5 minutes' }, /DEFAULT_WARM_UP_LEAD: a duration/],
    [{ RUNTIME_RESOURCES: '{"cpu":1}' }, /RUNTIME_RESOURCES: not a resources object/],
    [{ RUNTIME_IMAGE_PULL_POLICY: 'Sometimes' }, /RUNTIME_IMAGE_PULL_POLICY/],
    [{ AUTO_BUCKETS_STOCK_THRESHOLD: '1' }, /AUTO_BUCKETS_STOCK_THRESHOLD: 0 \(never split\) or at least 2/],
    [{ AUTO_BUCKETS_STOCK_THRESHOLD: '-5' }, /AUTO_BUCKETS_STOCK_THRESHOLD/],
    [{ AUTO_BUCKETS: '1' }, /AUTO_BUCKETS/],
    [{ AUTO_BUCKETS: '65' }, /AUTO_BUCKETS/],
    // The traffic policy's bounds (the CRD's): out of them, every activity's warm-up would fail.
    [{ ORDER_CODES_PER_BUYER_PER_SKU: '5000' }, /ORDER_CODES_PER_BUYER_PER_SKU/],
    [{ TRAFFIC_PER_BUYER_SECONDS: '100000' }, /TRAFFIC_PER_BUYER_SECONDS/],
    [{ TRAFFIC_PER_ADDRESS_SECONDS: '86401' }, /TRAFFIC_PER_ADDRESS_SECONDS/],
    [{ TRAFFIC_PER_BUYER_REQUESTS: '1000001' }, /TRAFFIC_PER_BUYER_REQUESTS/],
    [{ TRAFFIC_PER_ADDRESS_REQUESTS: '2000000' }, /TRAFFIC_PER_ADDRESS_REQUESTS/],
    [
      { AUTO_BUCKETS_STOCK_THRESHOLD: '4', AUTO_BUCKETS: '8' },
      /AUTO_BUCKETS cannot exceed AUTO_BUCKETS_STOCK_THRESHOLD/,
    ],
  ])('refuses %o naming the variable', (over, message) => {
    expect(() => loadOperatorConfig({ ...required, ...over })).toThrow(ConfigError);
    expect(() => loadOperatorConfig({ ...required, ...over })).toThrow(message);
  });
});
