// The api's traffic policies in memory (runtime/api/policy-cache.ts): one Redis read per refresh
// interval per activity; a known policy is answered without a promise, a stale one while a single
// read refreshes it. The Redis client is a stand-in that only answers GET (the cache's logic is
// what is tested here; the integration suite runs it against a real Redis).
import { jest } from '@jest/globals';
import { createLogger } from '../../../core/logger.js';
import type { RedisClient } from '../../../core/scripts.js';
import { DEFAULT_TRAFFIC_POLICY } from '../../../core/traffic-policy.js';
import type { TrafficPolicy } from '../../../core/traffic-policy.js';
import { PolicyCache } from '../../../runtime/api/policy-cache.js';

const policy = (requests: number): TrafficPolicy => ({
  ...DEFAULT_TRAFFIC_POLICY,
  shaping: { ...DEFAULT_TRAFFIC_POLICY.shaping, perBuyer: { requests, perSeconds: 10 } },
});

function fakeRedis(): { redis: RedisClient; stored: { value: string | null }; reads: () => number } {
  const stored = { value: JSON.stringify(policy(5)) as string | null };
  let reads = 0;
  const redis = {
    get: async () => {
      reads += 1;
      return stored.value;
    },
  } as unknown as RedisClient;
  return { redis, stored, reads: () => reads };
}

describe('PolicyCache', () => {
  const logger = createLogger('test', 'silent');
  afterEach(() => {
    jest.useRealTimers();
  });

  test('an activity not read yet is unknown; get() reads it once, then it is known', async () => {
    const { redis, reads } = fakeRedis();
    const cache = new PolicyCache(redis, 1000, logger);
    expect(cache.known('a')).toBeUndefined();
    expect((await cache.get('a')).shaping.perBuyer.requests).toBe(5);
    expect(cache.known('a')?.shaping.perBuyer.requests).toBe(5);
    expect((await cache.get('a')).shaping.perBuyer.requests).toBe(5);
    expect(reads()).toBe(1);
  });

  test('a stale policy is still answered while one read refreshes it', async () => {
    jest.useFakeTimers({ now: 1_000_000, doNotFake: ['nextTick', 'setImmediate', 'queueMicrotask'] });
    const { redis, stored, reads } = fakeRedis();
    const cache = new PolicyCache(redis, 1000, logger);
    await cache.get('a');
    stored.value = JSON.stringify(policy(9));
    jest.setSystemTime(1_000_000 + 1500);
    // Stale: the old policy now, one read started; asking again does not start another.
    expect(cache.known('a')?.shaping.perBuyer.requests).toBe(5);
    expect(cache.known('a')?.shaping.perBuyer.requests).toBe(5);
    expect(reads()).toBe(2);
    await new Promise((resolve) => setImmediate(resolve));
    expect(cache.known('a')?.shaping.perBuyer.requests).toBe(9);
    expect(reads()).toBe(2);
  });

  test('no policy in Redis gives the defaults; an unreadable Redis keeps the last known one', async () => {
    const { redis, stored } = fakeRedis();
    stored.value = null;
    const cache = new PolicyCache(redis, 0, logger);
    expect(await cache.get('a')).toEqual(DEFAULT_TRAFFIC_POLICY);
    stored.value = JSON.stringify(policy(7));
    await cache.get('a');
    await new Promise((resolve) => setImmediate(resolve));
    expect(cache.known('a')?.shaping.perBuyer.requests).toBe(7);
    (redis as unknown as { get: () => Promise<string> }).get = async () => {
      throw new Error('connection refused');
    };
    cache.known('a');
    await new Promise((resolve) => setImmediate(resolve));
    expect(cache.known('a')?.shaping.perBuyer.requests).toBe(7);
  });
});
