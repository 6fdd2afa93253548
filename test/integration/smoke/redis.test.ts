// Smoke: an atomic check-and-decrement Lua script through ioredis defineCommand.
import { Redis, type Result } from 'ioredis';
import { testEnv, uniqueId } from '../../../dev/servers.js';

declare module 'ioredis' {
  interface RedisCommander<Context> {
    checkAndDecr(key: string, quantity: number): Result<number, Context>;
  }
}

// Returns the remaining stock, -1 when there is not enough, -2 when the key does not exist.
const CHECK_AND_DECR = `
local stock = redis.call('GET', KEYS[1])
if not stock then return -2 end
stock = tonumber(stock)
local qty = tonumber(ARGV[1])
if stock < qty then return -1 end
return redis.call('DECRBY', KEYS[1], qty)
`;

// jest's per-project testTimeout is ignored by jest 29: each hook and test sets its own.
const TIMEOUT_MS = 120_000;

describe('redis smoke', () => {
  let redis: Redis;

  beforeAll(() => {
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 2 });
    redis.defineCommand('checkAndDecr', { numberOfKeys: 1, lua: CHECK_AND_DECR });
  }, TIMEOUT_MS);
  afterAll(async () => {
    await redis.quit();
  }, TIMEOUT_MS);

  it(
    'never oversells under concurrent calls of the Lua script',
    async () => {
      const key = `smoke:stock:${uniqueId('sku')}`;
      await redis.set(key, 5);
      const results = await Promise.all(Array.from({ length: 12 }, () => redis.checkAndDecr(key, 1)));
      expect(results.filter((r) => r >= 0).sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4]);
      expect(results.filter((r) => r === -1)).toHaveLength(7);
      expect(await redis.get(key)).toBe('0');
      await redis.del(key);
    },
    TIMEOUT_MS,
  );

  it(
    'rejects a quantity larger than the stock without changing it, and reports a missing key',
    async () => {
      const key = `smoke:stock:${uniqueId('sku')}`;
      await redis.set(key, 2);
      await expect(redis.checkAndDecr(key, 3)).resolves.toBe(-1);
      await expect(redis.checkAndDecr(key, 2)).resolves.toBe(0);
      expect(await redis.get(key)).toBe('0');
      await expect(redis.checkAndDecr(`${key}:missing`, 1)).resolves.toBe(-2);
      await redis.del(key);
    },
    TIMEOUT_MS,
  );
});
