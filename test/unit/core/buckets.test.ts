// Stock buckets as pure key and arithmetic logic: buckets spread over the slot space, a buyer's
// home bucket is stable, shares add up to the stock.
import calculateSlot from 'cluster-key-slot';
import {
  AUTO_BUCKET_STOCK_THRESHOLD,
  BucketLayout,
  MAX_BUCKETS,
  bucketShare,
  chooseBuckets,
  defaultAutoBucketing,
  unitsLeft,
} from '../../../core/buckets.js';
import type { RedisClient } from '../../../core/scripts.js';
import { activityKeys, homeBucket } from '../../../core/keys.js';
import type { BucketKeys } from '../../../core/keys.js';

describe('stock buckets (core/keys.ts, core/buckets.ts)', () => {
  it('puts every key of a bucket in one slot, and bucket i of n in the i-th n-th of the slot space', () => {
    const k = activityKeys('sale-1');
    for (const n of [2, 3, 8, 12]) {
      for (let i = 0; i < n; i += 1) {
        const b = k.bucket('hot', i, n);
        const slots = new Set(
          [
            b.meta,
            b.sku('hot'),
            b.buyer('u1'),
            b.reservation('r1'),
            b.outbox,
            b.ledger,
            b.counters,
            b.transfers,
          ].map((key) => calculateSlot(key)),
        );
        expect(slots.size).toBe(1);
        const [slot] = [...slots] as [number];
        expect(slot).toBeGreaterThanOrEqual(Math.floor((i * 16384) / n));
        expect(slot).toBeLessThan(Math.ceil(((i + 1) * 16384) / n));
        // Matched by the activity's bucket pattern, never by its own slot's pattern.
        expect(b.outbox.startsWith(k.bucketScanPattern.slice(0, -1))).toBe(true);
        expect(b.outbox.startsWith(k.prefix)).toBe(false);
      }
    }
    // Another activity whose id starts alike is not matched.
    expect(
      activityKeys('sale-10').bucket('hot', 0, 2).outbox.startsWith(k.bucketScanPattern.slice(0, -1)),
    ).toBe(false);
  });

  it('homes a buyer in one bucket per SKU, spread evenly over the buckets', () => {
    const counts = new Array<number>(8).fill(0);
    for (let u = 0; u < 8000; u += 1) {
      const h = homeBucket('sale-1', 'hot', `u${u}`, 8);
      expect(homeBucket('sale-1', 'hot', `u${u}`, 8)).toBe(h);
      counts[h]! += 1;
    }
    for (const c of counts) expect(Math.abs(c - 1000)).toBeLessThan(150);
    expect(homeBucket('sale-1', 'hot', 'u1', 1)).toBe(0);
  });

  it('splits the stock into shares that add up to it and only grow with it', () => {
    for (const [stock, n] of [
      [8, 8],
      [97, 8],
      [100, 3],
      [1_000_003, 64],
    ] as const) {
      const shares = Array.from({ length: n }, (_, i) => bucketShare(stock, i, n));
      expect(shares.reduce((a, b) => a + b, 0)).toBe(stock);
      expect(Math.min(...shares)).toBeGreaterThanOrEqual(1);
      expect(Math.max(...shares) - Math.min(...shares)).toBeLessThanOrEqual(1);
      for (let i = 0; i < n; i += 1) expect(bucketShare(stock + 5, i, n)).toBeGreaterThanOrEqual(shares[i]!);
    }
  });

  it('chooses automatic buckets only above the threshold, never more than the units or 64', () => {
    const auto = { stockThreshold: 1000, buckets: 6 };
    expect(chooseBuckets(999, undefined, auto)).toBe(1);
    expect(chooseBuckets(1000, undefined, auto)).toBe(6);
    expect(chooseBuckets(50_000, undefined, auto)).toBe(6);
    // The spec's own count wins, 1 (not split) included.
    expect(chooseBuckets(50_000, 1, auto)).toBe(1);
    expect(chooseBuckets(50_000, 3, auto)).toBe(3);
    expect(chooseBuckets(10, 3, { stockThreshold: 0, buckets: 6 })).toBe(3);
    // Off.
    expect(chooseBuckets(10_000_000, undefined, { stockThreshold: 0, buckets: 6 })).toBe(1);
    // A threshold below the bucket count (operator settings and spec mixed): one unit per bucket.
    expect(chooseBuckets(5, undefined, { stockThreshold: 2, buckets: 8 })).toBe(5);
    expect(chooseBuckets(10_000, undefined, { stockThreshold: 2, buckets: 500 })).toBe(MAX_BUCKETS);
  });

  it('by default splits only on a Redis Cluster of several primaries, two buckets per primary', () => {
    expect(defaultAutoBucketing(1).stockThreshold).toBe(0);
    expect(defaultAutoBucketing(3)).toEqual({ stockThreshold: AUTO_BUCKET_STOCK_THRESHOLD, buckets: 6 });
    expect(defaultAutoBucketing(40)).toEqual({
      stockThreshold: AUTO_BUCKET_STOCK_THRESHOLD,
      buckets: MAX_BUCKETS,
    });
    expect(chooseBuckets(AUTO_BUCKET_STOCK_THRESHOLD - 1, undefined, defaultAutoBucketing(3))).toBe(1);
    expect(chooseBuckets(AUTO_BUCKET_STOCK_THRESHOLD, undefined, defaultAutoBucketing(3))).toBe(6);
    expect(chooseBuckets(10_000_000, undefined, defaultAutoBucketing(1))).toBe(1);
  });

  it('reads units left as an upper bound while a release and a reservation race the read', async () => {
    const layout = new BucketLayout('sale-race', new Map([['hot', 2]]), 1);
    const [a, b] = layout.bucketsOf('hot') as [BucketKeys, BucketKeys];
    // Bucket a sold its unit, bucket b has one: one unit left.
    const counters = new Map<string, Record<string, string>>([
      [a.counters, { initial: '1', reserved: '1', released: '0' }],
      [b.counters, { initial: '1', reserved: '0', released: '0' }],
    ]);
    let reads = 0;
    // Right after the reader's first read: a's unit is released, then b's unit reserved. One unit
    // was left at every instant, so no read may find the SKU sold out.
    const read = <T>(value: T): T => {
      reads += 1;
      if (reads === 1) {
        counters.get(a.counters)!.released = '1';
        counters.get(b.counters)!.reserved = '1';
      }
      return value;
    };
    const redis = {
      hget: async (key: string, field: string) => read(counters.get(key)?.[field] ?? null),
      hmget: async (key: string, ...fields: string[]) =>
        read(fields.map((f) => counters.get(key)?.[f] ?? null)),
    } as unknown as RedisClient;
    expect(await unitsLeft(redis, layout, 'hot')).toBe(1);
  });
});
