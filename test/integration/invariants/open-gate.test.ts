// The operator's open-gate step (operator/reconcile/open-gate.ts) against a real Redis holding a
// sale with a SKU in stock buckets: setGate moves every bucket's gate before the activity's, so a
// move that stopped half-way (a crash, a bucket's node that answered and the activity's that did
// not) leaves buckets ahead of the activity. With spec.paused then set back, the activity's gate
// already says what is wanted; the buckets' gates, which each bucket's reserve script reads, must
// follow it too, or buyers homed there keep buying through a pause (or are refused in an open sale).
import { Redis } from 'ioredis';
import { setGate } from '../../../core/activity-cache.js';
import { bucketLayout } from '../../../core/buckets.js';
import { FlashSaleError } from '../../../core/errors.js';
import { reserve } from '../../../core/reservations.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { openGate } from '../../../operator/reconcile/open-gate.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import { loadOpenSale } from '../../fixtures/open-sale.js';
import { stepContext } from '../../fixtures/step-context.js';

describe("the operator's open-gate step and a gate move that stopped half-way (real Redis)", () => {
  let redis: Redis;
  beforeAll(() => {
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 2 });
  });
  afterAll(async () => {
    await redis.quit();
  });

  const pass = (activityId: string, paused: boolean) => {
    const now = new Date();
    const events: string[] = [];
    const ctx = stepContext(
      {
        activityId,
        now,
        spec: { paused },
        status: { conditions: enterPhase(undefined, Phase.Active, 'test', 1, now) },
        deps: { redis },
      },
      events,
    );
    return { ctx, events, run: () => openGate(ctx) };
  };
  const bucketGates = async (id: string) => {
    const layout = await bucketLayout(redis, id);
    return Promise.all(layout.allBuckets().map((b) => redis.hget(b.meta, 'gate')));
  };
  const attempt = async (id: string, userId: string): Promise<string> => {
    try {
      await reserve(redis, {
        activityId: id,
        userId,
        skuId: 'hot',
        quantity: 1,
        requestId: userId,
        traceId: 't',
      });
      return 'reserved';
    } catch (err) {
      return err instanceof FlashSaleError ? err.code : String(err);
    }
  };

  test('paused again after a resume that moved only the buckets: every bucket is paused, no buyer reserves', async () => {
    const id = uniqueId('gate');
    await loadOpenSale(redis, id, [
      { skuId: 'hot', name: 'hot', price: '1.00', stock: 40, limitPerUser: 1, buckets: 4 },
    ]);
    await setGate(redis, id, 'paused');
    // The resume moved the buckets and died before the activity's gate.
    const layout = await bucketLayout(redis, id);
    for (const b of layout.allBuckets()) await redis.hset(b.meta, 'gate', 'open');
    expect(await bucketGates(id)).toEqual(['open', 'open', 'open', 'open']);

    // The user pauses again (spec.paused: true); the activity's gate already says paused.
    const p = pass(id, true);
    await p.run();
    expect(await bucketGates(id)).toEqual(['paused', 'paused', 'paused', 'paused']);
    expect(p.ctx.gateSeen).toBe('paused');
    const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => attempt(id, `buyer-${i}`)));
    expect(new Set(answers)).toEqual(new Set(['PAUSED']));
  });

  test('resumed after a pause that moved only the buckets: every bucket is open again', async () => {
    const id = uniqueId('gate-open');
    await loadOpenSale(redis, id, [
      { skuId: 'hot', name: 'hot', price: '1.00', stock: 40, limitPerUser: 1, buckets: 4 },
    ]);
    const layout = await bucketLayout(redis, id);
    for (const b of layout.allBuckets()) await redis.hset(b.meta, 'gate', 'paused');
    const p = pass(id, false);
    await p.run();
    expect(await bucketGates(id)).toEqual(['open', 'open', 'open', 'open']);
    const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => attempt(id, `buyer-${i}`)));
    expect(new Set(answers)).toEqual(new Set(['reserved']));
    // A pass with nothing to move moves nothing and says nothing.
    const quiet = pass(id, false);
    await quiet.run();
    expect(quiet.events).toEqual([]);
  });
});
