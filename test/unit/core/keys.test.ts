import { activityKeys, activityOfRestockChannel, isSafeId } from '../../../core/keys.js';

describe('activity keys', () => {
  const k = activityKeys('summer-2026');

  test('every key of an activity shares one Redis Cluster hash tag', () => {
    const keys = [
      k.meta,
      k.counters,
      k.outbox,
      k.ledger,
      k.results,
      k.skuIndex,
      k.sku('s1'),
      k.buyer('u:1'),
      k.reservation('r1'),
      k.orderCode('c'),
      k.none,
      k.bucketPlan,
    ];
    for (const key of keys) {
      expect(key.startsWith(k.prefix)).toBe(true);
      // Redis hashes only the text between the first { and the next }.
      expect(/\{([^}]*)\}/.exec(key)?.[1]).toBe('summer-2026');
    }
    expect(new Set(keys).size).toBe(keys.length);
  });

  test('cleanup pattern covers this activity only', () => {
    expect(k.scanPattern).toBe('fs:{summer-2026}:*');
    expect(activityKeys('summer-20').scanPattern).not.toBe(k.scanPattern);
    // "summer-20" must not be a prefix match of "summer-2026": the closing brace ends the tag.
    expect(k.meta.startsWith(activityKeys('summer-20').prefix)).toBe(false);
  });

  test('unsafe ids are refused before they reach a key', () => {
    for (const bad of ['', 'a b', 'a*', 'x?', '[x]', 'a{b}', '-lead', 'a'.repeat(64)]) {
      expect(isSafeId(bad)).toBe(false);
      expect(() => activityKeys(bad)).toThrow(/not a safe identifier/);
    }
    expect(() => k.sku('bad sku')).toThrow(/sku id/);
  });

  test('restock channels name their activity', () => {
    expect(activityOfRestockChannel(k.restockChannel)).toBe('summer-2026');
    expect(activityOfRestockChannel('other')).toBeUndefined();
  });
});
