// Tenants cannot hijack each other's sales through the operator: an activity id belongs to the
// first resource that claims it (a second resource naming it fails with ActivityIdInUse and
// changes nothing, also when it is deleted), the runtime image is the operator's choice, and each
// runtime role's pods read only that role's Secret.
import type { Redis } from 'ioredis';
import { readMeta } from '../../../core/activity-cache.js';
import { upsertCatalogItems } from '../../../core/db/catalog-store.js';
import { readClaim } from '../../../core/db/claims-store.js';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows, readWriteBack } from '../../../core/db/stock-store.js';
import { readLoadedDefinition } from '../../../core/loaded-definition.js';
import { findCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { GROUP, PLURAL, Phase, RUNTIME_ROLES, VERSION } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import { isApiError, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { CustomObjectsApi } from '@kubernetes/client-node';
import {
  SERVICE_ACCOUNT,
  activityBody,
  admin,
  createActivity,
  eventsOf,
  forceRemoveFinalizers,
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
const DIGEST = `sha256:${'ab12'.repeat(16)}`;
const ALLOWED_BY_DIGEST = `registry.example/flashsale-runtime@${DIGEST}`;

describe('operator: tenant isolation', () => {
  const a = admin();
  let world: OperatorWorld | undefined;
  let db: FreshDatabase;
  let pg: Pool;
  let redis: Redis;
  let ns: OperatorNamespace;
  /** A second watched namespace (the operator's rules bound there too) and one it does not watch. */
  const second = uniqueId('op-tenant-b');
  const unwatched = uniqueId('op-tenant-x');
  let operator: OperatorProcess | undefined;
  let recorder: Recorder;

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-tenant' });
    ({ db, pg, redis, ns, recorder } = world);
    for (const name of [second, unwatched]) await a.core.createNamespace({ body: { metadata: { name } } });
    await a.rbac.createNamespacedRoleBinding({
      namespace: second,
      body: {
        metadata: { name: 'flashsale-operator' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'flashsale-operator' },
        subjects: [{ kind: 'ServiceAccount', name: SERVICE_ACCOUNT, namespace: ns.namespace }],
      },
    });
    const asOperator = ns.kubeConfig.makeApiClient(CustomObjectsApi);
    await waitFor('RBAC in the second namespace', async () => {
      await asOperator.listNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: second,
        plural: PLURAL,
      });
      return true;
    });
    operator = await startOperator({
      ns,
      databaseUrl: db.url,
      env: {
        RUNTIME_IMAGE: 'registry.example/flashsale-runtime:1.0.0',
        RUNTIME_ALLOWED_IMAGES: DIGEST,
        WATCH_NAMESPACE: `${ns.namespace},${second}`,
      },
    });
  }, TIMEOUT_MS);

  afterAll(async () => {
    if (ns) await forceRemoveFinalizers(a, ns.namespace).catch(() => undefined);
    await operator?.kill('SIGTERM');
    await world?.close();
  }, TIMEOUT_MS);

  const remove = (name: string): Promise<unknown> =>
    a.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: ns.namespace,
      plural: PLURAL,
      name,
    });
  const gone = (name: string): Promise<boolean> =>
    waitFor(`${name} deleted`, async () => (await getActivity(a, ns.namespace, name)) === undefined, 120_000);
  /** Runtime Deployments of the named activities (no garbage collector runs here: none go away). */
  const deploymentNames = async (...activities: string[]): Promise<string[]> =>
    (await a.apps.listNamespacedDeployment({ namespace: ns.namespace })).items
      .map((d) => d.metadata?.name ?? '')
      .filter((n) => activities.some((x) => n.startsWith(`${x}-`)))
      .sort();

  it(
    'a second resource naming a claimed activity id fails with ActivityIdInUse and leaves the first sale untouched',
    async () => {
      const id = uniqueId('claimed');
      const t0 = Date.now();
      await createActivity(
        a,
        activityBody(ns.namespace, 'owner', {
          warmUpAt: new Date(t0),
          startAt: new Date(t0 + 2_000),
          endAt: new Date(t0 + 30 * 60_000),
          items: [{ skuId: 'tea', name: '龙井 250g', price: '88.00', stock: 10, limitPerUser: 2 }],
          drainTimeout: '20s',
          extraSpec: { activityId: id },
        }),
      );
      const owner = await waitForPhase(a, ns.namespace, 'owner', Phase.Active, 90_000);
      const claim = await readClaim(pg, id);
      expect(claim).toMatchObject({
        ownerUid: owner.metadata.uid,
        ownerNamespace: ns.namespace,
        ownerName: 'owner',
      });
      const snapshot = async (): Promise<unknown> => ({
        meta: await readMeta(redis, id),
        definition: await readLoadedDefinition(redis, id),
        keys: await scanKeys(redis, `fs:{${id}}:*`),
        writeBack: (await readWriteBack(pg, id)) ?? null,
        claim: await readClaim(pg, id),
      });
      const before = await snapshot();
      expect(before).toMatchObject({ meta: { gate: 'open', generation: 1, loads: 1 }, writeBack: null });

      // Another resource (a tenant's) names the same id: other prices and stock, paused, and a
      // window that ends first: anything it did would show in the owner's gate, schedule or keys.
      const t1 = Date.now();
      await createActivity(
        a,
        activityBody(ns.namespace, 'intruder', {
          warmUpAt: new Date(t1),
          startAt: new Date(t1 + 1_000),
          endAt: new Date(t1 + 4_000),
          items: [{ skuId: 'tea', name: 'cheap', price: '0.01', stock: 1000, limitPerUser: 100 }],
          drainTimeout: '5s',
          extraSpec: { activityId: id, paused: true },
        }),
      );
      const intruder = await waitForPhase(
        a,
        ns.namespace,
        'intruder',
        [Phase.Failed, Phase.WarmingUp, Phase.Ready, Phase.Active, Phase.Draining, Phase.Completed],
        90_000,
      );
      expect(intruder.status?.phase).toBe(Phase.Failed);
      const failed = findCondition(intruder.status?.conditions, 'Succeeded');
      expect(failed).toMatchObject({ status: 'False', reason: 'ActivityIdInUse' });
      expect(failed?.message).toContain(`${ns.namespace}/owner (uid ${owner.metadata.uid})`);
      expect((await eventsOf(a, ns.namespace, 'intruder')).map((e) => e.reason)).toContain('Failed');
      // Never past Pending, no runtime of its own, no figures of the owner's sale.
      await recorder.sawPhase('intruder', Phase.Failed);
      expect(recorder.phases.get('intruder')?.filter((p) => p !== Phase.Pending)).toEqual([Phase.Failed]);
      expect(await deploymentNames('owner', 'intruder')).toEqual([
        'owner-api',
        'owner-consumer',
        'owner-relay',
      ]);
      expect(intruder.status?.stock).toBeUndefined();
      expect(await snapshot()).toEqual(before);

      // Deleting the intruder drains, writes back and cleans up nothing of the owner's.
      await remove('intruder');
      await gone('intruder');
      expect(await snapshot()).toEqual(before);
      expect((await getActivity(a, ns.namespace, 'owner'))?.status?.phase).toBe(Phase.Active);

      // The owner's own end: its write-back holds its own stock (10), not the intruder's (1000).
      await remove('owner');
      await gone('owner');
      expect(await readWriteBack(pg, id)).toMatchObject({ initialTotal: 10, remainingTotal: 10 });
      expect(await readStockRows(pg, id)).toEqual([{ skuId: 'tea', initial: 10, remaining: 10 }]);
      // The claim outlives the owner: the id is not free for someone else's data.
      expect(await readClaim(pg, id)).toMatchObject({ ownerUid: owner.metadata.uid });
    },
    TIMEOUT_MS,
  );

  it(
    'refuses a runtime image outside the allowed set, runs an allowed one, and gives each role only its Secret',
    async () => {
      const far = Date.now() + 60 * 60_000;
      const window = {
        warmUpAt: new Date(far),
        startAt: new Date(far + 60_000),
        endAt: new Date(far + 120_000),
      };
      const items = [{ skuId: 'a', name: 'A', price: '1.00', stock: 1 }];
      await createActivity(
        a,
        activityBody(ns.namespace, 'miner', {
          ...window,
          items,
          extraSpec: { runtime: { image: 'evil.example/miner:latest' } },
        }),
      );
      await createActivity(
        a,
        activityBody(ns.namespace, 'pinned', {
          ...window,
          items,
          extraSpec: { runtime: { image: ALLOWED_BY_DIGEST } },
        }),
      );
      const miner: FlashSaleActivity = await waitForPhase(a, ns.namespace, 'miner', Phase.Failed);
      const refused = findCondition(miner.status?.conditions, 'Succeeded');
      expect(refused).toMatchObject({ status: 'False', reason: 'ImageNotAllowed' });
      expect(refused?.message).toContain('evil.example/miner:latest');

      await waitFor('pinned runtime Deployments', async () => (await deploymentNames('pinned')).length === 3);
      expect(await deploymentNames('pinned', 'miner')).toEqual([
        'pinned-api',
        'pinned-consumer',
        'pinned-relay',
      ]);
      for (const role of RUNTIME_ROLES) {
        const d = await a.apps.readNamespacedDeployment({ name: `pinned-${role}`, namespace: ns.namespace });
        const pod = d.spec?.template.spec;
        expect(pod?.containers.map((c) => c.image)).toEqual([ALLOWED_BY_DIGEST]);
        // Every Secret the pod template can read: envFrom, env valueFrom and volumes.
        const secrets = new Set<string>();
        for (const c of [...(pod?.containers ?? []), ...(pod?.initContainers ?? [])]) {
          for (const f of c.envFrom ?? []) if (f.secretRef) secrets.add(f.secretRef.name ?? '');
          for (const e of c.env ?? [])
            if (e.valueFrom?.secretKeyRef) secrets.add(e.valueFrom.secretKeyRef.name ?? '');
        }
        for (const v of pod?.volumes ?? []) {
          if (v.secret) secrets.add(v.secret.secretName ?? '');
          for (const s of v.projected?.sources ?? []) if (s.secret) secrets.add(s.secret.name ?? '');
        }
        expect([...secrets]).toEqual([`flashsale-runtime-${role}`]);
      }
      // The refused resource got no runtime objects at all.
      const missing = await a.apps
        .readNamespacedDeployment({ name: 'miner-api', namespace: ns.namespace })
        .then(() => false)
        .catch((err: unknown) => isApiError(err, 404));
      expect(missing).toBe(true);
    },
    TIMEOUT_MS,
  );

  it(
    "loads a catalogRef from the resource's own namespace only",
    async () => {
      const catalog = uniqueId('shared-name');
      // Another tenant's catalog of the same name: never sold from this namespace.
      await upsertCatalogItems(pg, [
        {
          namespace: uniqueId('other-tenant'),
          catalog,
          skuId: 'gold',
          name: 'gold',
          price: '1.00',
          stock: 99,
          limitPerUser: 9,
        },
      ]);
      const t0 = Date.now();
      await createActivity(
        a,
        activityBody(ns.namespace, 'shop', {
          warmUpAt: new Date(t0),
          startAt: new Date(t0 + 60 * 60_000),
          endAt: new Date(t0 + 120 * 60_000),
          catalogRef: catalog,
        }),
      );
      const empty = await waitFor('catalog reported empty', async () => {
        const fsa = await getActivity(a, ns.namespace, 'shop');
        return findCondition(fsa?.status?.conditions, 'Degraded')?.reason === 'CatalogEmpty'
          ? fsa
          : undefined;
      });
      expect(empty.status?.phase).toBe(Phase.WarmingUp);
      const id = empty.status?.activityId ?? '';
      expect(await readLoadedDefinition(redis, id)).toBeUndefined();
      // A row the CRD would refuse inline (no name: the consumer would dead-letter every order of
      // it) holds the warm-up with a condition naming it; nothing is loaded.
      await upsertCatalogItems(pg, [
        {
          namespace: ns.namespace,
          catalog,
          skuId: 'tea',
          name: '',
          price: '5.00',
          stock: 3,
          limitPerUser: 1,
        },
      ]);
      const invalid = await waitFor('catalog reported invalid', async () => {
        const fsa = await getActivity(a, ns.namespace, 'shop');
        const c = findCondition(fsa?.status?.conditions, 'Degraded');
        return c?.reason === 'CatalogInvalid' ? { fsa, c } : undefined;
      });
      expect(invalid.c.message).toMatch(/sku tea: name must be 1 to 200 characters/);
      expect(invalid.fsa?.status?.phase).toBe(Phase.WarmingUp);
      expect(await readLoadedDefinition(redis, id)).toBeUndefined();
      // Its own namespace's catalog of that name, mended, is what it loads.
      await upsertCatalogItems(pg, [
        {
          namespace: ns.namespace,
          catalog,
          skuId: 'tea',
          name: '茶',
          price: '5.00',
          stock: 3,
          limitPerUser: 1,
        },
      ]);
      await waitForPhase(a, ns.namespace, 'shop', Phase.Ready, 60_000);
      expect((await readLoadedDefinition(redis, id))?.items.map((i) => [i.skuId, i.stock])).toEqual([
        ['tea', 3],
      ]);
    },
    TIMEOUT_MS,
  );

  it('refuses activity ids whose Kafka topics would collide with another id', async () => {
    const far = Date.now() + 60 * 60_000;
    const body = (name: string, activityId: string): Record<string, unknown> =>
      activityBody(ns.namespace, name, {
        warmUpAt: new Date(far),
        startAt: new Date(far + 60_000),
        endAt: new Date(far + 120_000),
        items: [{ skuId: 'a', name: 'A', price: '1.00', stock: 1 }],
        extraSpec: { activityId },
      });
    const refusal = (activityId: string): Promise<string> =>
      createActivity(a, body(uniqueId('bad-id'), activityId)).then(
        () => 'accepted',
        (err: unknown) => String((err as { body?: unknown }).body ?? err),
      );
    // '.' and '_' are one character to Kafka's topic names; '<id>.dlq' is the DLQ topic of <id>.
    expect(await refusal('sale_2030')).toMatch(/spec\.activityId/);
    expect(await refusal('sale-2030.dlq')).toMatch(/cannot end with \.dlq/);
    expect(await refusal('sale.2030')).toBe('accepted');
  });

  it(
    'reconciles in each watched namespace, and nowhere else',
    async () => {
      const far = Date.now() + 60 * 60_000;
      const body = (namespace: string): Record<string, unknown> =>
        activityBody(namespace, 'sale', {
          warmUpAt: new Date(far),
          startAt: new Date(far + 60_000),
          endAt: new Date(far + 120_000),
          items: [{ skuId: 'a', name: 'A', price: '1.00', stock: 1 }],
        });
      await createActivity(a, body(unwatched));
      await createActivity(a, body(second));
      const other = await waitForPhase(a, second, 'sale', Phase.Pending);
      expect(other.metadata.finalizers).toContain('flashsale.io/cleanup');
      await waitFor('runtime Deployments in the second namespace', async () => {
        const list = await a.apps.listNamespacedDeployment({ namespace: second });
        return list.items.length === 3;
      });
      // Created before the watched one, and still untouched: not watched, and no rights there.
      const ignored = await getActivity(a, unwatched, 'sale');
      expect(ignored?.status).toBeUndefined();
      expect(ignored?.metadata.finalizers ?? []).toEqual([]);
      await forceRemoveFinalizers(a, second);
    },
    TIMEOUT_MS,
  );
});
