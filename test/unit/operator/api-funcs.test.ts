import {
  activityIdOf,
  parseDuration,
  replicasFor,
  scheduleOf,
  splitKey,
} from '../../../operator/api/v1alpha1/funcs.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity, FlashSaleActivitySpec } from '../../../operator/api/v1alpha1/types.js';
import { isSafeId } from '../../../core/keys.js';

const spec = (over: Partial<FlashSaleActivitySpec> = {}): FlashSaleActivitySpec => ({
  schedule: { startAt: '2030-01-01T10:00:00Z', endAt: '2030-01-01T11:00:00Z' },
  items: [{ skuId: 'a', name: 'A', price: '1.00', stock: 1, limitPerUser: 1 }],
  requireOrderCode: false,
  reopenOnRelease: true,
  paused: false,
  runtime: {
    replicas: {
      warmUp: { api: 1, relay: 2, consumer: 3 },
      active: { api: 4, relay: 5, consumer: 6 },
      draining: { api: 0, relay: 7, consumer: 8 },
    },
  },
  payment: { timeout: '15m' },
  drain: { timeout: '5m' },
  cleanup: { policy: 'Delete', resultRetention: '24h' },
  ...over,
});

describe('API funcs', () => {
  it.each([
    ['15m', 900_000],
    ['1h30m', 5_400_000],
    ['90s', 90_000],
    ['500ms', 500],
    ['1h1m1s1ms', 3_661_001],
  ])('parses the duration %s', (text, ms) => {
    expect(parseDuration(text)).toBe(ms);
  });

  it.each(['', '15', '1d', '-5m', '1.5h', 'm', '10 m'])('refuses the duration "%s"', (text) => {
    expect(() => parseDuration(text)).toThrow(/invalid duration/);
  });

  const meta = (namespace: string, name: string) => ({
    name,
    namespace,
    uid: '3F2A9C1B-0000-4000-8000-000000000000',
    generation: 1,
    resourceVersion: '1',
  });

  it('derives a unique, safe activity id from namespace, name and uid', () => {
    const id = activityIdOf({ metadata: meta('shop', 'double11'), spec: spec() });
    expect(id).toBe('shop.double11-3f2a9c1b');
    expect(isSafeId(id)).toBe(true);
  });

  it('keeps the id within 63 safe characters for the longest names', () => {
    const id = activityIdOf({ metadata: meta('n'.repeat(63), 'x'.repeat(50)), spec: spec() });
    expect(id.length).toBeLessThanOrEqual(63);
    expect(isSafeId(id)).toBe(true);
    expect(id).toMatch(/^[a-z0-9].*-3f2a9c1b$/);
  });

  it('prefers spec.activityId', () => {
    const fsa: Pick<FlashSaleActivity, 'metadata' | 'spec'> = {
      metadata: meta('shop', 'x'),
      spec: spec({ activityId: 'spring-2030' }),
    };
    expect(activityIdOf(fsa)).toBe('spring-2030');
  });

  it('computes warm-up from warmUpAt, warmUpLead or the default lead', () => {
    expect(scheduleOf(spec()).warmUpAt.toISOString()).toBe('2030-01-01T09:55:00.000Z');
    expect(scheduleOf(spec(), 60_000).warmUpAt.toISOString()).toBe('2030-01-01T09:59:00.000Z');
    const lead = spec({
      schedule: { warmUpLead: '10m', startAt: '2030-01-01T10:00:00Z', endAt: '2030-01-01T11:00:00Z' },
    });
    expect(scheduleOf(lead).warmUpAt.toISOString()).toBe('2030-01-01T09:50:00.000Z');
    const at = spec({
      schedule: {
        warmUpAt: '2030-01-01T08:00:00Z',
        startAt: '2030-01-01T10:00:00Z',
        endAt: '2030-01-01T11:00:00Z',
      },
    });
    expect(scheduleOf(at)).toEqual({
      warmUpAt: new Date('2030-01-01T08:00:00Z'),
      startAt: new Date('2030-01-01T10:00:00Z'),
      endAt: new Date('2030-01-01T11:00:00Z'),
    });
  });

  it.each([
    [Phase.Pending, { api: 0, relay: 0, consumer: 0 }],
    [Phase.WarmingUp, { api: 1, relay: 2, consumer: 3 }],
    [Phase.Ready, { api: 1, relay: 2, consumer: 3 }],
    [Phase.Active, { api: 4, relay: 5, consumer: 6 }],
    [Phase.Draining, { api: 0, relay: 7, consumer: 8 }],
    [Phase.WritingBack, { api: 0, relay: 7, consumer: 8 }],
    [Phase.CleaningUp, { api: 0, relay: 7, consumer: 8 }],
    [Phase.Settling, { api: 0, relay: 7, consumer: 8 }],
    [Phase.Completed, { api: 0, relay: 0, consumer: 0 }],
    [Phase.Failed, { api: 0, relay: 0, consumer: 0 }],
  ])('sizes the runtime for %s', (phase, replicas) => {
    expect(replicasFor(spec(), phase)).toEqual(replicas);
  });

  it('splits a queue key at the first slash', () => {
    expect(splitKey('ns/name')).toEqual({ namespace: 'ns', name: 'name' });
  });
});
