// The Redis memory gauges' reading (core/redis.ts): INFO memory's fields, and which primary counts
// when a sale spans several (the fullest against its maxmemory: it refuses reservations first).
import { fullerRedis, parseRedisMemory } from '../../../core/redis.js';

const info = (used: number, max: number): string =>
  `# Memory\r\nused_memory:${used}\r\nused_memory_human:1.00M\r\nused_memory_rss:9999\r\nmaxmemory:${max}\r\nmaxmemory_human:0B\r\nmaxmemory_policy:noeviction\r\n`;

describe('Redis memory', () => {
  it("reads used_memory and maxmemory, not their neighbours' values", () => {
    expect(parseRedisMemory(info(1_048_576, 0))).toEqual({ usedBytes: 1_048_576, maxBytes: 0 });
    expect(parseRedisMemory(info(900, 1000))).toEqual({ usedBytes: 900, maxBytes: 1000 });
  });

  it('says which field is missing', () => {
    expect(() => parseRedisMemory('# Memory\r\nused_memory:5\r\n')).toThrow(/no maxmemory/);
  });

  it('counts the primary nearest its limit, and without limits the most used', () => {
    const small = { usedBytes: 90, maxBytes: 100 }; // 90 %
    const big = { usedBytes: 500, maxBytes: 1000 }; // 50 %
    expect(fullerRedis(small, big)).toBe(small);
    expect(fullerRedis(big, small)).toBe(small);
    const unlimited = { usedBytes: 5000, maxBytes: 0 };
    expect(fullerRedis(unlimited, big)).toBe(big);
    expect(fullerRedis(unlimited, { usedBytes: 10, maxBytes: 0 })).toBe(unlimited);
  });
});
