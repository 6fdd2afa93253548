import { loadRuntimeConfig } from '../../../runtime/config.js';
import { loadOperatorConfig } from '../../../operator/config.js';
import {
  createNodeRedis,
  describeRedis,
  parseSentinels,
  redisConnectionOf,
  usesCluster,
  usesSentinel,
} from '../../../core/redis.js';

const base = {
  DATABASE_URL: 'postgres://u:p@127.0.0.1:5432/db',
  KAFKA_BROKERS: '127.0.0.1:9092',
  ACTIVITY_ID: 'a1',
};

describe('Redis topology from the environment (core/redis.ts)', () => {
  it('parses a Sentinel list and refuses malformed entries', () => {
    expect(parseSentinels(['10.0.0.1:26379', ' sentinel-2.redis:26380 '])).toEqual([
      { host: '10.0.0.1', port: 26379 },
      { host: 'sentinel-2.redis', port: 26380 },
    ]);
    expect(() => parseSentinels(['10.0.0.1'])).toThrow('is not host:port');
    expect(() => parseSentinels(['h:70000'])).toThrow('is not host:port');
  });

  it('the runtime accepts a URL or sentinels with a master name, and nothing else', () => {
    const single = loadRuntimeConfig('relay', { ...base, REDIS_URL: 'redis://127.0.0.1:6379' });
    expect(usesSentinel(redisConnectionOf(single))).toBe(false);
    const ha = loadRuntimeConfig('relay', {
      ...base,
      REDIS_SENTINELS: 's1:26379,s2:26379,s3:26379',
      REDIS_SENTINEL_MASTER: 'flashsale',
      REDIS_URL: 'redis://:secret@ignored:6379/2',
    });
    const conn = redisConnectionOf(ha);
    expect(usesSentinel(conn)).toBe(true);
    expect(describeRedis(conn)).toBe('sentinel flashsale@s1:26379,s2:26379,s3:26379');
    expect(describeRedis(conn)).not.toContain('secret');
    expect(() => loadRuntimeConfig('relay', { ...base })).toThrow(
      /REDIS_URL: required \(or REDIS_SENTINELS or REDIS_CLUSTER_NODES\)/,
    );
    expect(() => loadRuntimeConfig('relay', { ...base, REDIS_SENTINELS: 's1:26379' })).toThrow(
      /REDIS_SENTINEL_MASTER: required with REDIS_SENTINELS/,
    );
    expect(() =>
      loadRuntimeConfig('relay', { ...base, REDIS_SENTINELS: 's1', REDIS_SENTINEL_MASTER: 'm' }),
    ).toThrow(/REDIS_SENTINELS: "s1" is not host:port/);
  });

  it('a Redis Cluster from REDIS_CLUSTER_NODES (credentials from REDIS_URL), never with sentinels', () => {
    const c = loadRuntimeConfig('relay', {
      ...base,
      REDIS_CLUSTER_NODES: 'n1:7000, n2:7001,n3:7002',
      REDIS_URL: 'redis://:secret@ignored:6379',
    });
    const conn = redisConnectionOf(c);
    expect(usesCluster(conn)).toBe(true);
    expect(usesSentinel(conn)).toBe(false);
    expect(describeRedis(conn)).toBe('cluster n1:7000,n2:7001,n3:7002');
    expect(() =>
      loadRuntimeConfig('relay', {
        ...base,
        REDIS_CLUSTER_NODES: 'n1:7000',
        REDIS_SENTINELS: 's1:26379',
        REDIS_SENTINEL_MASTER: 'm',
      }),
    ).toThrow(/REDIS_SENTINELS and REDIS_CLUSTER_NODES exclude each other/);
    expect(() => loadRuntimeConfig('relay', { ...base, REDIS_CLUSTER_NODES: 'n1' })).toThrow(
      /REDIS_CLUSTER_NODES: "n1" is not host:port/,
    );
  });

  it('the operator reads the same variables', () => {
    const c = loadOperatorConfig({
      DATABASE_URL: base.DATABASE_URL,
      KAFKA_BROKERS: base.KAFKA_BROKERS,
      REDIS_SENTINELS: 's1:26379',
      REDIS_SENTINEL_MASTER: 'flashsale',
    });
    expect(c.redis.sentinels).toEqual([{ host: 's1', port: 26379 }]);
    expect(() => loadOperatorConfig({ DATABASE_URL: base.DATABASE_URL, KAFKA_BROKERS: 'k:9092' })).toThrow(
      /REDIS_URL/,
    );
  });

  it('reservation acknowledgement and consumer group timing are validated', () => {
    const c = loadRuntimeConfig('relay', { ...base, REDIS_URL: 'redis://127.0.0.1:6379' });
    expect(c.RESERVE_ACK).toBeUndefined();
    expect(c.CONSUMER_SESSION_TIMEOUT_MS).toBeGreaterThanOrEqual(3 * c.CONSUMER_HEARTBEAT_INTERVAL_MS);
    expect(() =>
      loadRuntimeConfig('relay', { ...base, REDIS_URL: 'redis://h:1', RESERVE_ACK: 'sometimes' }),
    ).toThrow(/RESERVE_ACK/);
    expect(() =>
      loadRuntimeConfig('relay', {
        ...base,
        REDIS_URL: 'redis://h:1',
        CONSUMER_SESSION_TIMEOUT_MS: '6000',
        CONSUMER_HEARTBEAT_INTERVAL_MS: '3000',
      }),
    ).toThrow(/CONSUMER_HEARTBEAT_INTERVAL_MS must be at most a third/);
  });

  it('a rediss:// URL with Sentinels reaches the data nodes over TLS (ioredis needs enableTLSForSentinelMode)', () => {
    const sentinels = [{ host: 's1', port: 26379 }];
    const options = (url: string) => {
      const client = createNodeRedis({ url, sentinels, sentinelMaster: 'sales' }, { lazyConnect: true });
      const o = client.options as { tls?: unknown; enableTLSForSentinelMode?: boolean };
      client.disconnect();
      return { tls: o.tls !== undefined, sentinelTls: o.enableTLSForSentinelMode === true };
    };
    expect(options('rediss://:pw@x/0')).toEqual({ tls: true, sentinelTls: true });
    expect(options('redis://:pw@x/0')).toEqual({ tls: false, sentinelTls: false });
  });
});
