// Upgrade safety on the fuller control plane of test/env (kwok plays the kubelet): the runtime of
// a live sale keeps the pod template it was warmed up with when the operator is replaced by one
// with another configuration (a new RUNTIME_IMAGE, resources, role settings, pull secrets), as a
// `helm upgrade` does; the new operator only scales it. A sale that warms up afterwards gets the
// new configuration (docs/install.md, "Upgrades").
import type { V1Deployment } from '@kubernetes/client-node';
import { PolicyV1Api } from '@kubernetes/client-node';
import { Phase, RUNTIME_ROLES } from '../../../operator/api/v1alpha1/types.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import {
  activityBody,
  admin,
  createActivity,
  installCrd,
  prepareNamespace,
  rolePods,
  startOperator,
  waitFor,
  waitForPhase,
  waitForReadyPods,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess } from '../../../dev/operator-harness.js';

const TIMEOUT_MS = 240_000;
const OLD = {
  RUNTIME_IMAGE: 'registry.example/flashsale-runtime:1.0.0',
  RUNTIME_RESOURCES: '{"requests":{"cpu":"100m","memory":"128Mi"}}',
};
const NEW = {
  RUNTIME_IMAGE: 'registry.example/flashsale-runtime:2.0.0',
  RUNTIME_RESOURCES: '{"requests":{"cpu":"200m","memory":"256Mi"}}',
  RUNTIME_IMAGE_PULL_SECRETS: 'regcred',
  RUNTIME_EXTRA_ENV: '[{"name":"NODE_EXTRA_CA_CERTS","value":"/etc/flashsale/ca/ca.crt"}]',
  RUNTIME_ROLE_SETTINGS: JSON.stringify({
    api: {
      preStopSeconds: 5,
      topologySpreadConstraints: [
        { maxSkew: 1, topologyKey: 'kubernetes.io/hostname', whenUnsatisfiable: 'ScheduleAnyway' },
      ],
    },
    relay: { disruptionBudget: false },
  }),
};

