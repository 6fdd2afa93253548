// Spec edits during a sale (safe ones applied through a new cache generation, unsafe ones refused
// with a condition), pausing, deleting a live activity (drained, written back and cleaned up
// before the finalizer goes), and the Failed outcomes.
import type { Redis } from 'ioredis';
import { readMeta } from '../../../core/activity-cache.js';
import { findRegisteredActivity } from '../../../core/db/activity-registry-store.js';
import { upsertCatalogItems } from '../../../core/db/catalog-store.js';
import { readClaim } from '../../../core/db/claims-store.js';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows, readWriteBack } from '../../../core/db/stock-store.js';
import type { FlashSaleError } from '../../../core/errors.js';
import { createKafka, topicsFor } from '../../../core/kafka.js';
import { activityKeys } from '../../../core/keys.js';
import { readLoadedDefinition } from '../../../core/loaded-definition.js';
import { reserve } from '../../../core/reservations.js';
import { findCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { GROUP, PHASE_ORDER, PLURAL, Phase, VERSION } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
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

const TIMEOUT_MS = 240_000;

describe('operator: edits, pause, deletion, failures', () => {
  const a = admin();
  let world: OperatorWorld | undefined;
  const catalog = uniqueId('cat');
  let db: FreshDatabase;
  let pg: Pool;
  let redis: Redis;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;
  let recorder: Recorder;

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-edit' });
    ({ db, pg, redis, ns, recorder } = world);
    await upsertCatalogItems(pg, [
      {
        namespace: ns.namespace,
        catalog,
        skuId: 'rice',
        name: '五常大米 5kg',
        price: '59.90',
        stock: 10,
        limitPerUser: 2,
      },
      {
        namespace: ns.namespace,
        catalog,
        skuId: 'oil',
        name: '花生油 5L',
        price: '89.00',
        stock: 4,
        limitPerUser: 1,
      },
    ]);
    operator = await startOperator({ ns, databaseUrl: db.url });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await operator?.kill('SIGTERM');
    await world?.close();
  }, TIMEOUT_MS);

  const jsonPatch = (name: string, ops: unknown[]): Promise<unknown> =>
    a.custom.patchNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: ns.namespace,
      plural: PLURAL,
      name,
      body: ops,
    });
  /** Waits until the operator has looked at the current generation. */
  const settled = (name: string, generation: number): Promise<FlashSaleActivity> =>
    waitFor(`${name} generation ${generation} synced`, async () => {
      const fsa = await getActivity(a, ns.namespace, name);
      return fsa?.status?.cache?.syncedGeneration === generation &&
        fsa.status.observedGeneration === generation
        ? fsa
        : undefined;
    });
  const remove = (name: string): Promise<unknown> =>
    a.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: ns.namespace,
      plural: PLURAL,
      name,
    });

  it(
    'applies safe edits, refuses unsafe ones, pauses, and drains, writes back and cleans up on deletion',
    async () => {
      const t0 = Date.now();
      const endAt = new Date(t0 + 10 * 60_000);
      await createActivity(
        a,
        activityBody(ns.namespace, 'z', {
          warmUpAt: new Date(t0),
          startAt: new Date(t0 + 2_000),
          endAt,
          catalogRef: catalog,
          drainTimeout: '10s',
        }),
      );
      const active = await waitForPhase(a, ns.namespace, 'z', Phase.Active, 60_000);
      const id = active.status?.activityId ?? '';
      // The operator created the activity's topics during warm-up.
      const kadmin = createKafka(testEnv().kafkaBrokers, id).admin();
      await kadmin.connect();
      const topics = await kadmin.listTopics();
      await kadmin.disconnect();
      expect(topics).toEqual(expect.arrayContaining([topicsFor(id).orders, topicsFor(id).dlq]));
      expect(await readMeta(redis, id)).toMatchObject({ loads: 1, gate: 'open', generation: 1 });
      expect(
        (await readLoadedDefinition(redis, id))?.items.map((i) => [i.skuId, i.name, i.price, i.stock]),
      ).toEqual([
        ['oil', '花生油 5L', '89.00', 4],
        ['rice', '五常大米 5kg', '59.90', 10],
      ]);

      // Safe: more stock and a new item in the catalog, picked up with the next generation.
      await upsertCatalogItems(pg, [
        {
          namespace: ns.namespace,
          catalog,
          skuId: 'rice',
          name: '五常大米 5kg',
          price: '59.90',
          stock: 15,
          limitPerUser: 2,
        },
        {
          namespace: ns.namespace,
          catalog,
          skuId: 'salt',
          name: '海盐 500g',
          price: '3.50',
          stock: 3,
          limitPerUser: 5,
        },
      ]);
      await jsonPatch('z', [{ op: 'replace', path: '/spec/runtime/replicas/active/api', value: 3 }]);
      let z = await settled('z', 2);
      expect(await readMeta(redis, id)).toMatchObject({ loads: 2, generation: 2, gate: 'open' });
      const stock2 = await readLoadedDefinition(redis, id);
      expect(stock2?.items.map((i) => [i.skuId, i.stock])).toEqual([
        ['oil', 4],
        ['rice', 15],
        ['salt', 3],
      ]);
      expect(findCondition(z.status?.conditions, 'Degraded')).toMatchObject({ status: 'False' });
      await waitFor('api scaled to 3', async () => {
        const d = await a.apps.readNamespacedDeployment({ name: 'z-api', namespace: ns.namespace });
        return d.spec?.replicas === 3;
      });

      // Safe: the sale is extended.
      const later = new Date(endAt.getTime() + 5 * 60_000);
      await jsonPatch('z', [{ op: 'replace', path: '/spec/schedule/endAt', value: later.toISOString() }]);
      z = await settled('z', 3);
      expect(await readMeta(redis, id)).toMatchObject({ loads: 3, endMs: later.getTime() });

      // Unsafe (admission cannot see catalog rows): a price change and a stock decrease.
      await upsertCatalogItems(pg, [
        {
          namespace: ns.namespace,
          catalog,
          skuId: 'rice',
          name: '五常大米 5kg',
          price: '49.90',
          stock: 15,
          limitPerUser: 2,
        },
        {
          namespace: ns.namespace,
          catalog,
          skuId: 'oil',
          name: '花生油 5L',
          price: '89.00',
          stock: 2,
          limitPerUser: 1,
        },
      ]);
      await jsonPatch('z', [{ op: 'replace', path: '/spec/runtime/replicas/active/api', value: 4 }]);
      z = await settled('z', 4);
      const degraded = findCondition(z.status?.conditions, 'Degraded');
      expect(degraded).toMatchObject({ status: 'True', reason: 'SpecChangeRefused', observedGeneration: 4 });
      expect(degraded?.message).toMatch(/sku oil: stock 4 -> 2 \(stock can only grow\)/);
      expect(degraded?.message).toMatch(/sku rice: price 59\.90 -> 49\.90/);
      expect(findCondition(z.status?.conditions, 'SpecAccepted')).toMatchObject({
        status: 'False',
        reason: 'SpecChangeRefused',
        message: degraded?.message,
      });
      expect(z.status?.cache).toMatchObject({ loadedGeneration: 3, syncedGeneration: 4, loads: 3 });
      expect(await readMeta(redis, id)).toMatchObject({ loads: 3, generation: 3 });
      const kept = await readLoadedDefinition(redis, id);
      expect(kept?.items.find((i) => i.skuId === 'rice')?.price).toBe('59.90');
      expect(kept?.items.find((i) => i.skuId === 'oil')?.stock).toBe(4);
      // The runtime part of the same edit is applied: only the cache refuses it.
      await waitFor('api scaled to 4', async () => {
        const d = await a.apps.readNamespacedDeployment({ name: 'z-api', namespace: ns.namespace });
        return d.spec?.replicas === 4;
      });

      // Paused: the gate closes without ending the sale, then opens again.
      await jsonPatch('z', [{ op: 'replace', path: '/spec/paused', value: true }]);
      z = await settled('z', 5);
      expect(findCondition(z.status?.conditions, 'Paused')).toMatchObject({
        status: 'True',
        reason: 'PausedBySpec',
      });
      expect(z.status?.phase).toBe(Phase.Active);
      expect((await readMeta(redis, id))?.gate).toBe('paused');
      await expect(
        reserve(redis, {
          activityId: id,
          userId: 'u1',
          skuId: 'rice',
          quantity: 1,
          requestId: 'r1',
          traceId: 't1',
        }),
      ).rejects.toMatchObject({ code: 'PAUSED' } satisfies Partial<FlashSaleError>);
      await jsonPatch('z', [{ op: 'replace', path: '/spec/paused', value: false }]);
      z = await settled('z', 6);
      expect(findCondition(z.status?.conditions, 'Paused')).toMatchObject({ status: 'False' });
      expect((await readMeta(redis, id))?.gate).toBe('open');

      // Deleting the live activity drains, writes back and cleans up before the finalizer goes.
      await remove('z');
      await waitFor('z deleted', async () => (await getActivity(a, ns.namespace, 'z')) === undefined, 90_000);
      await recorder.sawDeleted('z');
      expect(recorder.phases.get('z')).toEqual(PHASE_ORDER);
      expect(await readWriteBack(pg, id)).toMatchObject({
        initialTotal: 22,
        remainingTotal: 22,
        generation: 3,
      });
      expect(await readStockRows(pg, id)).toEqual([
        { skuId: 'oil', initial: 4, remaining: 4 },
        { skuId: 'rice', initial: 15, remaining: 15 },
        { skuId: 'salt', initial: 3, remaining: 3 },
      ]);
      expect(await scanKeys(redis, activityKeys(id).scanPattern)).toEqual([]);
      const events = await eventsOf(a, ns.namespace, 'z');
      const reasons = events.map((e) => e.reason);
      for (const r of [
        'SpecChangeApplied',
        'SpecChangeRefused',
        'SalePaused',
        'SaleResumed',
        'WroteBack',
        'FinalizerRemoved',
      ]) {
        expect(reasons).toContain(r);
      }
      expect(events.find((e) => e.reason === 'SpecChangeRefused')?.type).toBe('Warning');
      expect(events.find((e) => e.reason === 'DrainStarted')?.message).toMatch(/being deleted/);
    },
    TIMEOUT_MS,
  );

  it(
    'lets a Pending activity go at once, with nothing written',
    async () => {
      const t0 = Date.now();
      await createActivity(
        a,
        activityBody(ns.namespace, 'later', {
          warmUpAt: new Date(t0 + 3_600_000),
          startAt: new Date(t0 + 7_200_000),
          endAt: new Date(t0 + 9_000_000),
          items: [{ skuId: 's', name: '月饼', price: '1', stock: 1 }],
        }),
      );
      const pending = await waitFor('Pending with its next check', async () => {
        const fsa = await getActivity(a, ns.namespace, 'later');
        return fsa?.status?.nextCheckAt ? fsa : undefined;
      });
      expect(pending.status?.phase).toBe(Phase.Pending);
      const id = pending.status?.activityId ?? '';
      expect(await findRegisteredActivity(pg, id)).toBeDefined();
      await remove('later');
      await waitFor('later deleted', async () => (await getActivity(a, ns.namespace, 'later')) === undefined);
      expect(await readWriteBack(pg, id)).toBeUndefined();
      // Nothing of the id is left for the next resource that names it: no sale window, no claim.
      expect(await findRegisteredActivity(pg, id)).toBeUndefined();
      expect(await readClaim(pg, id)).toBeUndefined();
      expect(await scanKeys(redis, activityKeys(id).scanPattern)).toEqual([]);
    },
    TIMEOUT_MS,
  );

  it(
    'a foreground deletion (kubectl delete --cascade=foreground, Argo CD) still drains with its relay and consumer, and leaves no Deployment behind',
    async () => {
      const t0 = Date.now();
      await createActivity(
        a,
        activityBody(ns.namespace, 'fg', {
          warmUpAt: new Date(t0),
          startAt: new Date(t0 + 2_000),
          endAt: new Date(t0 + 10 * 60_000),
          items: [{ skuId: 's', name: '月饼', price: '1', stock: 5 }],
          drainTimeout: '10m',
        }),
      );
      const active = await waitForPhase(a, ns.namespace, 'fg', Phase.Active, 60_000);
      const id = active.status?.activityId ?? '';
      // A reservation whose half message is still in the outbox: the drain needs the relay.
      await reserve(redis, {
        activityId: id,
        userId: 'u1',
        skuId: 's',
        quantity: 1,
        requestId: 'r1',
        traceId: 't1',
      });
      await a.custom.deleteNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: ns.namespace,
        plural: PLURAL,
        name: 'fg',
        propagationPolicy: 'Foreground',
      });
      const deployments = async (): Promise<string[]> =>
        (await a.apps.listNamespacedDeployment({ namespace: ns.namespace })).items
          .map((d) => d.metadata?.name ?? '')
          .filter((n) => n.startsWith('fg-'))
          .sort();
      // What garbage collection does for a foreground deletion, at once in a cluster whose
      // collector has long watched the CRD (this one's may not have discovered it yet): the owned
      // runtime goes. The drain gets it back, and keeps it.
      for (const role of ['api', 'relay', 'consumer']) {
        await a.apps.deleteNamespacedDeployment({ name: `fg-${role}`, namespace: ns.namespace });
      }
      await waitFor('draining with its runtime', async () => {
        const fsa = await getActivity(a, ns.namespace, 'fg');
        return fsa?.status?.phase === Phase.Draining &&
          (await deployments()).join() === 'fg-api,fg-consumer,fg-relay'
          ? true
          : undefined;
      });
      await new Promise((r) => setTimeout(r, 3_000));
      expect(await deployments()).toEqual(['fg-api', 'fg-consumer', 'fg-relay']);
      expect((await getActivity(a, ns.namespace, 'fg'))?.status?.phase).toBe(Phase.Draining);

      // The relay and consumer do their work (the test's pods run no process): the backlog goes.
      await redis.del(activityKeys(id).outbox, activityKeys(id).ledger);
      await waitFor(
        'fg deleted',
        async () => (await getActivity(a, ns.namespace, 'fg')) === undefined,
        90_000,
      );
      expect(await readWriteBack(pg, id)).toBeDefined();
      // None is left unowned: those not collected yet are owned by the deleted activity, and go
      // with it (this cluster's collector may not have discovered the CRD yet).
      const left = (await a.apps.listNamespacedDeployment({ namespace: ns.namespace })).items.filter((d) =>
        d.metadata?.name?.startsWith('fg-'),
      );
      for (const d of left) {
        expect(d.metadata?.ownerReferences?.map((r) => r.uid)).toEqual([active.metadata.uid]);
      }
    },
    TIMEOUT_MS,
  );

  it(
    'fails an activity whose window passed before it was loaded; restores one whose cache was lost',
    async () => {
      const t0 = Date.now();
      await createActivity(
        a,
        activityBody(ns.namespace, 'missed', {
          warmUpAt: new Date(t0 - 120_000),
          startAt: new Date(t0 - 60_000),
          endAt: new Date(t0 - 1_000),
          items: [{ skuId: 's', name: '粽子', price: '1', stock: 1 }],
        }),
      );
      const missed = await waitForPhase(a, ns.namespace, 'missed', Phase.Failed, 60_000);
      expect(findCondition(missed.status?.conditions, 'Succeeded')).toMatchObject({
        status: 'False',
        reason: 'ScheduleMissed',
      });

      await createActivity(
        a,
        activityBody(ns.namespace, 'lost', {
          warmUpAt: new Date(t0),
          startAt: new Date(t0 + 1_000),
          endAt: new Date(t0 + 600_000),
          items: [{ skuId: 's', name: '汤圆', price: '1', stock: 1 }],
        }),
      );
      const lost = await waitForPhase(a, ns.namespace, 'lost', Phase.Active, 60_000);
      const id = lost.status?.activityId ?? '';
      // Someone flushes the activity's keys mid-sale (as a Redis that lost its data files): the
      // operator restores the cache from PostgreSQL and the sale goes on (restore-cache.ts).
      await redis.unlink(...(await scanKeys(redis, activityKeys(id).scanPattern)));
      const restored = await waitFor(
        'the cache restored',
        async () => {
          const fsa = await getActivity(a, ns.namespace, 'lost');
          const c = findCondition(fsa?.status?.conditions, 'CacheConsistent');
          return c?.status === 'True' && c.reason === 'Restored' ? fsa : undefined;
        },
        90_000,
      );
      expect(restored.status?.phase).toBe(Phase.Active);
      const reasons = (await eventsOf(a, ns.namespace, 'lost')).map((e) => e.reason);
      for (const r of [
        'CacheDivergenceDetected',
        'CacheRestorePaused',
        'CacheRestoreDrained',
        'CacheRestoreReloaded',
        'CacheRestoreResumed',
      ]) {
        expect(reasons).toContain(r);
      }
      expect(await redis.hget(activityKeys(id).meta, 'gate')).toBe('open');
      expect(await redis.hget(activityKeys(id).sku('s'), 'stock')).toBe('1');
      expect(await readWriteBack(pg, id)).toBeUndefined();
      await remove('lost');
      await remove('missed');
      await waitFor('failed activities deleted', async () => {
        const [l, m] = await Promise.all([
          getActivity(a, ns.namespace, 'lost'),
          getActivity(a, ns.namespace, 'missed'),
        ]);
        return l === undefined && m === undefined;
      });
    },
    TIMEOUT_MS,
  );
});
