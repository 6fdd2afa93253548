// The operator's drain step (operator/reconcile/drain.ts) against a real Redis holding a backlog
// (a half message and its unconfirmed reservation): spec.drain.timeout counts from the drain's
// start as it is now. Raised during the drain (a backlog that needs longer), the sale keeps
// draining past the old deadline instead of being written back with orders still on their way;
// the status names the deadline applied, and the timeout's message the duration applied.
import { Redis } from 'ioredis';
import { reserve } from '../../../core/reservations.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase, Reason } from '../../../operator/api/v1alpha1/types.js';
import type { ReconcileContext } from '../../../operator/reconcile/context.js';
import { drain } from '../../../operator/reconcile/drain.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import { loadOpenSale } from '../../fixtures/open-sale.js';
import { stepContext } from '../../fixtures/step-context.js';

const MINUTE = 60_000;

describe("the operator's drain step and an edited spec.drain.timeout (real Redis)", () => {
  let redis: Redis;
  beforeAll(() => {
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 2 });
  });
  afterAll(async () => {
    await redis.quit();
  });

  /** Draining since `startedAgoMs`, its deadline recorded with `recordedTimeout`, the spec at `timeout`. */
  function context(
    activityId: string,
    o: { startedAgoMs: number; recordedTimeout: number; timeout: string },
    events: string[],
  ): ReconcileContext {
    const now = new Date();
    const started = new Date(now.getTime() - o.startedAgoMs);
    return stepContext(
      {
        activityId,
        now,
        spec: { drain: { timeout: o.timeout } },
        status: {
          conditions: enterPhase(undefined, Phase.Draining, 'test', 1, started),
          timestamps: { draining: started.toISOString() },
          drain: { deadline: new Date(started.getTime() + o.recordedTimeout).toISOString() },
          cache: { loads: 1, loadedGeneration: 1 },
        },
        deps: { redis, kafka: { lag: async () => 0 }, config: { drainCheckMs: 5_000 } },
      },
      events,
    );
  }

  test('raised during the drain: still draining past the old deadline; lowered: timed out, naming what applied', async () => {
    const id = uniqueId('drain');
    await loadOpenSale(redis, id, [{ skuId: 's', name: 'item', price: '1.00', stock: 5, limitPerUser: 1 }]);
    await reserve(redis, {
      activityId: id,
      userId: 'u',
      skuId: 's',
      quantity: 1,
      requestId: 'r',
      traceId: 't',
    });

    // Draining for 6 minutes, begun with 5m, raised to 30m: the backlog keeps its time.
    const events: string[] = [];
    const raised = context(
      id,
      { startedAgoMs: 6 * MINUTE, recordedTimeout: 5 * MINUTE, timeout: '30m' },
      events,
    );
    await drain(raised);
    expect([raised.transitioned, events]).toEqual([false, []]);
    const started = new Date(raised.status.timestamps!.draining!).getTime();
    expect(raised.status.drain?.deadline).toBe(new Date(started + 30 * MINUTE).toISOString());
    expect(raised.requeueAtMs).toBeDefined();

    // Lowered to 2m after 6 minutes: timed out now, and the message says 2m.
    const lowered = context(
      id,
      { startedAgoMs: 6 * MINUTE, recordedTimeout: 30 * MINUTE, timeout: '2m' },
      events,
    );
    await drain(lowered);
    expect([lowered.transitioned, events]).toEqual([true, [Reason.DrainTimedOut]]);
    expect(lowered.status.drain?.leftover).toMatch(
      /^drain timed out after 2m: 1 half message\(s\) not yet in Kafka/,
    );
    expect(lowered.status.drain?.deadline).toBe(
      new Date(new Date(lowered.status.timestamps!.draining!).getTime() + 2 * MINUTE).toISOString(),
    );
  });
});