describe('operator: a configuration change never re-rolls a live sale', () => {
  const a = admin();
  const policy = a.kc.makeApiClient(PolicyV1Api);
  let db: FreshDatabase;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;

  beforeAll(async () => {
    await installCrd(a);
    db = await freshDatabase();
    ns = await prepareNamespace(uniqueId('op-pin'), a);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await operator?.kill('SIGTERM');
    await db?.drop();
  }, TIMEOUT_MS);

  const read = (name: string): Promise<V1Deployment> =>
    a.apps.readNamespacedDeployment({ name, namespace: ns.namespace });
  const podNames = async (activity: string): Promise<string[]> =>
    (
      await a.core.listNamespacedPod({
        namespace: ns.namespace,
        labelSelector: `app.kubernetes.io/instance=${activity}`,
      })
    ).items
      .filter((p) => !p.metadata?.deletionTimestamp)
      .map((p) => p.metadata?.name ?? '')
      .sort();

  it(
    'keeps the Active runtime template through an operator restart with a new configuration; new sales get it',
    async () => {
      operator = await startOperator({ ns, databaseUrl: db.url, identity: 'operator-old', env: OLD });
      const t0 = Date.now();
      await createActivity(
        a,
        activityBody(ns.namespace, 'live', {
          warmUpAt: new Date(t0),
          startAt: new Date(t0 + 5_000),
          endAt: new Date(t0 + 30 * 60_000),
          items: [{ skuId: 'tea', name: '龙井 250g', price: '88.00', stock: 5 }],
          replicas: {
            warmUp: { api: 1, relay: 1, consumer: 1 },
            active: { api: 2, relay: 1, consumer: 1 },
            draining: { api: 0, relay: 1, consumer: 1 },
          },
        }),
      );
      await waitForPhase(a, ns.namespace, 'live', Phase.Active, 90_000);
      await waitForReadyPods(a, ns.namespace, 'live', 'api', 2);
      await waitForReadyPods(a, ns.namespace, 'live', 'relay', 1);
      const before = new Map<string, V1Deployment>();
      for (const role of RUNTIME_ROLES) {
        const d = await read(`live-${role}`);
        expect(d.spec?.template.spec?.containers[0]?.image).toBe(OLD.RUNTIME_IMAGE);
        before.set(role, d);
      }
      const podsBefore = await podNames('live');

      // The "helm upgrade": the old operator stops, one with a new configuration takes over.
      await operator.kill('SIGTERM');
      operator = await startOperator({ ns, databaseUrl: db.url, identity: 'operator-new', env: NEW });

      // The new operator acts on the live sale (it scales the api as the edited spec asks)...
      await a.custom.patchNamespacedCustomObject({
        group: 'flashsale.io',
        version: 'v1alpha1',
        namespace: ns.namespace,
        plural: 'flashsaleactivities',
        name: 'live',
        body: [{ op: 'replace', path: '/spec/runtime/replicas/active/api', value: 3 }],
      });
      await waitFor('api scaled to 3 by the new operator', async () => {
        const d = await read('live-api');
        return d.spec?.replicas === 3;
      });
      await waitForReadyPods(a, ns.namespace, 'live', 'api', 3);

      // ...without touching any pod template: same image, resources, everything.
      for (const role of RUNTIME_ROLES) {
        const was = before.get(role);
        const now = await read(`live-${role}`);
        expect([role, now.spec?.template]).toEqual([role, was?.spec?.template]);
        expect(now.spec?.template.spec?.containers[0]?.image).toBe(OLD.RUNTIME_IMAGE);
        // Only the api's replicas changed (one generation), the others not at all.
        const bump = role === 'api' ? 1 : 0;
        expect([role, now.metadata?.generation]).toEqual([role, (was?.metadata?.generation ?? 0) + bump]);
      }
      // No pod was replaced; the api only gained one.
      const podsAfter = await podNames('live');
      expect(podsBefore.every((p) => podsAfter.includes(p))).toBe(true);
      expect(podsAfter).toHaveLength(podsBefore.length + 1);
      expect((await rolePods(a, ns.namespace, 'live', 'relay')).total).toBe(1);

      // A sale created under the new configuration gets it (its Deployments exist from Pending).
      const later = Date.now() + 60 * 60_000;
      await createActivity(
        a,
        activityBody(ns.namespace, 'next', {
          warmUpAt: new Date(later),
          startAt: new Date(later + 60_000),
          endAt: new Date(later + 120_000),
          items: [{ skuId: 'tea', name: '龙井 250g', price: '88.00', stock: 5 }],
        }),
      );
      const next = await waitFor('next-api Deployment', async () => {
        try {
          return await read('next-api');
        } catch {
          return undefined;
        }
      });
      const pod = next.spec?.template.spec;
      expect(pod?.containers[0]?.image).toBe(NEW.RUNTIME_IMAGE);
      expect(pod?.containers[0]?.resources?.requests).toEqual({ cpu: '200m', memory: '256Mi' });
      expect(pod?.containers[0]?.lifecycle?.preStop?.sleep?.seconds).toBe(5);
      expect(pod?.imagePullSecrets).toEqual([{ name: 'regcred' }]);
      expect(pod?.topologySpreadConstraints?.[0]?.labelSelector?.matchLabels).toMatchObject({
        'app.kubernetes.io/instance': 'next',
        'app.kubernetes.io/component': 'api',
      });
      expect(pod?.containers[0]?.env?.at(-1)).toEqual({
        name: 'NODE_EXTRA_CA_CERTS',
        value: '/etc/flashsale/ca/ca.crt',
      });

      // Disruption budgets follow the configuration: the live sale's api and consumer have one
      // (the relay's was created by the old operator, whose settings asked for it).
      const budget = await waitFor('live-api budget at minAvailable 2', async () => {
        const pdb = await policy.readNamespacedPodDisruptionBudget({
          name: 'live-api',
          namespace: ns.namespace,
        });
        return pdb.spec?.minAvailable === 2 ? pdb : undefined;
      });
      expect(budget.metadata?.ownerReferences?.[0]).toMatchObject({
        kind: 'FlashSaleActivity',
        name: 'live',
      });
      const consumer = await policy.readNamespacedPodDisruptionBudget({
        name: 'live-consumer',
        namespace: ns.namespace,
      });
      expect(consumer.spec?.minAvailable).toBe(1);
      expect(operator.records().filter((r) => r.level === 50)).toEqual([]);
    },
    TIMEOUT_MS,
  );
});
