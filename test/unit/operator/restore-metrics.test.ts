// The open cache restore's series (operator/reconcile/restore-metrics.ts): its detection time, the
// series FlashSaleCacheRestoreStuck reads (`time() - it`), and its age as of the last pass. The
// detection time must not depend on when passes run: when passes stop, the age freezes below the
// threshold while `time() - detected` keeps growing.
import { createOperatorMetrics } from '../../../core/metrics.js';
import type { OperatorMetrics } from '../../../core/metrics.js';
import type { CacheRestoreRow, RestoreStep } from '../../../core/db/cache-restores-store.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import type { ReconcileContext } from '../../../operator/reconcile/context.js';
import { createLogger } from '../../../core/logger.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import { activityIdOf } from '../../../operator/api/v1alpha1/funcs.js';
import { FINALIZER, Phase } from '../../../operator/api/v1alpha1/types.js';
import type { ReconcileDeps } from '../../../operator/reconcile/context.js';
import { Reconciler } from '../../../operator/reconcile/reconciler.js';
import { exportOpenRestore } from '../../../operator/reconcile/restore-metrics.js';
import { forgetActivityMetrics } from '../../../operator/reconcile/update-status.js';
import { activityFixture } from './activity-fixture.js';

const DETECTED = new Date('2030-01-01T10:00:00Z');
const labels = { activity: 'shop.s1-aaaaaaaa', name: 's1', namespace: 'shop' };

function row(step: RestoreStep): CacheRestoreRow {
  return {
    activityId: labels.activity,
    epoch: 1,
    reason: 'CacheEmpty',
    step,
    divergence: { redis: { present: false }, expectedEpoch: 0, skus: [] },
    reloaded: {},
    detectedAt: DETECTED,
    pausedAt: null,
    drainedAt: null,
    reloadedAt: null,
    resumedAt: null,
    pausedForSeconds: null,
  };
}

function pass(metrics: OperatorMetrics, now: Date, open: CacheRestoreRow | undefined): void {
  // The fields exportOpenRestore reads; a pass's context has many more.
  const ctx = {
    deps: { metrics },
    fsa: { metadata: { name: labels.name, namespace: labels.namespace } } as FlashSaleActivity,
    activityId: labels.activity,
    now,
  };
  exportOpenRestore(ctx as unknown as ReconcileContext, open);
}

async function series(metrics: OperatorMetrics, name: string): Promise<[Record<string, unknown>, number][]> {
  const metric = metrics.registry.getSingleMetric(name);
  if (!metric) throw new Error(`${name} is not registered`);
  return (await metric.get()).values.map((v) => [v.labels, v.value]);
}

const SINCE = 'flashsale_cache_restore_open_since_timestamp_seconds';
const AGE = 'flashsale_cache_restore_open_seconds';
const at = (seconds: number): Date => new Date(DETECTED.getTime() + seconds * 1000);

describe('exportOpenRestore', () => {
  it('exports the detection time (Unix seconds) on the series of the current step, whenever the pass runs', async () => {
    const metrics = createOperatorMetrics();
    pass(metrics, at(30), row('paused'));
    expect(await series(metrics, SINCE)).toEqual([
      [{ ...labels, step: 'paused' }, DETECTED.getTime() / 1000],
    ]);
    expect(await series(metrics, AGE)).toEqual([[{ ...labels, step: 'paused' }, 30]]);

    // A later pass, at the next step: one series, moved to that step, same detection time.
    pass(metrics, at(400), row('drained'));
    expect(await series(metrics, SINCE)).toEqual([
      [{ ...labels, step: 'drained' }, DETECTED.getTime() / 1000],
    ]);
    expect(await series(metrics, AGE)).toEqual([[{ ...labels, step: 'drained' }, 400]]);
  });

  it('keeps the detection time when no pass runs (the age stays at the last pass)', async () => {
    const metrics = createOperatorMetrics();
    pass(metrics, at(60), row('drained'));
    // No pass for a while (PostgreSQL down): the age is frozen at 60, the timestamp still tells.
    expect(await series(metrics, AGE)).toEqual([[{ ...labels, step: 'drained' }, 60]]);
    expect(await series(metrics, SINCE)).toEqual([
      [{ ...labels, step: 'drained' }, DETECTED.getTime() / 1000],
    ]);
  });

  it('removes both series when the restore resumed or none is open', async () => {
    for (const end of [row('resumed'), undefined]) {
      const metrics = createOperatorMetrics();
      pass(metrics, at(30), row('reloaded'));
      pass(metrics, at(60), end);
      expect(await series(metrics, SINCE)).toEqual([]);
      expect(await series(metrics, AGE)).toEqual([]);
    }
  });

  it('exports no detection time once the resource is forgotten (deleted while a restore is open)', async () => {
    const metrics = createOperatorMetrics();
    pass(metrics, at(30), row('paused'));
    forgetActivityMetrics(metrics, labels);
    expect(await series(metrics, AGE)).toEqual([]);
    expect(await series(metrics, SINCE)).toEqual([]);
    expect(await metrics.registry.metrics()).not.toContain(SINCE + '{');
  });
});

describe('a pass that stops before the restore step (PostgreSQL down)', () => {
  it('exports the open restore from the status: FlashSaleCacheRestoreStuck is not blind after an operator restart', async () => {
    // A fresh operator process (a restart, or another replica taking the lease) while PostgreSQL is
    // down: every pass fails at claim-id, before restore-cache, which alone read the restore's row.
    const metrics = createOperatorMetrics();
    const detected = '2030-01-01T10:05:00.000Z';
    const now = new Date('2030-01-01T10:40:00Z');
    const base = activityFixture();
    const fsa: FlashSaleActivity = {
      ...base,
      metadata: { ...base.metadata, finalizers: [FINALIZER] },
      status: {
        conditions: [
          ...enterPhase(undefined, Phase.Active, 'selling', 3, new Date('2030-01-01T10:00:00Z')),
          {
            type: 'CacheConsistent',
            status: 'False',
            reason: 'RestoreDraining',
            message: 'restore 1: waiting for the backlog',
            lastTransitionTime: detected,
            observedGeneration: 3,
          },
        ],
      },
    };
    const down = (): Promise<never> => Promise.reject(new Error('connect ECONNREFUSED 127.0.0.1:5432'));
    const deps = {
      activities: { get: async () => fsa, patchStatus: async () => undefined },
      pool: { query: down, connect: down },
      metrics,
      log: createLogger('restore-metrics-test', 'silent'),
      config: { defaultWarmUpLead: '5m', statusRefreshMs: 0 },
      now: () => now,
      events: { record: async () => undefined },
      identity: 'operator-test',
    } as unknown as ReconcileDeps;
    await expect(new Reconciler(deps).reconcile('shop/spring')).rejects.toThrow(/ECONNREFUSED/);
    const id = { activity: activityIdOf(fsa), name: 'spring', namespace: 'shop' };
    expect(await series(metrics, SINCE)).toEqual([[{ ...id, step: 'paused' }, Date.parse(detected) / 1000]]);
    expect(await series(metrics, AGE)).toEqual([[{ ...id, step: 'paused' }, 35 * 60]]);
  });
});
