// The operator is SIGKILLed in every phase, each time right after a side effect and before the
// status records it (crash points, FLASHSALE_CRASH_POINT), plus once from outside while the sale
// runs, and restarted: the lifecycle still completes with exactly one cache load and one
// write-back, and live stock is never reset. The sale is ended by deleting the activity (the
// same drain, write-back and cleanup path as endAt), so no step depends on how fast this machine
// starts a process.
import type { Redis } from 'ioredis';
import { readMeta } from '../../../core/activity-cache.js';
import { readLoadedDefinition } from '../../../core/loaded-definition.js';
import { findCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { countOrders } from '../../../core/db/orders-store.js';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows, readWriteBack } from '../../../core/db/stock-store.js';
import { FlashSaleError } from '../../../core/errors.js';
import { activityKeys } from '../../../core/keys.js';
import { reserve } from '../../../core/reservations.js';
import {
  FINALIZER,
  GROUP,
  PHASE_ORDER,
  PLURAL,
  Phase,
  VERSION,
} from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import { uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { startRole } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import {
  activityBody,
  admin,
  createActivity,
  eventsOf,
  getActivity,
  scanKeys,
  startOperator,
  waitFor,
  waitForPhase,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess, Recorder } from '../../../dev/operator-harness.js';
import { operatorWorld } from './setup.js';
import type { OperatorWorld } from './setup.js';

const TIMEOUT_MS = 300_000;

describe('operator: SIGKILL in every phase', () => {
  const a = admin();
  let world: OperatorWorld | undefined;
  const name = 'crashy';
  const activityId = uniqueId('crash');
  let db: FreshDatabase;
  let pg: Pool;
  let redis: Redis;
  let ns: OperatorNamespace;
  let runtime: RoleProcess | undefined;
  let current: OperatorProcess | undefined;
  let recorder: Recorder;

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-crash', topicsOf: [activityId] });
    ({ db, pg, redis, ns, recorder } = world);
    // The relay and consumer that empty the backlog.
    runtime = await startRole('all', { activityId, databaseUrl: db.url });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await current?.kill('SIGKILL');
    await runtime?.stop();
    await world?.close();
  }, TIMEOUT_MS);

  const fetchFsa = async (): Promise<FlashSaleActivity> => {
    const fsa = await getActivity(a, ns.namespace, name);
    if (!fsa) throw new Error('activity vanished');
    return fsa;
  };

  /** Runs an operator that kills itself at `point`; returns the activity as the crash left it. */
  const crashAt = async (point: string): Promise<FlashSaleActivity> => {
    current = await startOperator({ ns, databaseUrl: db.url, crashPoint: point, waitFor: 'nothing' });
    const exit = await Promise.race([
      current.exited,
      new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 120_000).unref()),
    ]);
    if (!exit) throw new Error(`the operator never reached ${point}; log: ${current.logFile}`);
    expect({ point, signal: exit.signal }).toEqual({ point, signal: 'SIGKILL' });
    return fetchFsa();
  };

  const loads = async (): Promise<number | undefined> => (await readMeta(redis, activityId))?.loads;

  it(
    'completes with one load and one write-back',
    async () => {
      const t0 = Date.now();
      const startAt = new Date(t0 + 3_000);
      const endAt = new Date(t0 + 3_600_000);
      await createActivity(
        a,
        activityBody(ns.namespace, name, {
          warmUpAt: new Date(t0),
          startAt,
          endAt,
          items: [
            { skuId: 'a', name: '限量球鞋', price: '899.00', stock: 6 },
            { skuId: 'b', name: '保温杯', price: '99.00', stock: 5, limitPerUser: 2 },
          ],
          drainTimeout: '4s',
          extraSpec: { activityId },
        }),
      );

      // Pending: the finalizer is on, nothing else was written.
      let fsa = await crashAt('operator-after-finalizer');
      expect(fsa.metadata.finalizers).toContain(FINALIZER);
      expect(fsa.status?.phase).toBeUndefined();

      // WarmingUp: the cache is loaded but the status does not say so.
      fsa = await crashAt('operator-after-load');
      expect(fsa.status?.phase).toBe(Phase.WarmingUp);
      expect(await readMeta(redis, activityId)).toMatchObject({ loads: 1, gate: 'pending', generation: 1 });

      // Ready: the gate is open, the status still says Ready.
      fsa = await crashAt('operator-after-open-gate');
      expect(fsa.status?.phase).toBe(Phase.Ready);
      expect(await readMeta(redis, activityId)).toMatchObject({ loads: 1, gate: 'open' });

      // A price edit the CRD admits for Ready lands now: the sale is live, so the operator that
      // comes back judges it by the open gate and refuses it (nothing sold at 899.00 is repriced).
      await a.custom.patchNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: ns.namespace,
        plural: PLURAL,
        name,
        body: [{ op: 'replace', path: '/spec/items/0/price', value: '799.00' }],
      });

      // Buyers reserve while no operator runs at all: 10 want "a" (6 in stock), 3 want 2 of "b".
      const outcomes: string[] = [];
      for (let i = 0; i < 13; i += 1) {
        try {
          await reserve(redis, {
            activityId,
            userId: `u${i}`,
            skuId: i < 10 ? 'a' : 'b',
            quantity: i < 10 ? 1 : 2,
            requestId: `r${i}`,
            traceId: `t${i}`,
          });
          outcomes.push('ok');
        } catch (err) {
          outcomes.push(err instanceof FlashSaleError ? err.code : String(err));
        }
      }
      expect(outcomes.filter((o) => o === 'ok')).toHaveLength(8);
      expect(outcomes.filter((o) => o !== 'ok').every((o) => o === 'SOLD_OUT')).toBe(true);

      // Active, killed from outside while the sale runs.
      current = await startOperator({ ns, databaseUrl: db.url });
      await waitForPhase(a, ns.namespace, name, Phase.Active, 60_000);
      const refused = await waitFor('the price edit refused', async () => {
        const degraded = findCondition((await fetchFsa()).status?.conditions, 'Degraded');
        return degraded?.reason === 'SpecChangeRefused' ? degraded : undefined;
      });
      expect(refused.message).toMatch(/sku a: price 899\.00 -> 799\.00/);
      expect((await readLoadedDefinition(redis, activityId))?.items.find((i) => i.skuId === 'a')?.price).toBe(
        '899.00',
      );
      expect((await current.kill('SIGKILL')).signal).toBe('SIGKILL');
      expect(await loads()).toBe(1);

      // Deleting the live activity ends the sale. Active -> Draining: the gate is closed, the status
      // still says Active.
      await a.custom.deleteNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: ns.namespace,
        plural: PLURAL,
        name,
      });
      fsa = await crashAt('operator-after-close-gate');
      expect(fsa.metadata.deletionTimestamp).toBeDefined();
      expect(fsa.status?.phase).toBe(Phase.Active);
      expect(await readMeta(redis, activityId)).toMatchObject({ loads: 1, gate: 'closed' });

      // Draining finished (or timed out), not recorded.
      fsa = await crashAt('operator-after-drain');
      expect(fsa.status?.phase).toBe(Phase.Draining);

      // WritingBack: frozen, nothing written yet.
      fsa = await crashAt('operator-after-freeze');
      expect(fsa.status?.phase).toBe(Phase.WritingBack);
      expect(await readMeta(redis, activityId)).toMatchObject({ loads: 1, gate: 'frozen' });
      expect(await readWriteBack(pg, activityId)).toBeUndefined();

      // WritingBack: written, not recorded.
      fsa = await crashAt('operator-after-write-back');
      expect(fsa.status?.phase).toBe(Phase.WritingBack);
      const written = await readWriteBack(pg, activityId);
      expect(written).toMatchObject({
        initialTotal: 11,
        reservedTotal: 10,
        remainingTotal: 1,
        generation: 1,
      });

      // CleaningUp: keys deleted, not recorded. The relay and consumer emptied the backlog first
      // (cleanup refuses otherwise).
      fsa = await crashAt('operator-after-cleanup');
      expect(fsa.status?.phase).toBe(Phase.CleaningUp);
      expect(await readMeta(redis, activityId)).toBeUndefined();

      // A last, uninterrupted run finishes and lets the resource go.
      current = await startOperator({ ns, databaseUrl: db.url });
      await waitFor(
        'the activity to be deleted',
        async () => !(await getActivity(a, ns.namespace, name)),
        90_000,
      );
      // Deleted with eight unpaid orders: released from Settling (the after-sale role settles them).
      await recorder.sawDeleted(name);
      const done = recorder.statuses.get(name)?.findLast((f) => f.status?.phase === Phase.Settling);
      // Released from Settling at their draining size, then removed with the activity by the
      // garbage collector (never by the operator).
      for (const role of ['api', 'relay', 'consumer']) {
        expect(recorder.replicas.get(`${name}-${role}`)?.at(-1)).toBe(1);
      }
      await waitFor('the runtime garbage-collected', async () => {
        const list = await a.apps.listNamespacedDeployment({ namespace: ns.namespace });
        return list.items.length === 0;
      });

      expect(recorder.phases.get(name)).toEqual(PHASE_ORDER.filter((p) => p !== Phase.Completed));
      expect(done?.status?.settlement).toMatchObject({ unpaid: 8, unsettled: 8 });
      expect(done?.status?.cache?.loads).toBe(1);
      expect(done?.status?.writeBack).toMatchObject({ remaining: 1, generation: 1 });
      // One fence row, unchanged since it was written; stock rows as sold.
      expect(await readWriteBack(pg, activityId)).toEqual(written);
      expect(await readStockRows(pg, activityId)).toEqual([
        { skuId: 'a', initial: 6, remaining: 0 },
        { skuId: 'b', initial: 5, remaining: 1 },
      ]);
      expect((await countOrders(pg, activityId)).orders).toBe(8);
      const k = activityKeys(activityId);
      expect(await scanKeys(redis, k.scanPattern)).toEqual([k.results]);

      const reasons = (await eventsOf(a, ns.namespace, name)).map((e) => e.reason);
      expect(reasons.filter((r) => r === 'CacheLoaded')).toHaveLength(1);
      expect(reasons.filter((r) => r === 'WroteBack')).toHaveLength(1);
      expect(reasons).toContain('ReleasedUnsettled');
      expect(reasons).not.toContain('Completed');
      expect(reasons).toContain('FinalizerRemoved');
    },
    TIMEOUT_MS,
  );
});
