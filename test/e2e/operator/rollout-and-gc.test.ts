// The operator on the fuller control plane of test/env (kube-controller-manager, kube-scheduler,
// kwok): a runtime that cannot roll out holds the sale shut past startAt (RuntimeReady=False,
// Degraded=RuntimeNotReady, a StartDelayed Event, the RUNTIME printer column), the sale opens
// once it is available, the api gets its PodDisruptionBudget while Active, and deleting the
// activity removes the Deployments, ReplicaSets, Pods, Service and budget through owner
// references: the garbage collector deletes them, the operator (which may not) does not.
import { spawnSync } from 'node:child_process';
import { PolicyV1Api } from '@kubernetes/client-node';
import type { Redis } from 'ioredis';
import { readMeta } from '../../../core/activity-cache.js';
import { findCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { isApiError, testEnv } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import {
  SERVICE_ACCOUNT,
  activityBody,
  admin,
  canI,
  createActivity,
  eventsOf,
  getActivity,
  rolePods,
  startOperator,
  waitFor,
  waitForPhase,
  waitForReadyPods,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess } from '../../../dev/operator-harness.js';
import { operatorWorld } from './setup.js';
import type { OperatorWorld } from './setup.js';

const TIMEOUT_MS = 240_000;
const NAME = 'late';

describe('operator: rollout state and garbage collection on the fuller control plane', () => {
  const a = admin();
  let world: OperatorWorld | undefined;
  const policy = a.kc.makeApiClient(PolicyV1Api);
  let db: FreshDatabase;
  let redis: Redis;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-gc', record: false });
    ({ db, redis, ns } = world);
    operator = await startOperator({ ns, databaseUrl: db.url });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await operator?.kill('SIGTERM');
    await world?.close();
  }, TIMEOUT_MS);

  const selector = `app.kubernetes.io/instance=${NAME}`;
  const printerRow = (): string => {
    const kubectl = testEnv().kubectl;
    if (!kubectl) throw new Error('KUBECTL is not set (test/env/build-kube.sh builds it)');
    const out = spawnSync(kubectl, ['get', 'fsa', NAME, '-n', ns.namespace], {
      encoding: 'utf8',
      env: { ...process.env, KUBECONFIG: testEnv().kubeconfig },
    });
    return out.stdout;
  };

  it(
    'holds the gate while the runtime is unavailable, opens it once available, and garbage-collects on deletion',
    async () => {
      // Every container in the namespace asks for more CPU than the kwok node has: the Pods stay
      // Pending (unschedulable), so the Deployments never become available.
      await a.core.createNamespacedLimitRange({
        namespace: ns.namespace,
        body: {
          metadata: { name: 'too-big' },
          spec: { limits: [{ type: 'Container', defaultRequest: { cpu: '500' }, _default: { cpu: '500' } }] },
        },
      });
      const t0 = Date.now();
      const startAt = new Date(t0 + 6_000);
      await createActivity(
        a,
        activityBody(ns.namespace, NAME, {
          warmUpAt: new Date(t0),
          startAt,
          endAt: new Date(t0 + 20 * 60_000),
          items: [{ skuId: 'dumpling', name: '三全水饺 1kg', price: '25.80', stock: 5, limitPerUser: 1 }],
          replicas: {
            warmUp: { api: 2, relay: 1, consumer: 1 },
            active: { api: 3, relay: 1, consumer: 1 },
            draining: { api: 0, relay: 1, consumer: 1 },
          },
        }),
      );

      // startAt passes: still WarmingUp, the gate shut, and the reason visible everywhere.
      const delayed = await waitFor(
        'Degraded=RuntimeNotReady after startAt',
        async () => {
          const fsa = await getActivity(a, ns.namespace, NAME);
          const d = findCondition(fsa?.status?.conditions, 'Degraded');
          return d?.status === 'True' && d.reason === 'RuntimeNotReady' ? fsa : undefined;
        },
        60_000,
      );
      expect(delayed.status?.phase).toBe(Phase.WarmingUp);
      expect(findCondition(delayed.status?.conditions, 'RuntimeReady')).toMatchObject({
        status: 'False',
        reason: 'RuntimeUnavailable',
      });
      expect(findCondition(delayed.status?.conditions, 'Degraded')?.message).toMatch(
        /startAt .* passed with the runtime not available \(available: api 0\/2, relay 0\/1, consumer 0\/1\)/,
      );
      const id = delayed.status?.activityId ?? '';
      expect(await readMeta(redis, id)).toMatchObject({ gate: 'pending', loads: 1 });
      const warnings = (await eventsOf(a, ns.namespace, NAME)).filter((e) => e.type === 'Warning');
      expect(warnings.map((e) => e.reason)).toEqual(['StartDelayed']);
      expect(printerRow().split('\n')[1]).toMatch(
        new RegExp(`^${NAME}\\s+WarmingUp\\s+\\S+\\s+\\S+\\s+5\\s+False\\s`),
      );
      const pending = await rolePods(a, ns.namespace, NAME, 'api');
      expect(pending).toEqual({ total: 2, ready: 0 });

      // The capacity problem is fixed: the Pods are re-created, scheduled and become Ready, and
      // the sale opens at once (later than startAt, which is not moved).
      await a.core.deleteNamespacedLimitRange({ name: 'too-big', namespace: ns.namespace });
      await a.core.deleteCollectionNamespacedPod({ namespace: ns.namespace, labelSelector: selector });
      const active = await waitForPhase(a, ns.namespace, NAME, Phase.Active, 90_000);
      expect(new Date(active.status?.timestamps?.active ?? 0).getTime()).toBeGreaterThan(startAt.getTime());
      expect(active.spec.schedule.startAt).toBe(startAt.toISOString());
      expect((await readMeta(redis, id))?.gate).toBe('open');
      await waitForReadyPods(a, ns.namespace, NAME, 'api', 3);
      await waitForReadyPods(a, ns.namespace, NAME, 'relay', 1);
      await waitForReadyPods(a, ns.namespace, NAME, 'consumer', 1);
      // At the active size (the pass that opened the gate still judged the warm-up size).
      await waitFor('RuntimeReady at the active size and not Degraded', async () => {
        const fsa = await getActivity(a, ns.namespace, NAME);
        const c = fsa?.status?.conditions;
        return (
          findCondition(c, 'RuntimeReady')?.message === 'available: api 3/3, relay 1/1, consumer 1/1' &&
          findCondition(c, 'RuntimeReady')?.status === 'True' &&
          findCondition(c, 'Degraded')?.status === 'False'
        );
      });
      expect(printerRow().split('\n')[1]).toMatch(
        new RegExp(`^${NAME}\\s+Active\\s+\\S+\\s+\\S+\\s+5\\s+True\\s`),
      );

      // The api's disruption budget while Active, counted by the disruption controller.
      const budget = await waitFor('api PodDisruptionBudget observed', async () => {
        const pdb = await policy.readNamespacedPodDisruptionBudget({
          name: `${NAME}-api`,
          namespace: ns.namespace,
        });
        return pdb.status?.expectedPods === 3 ? pdb : undefined;
      });
      expect(budget.spec?.minAvailable).toBe(2);
      expect(budget.status?.disruptionsAllowed).toBe(1);
      expect(budget.metadata?.ownerReferences?.[0]).toMatchObject({ kind: 'FlashSaleActivity', name: NAME });

      // The operator may not delete any runtime object: only the garbage collector can.
      const operatorAccount = { user: `system:serviceaccount:${ns.namespace}:${SERVICE_ACCOUNT}` };
      for (const [group, resource] of [
        ['apps', 'deployments'],
        ['apps', 'replicasets'],
        ['', 'pods'],
        ['', 'services'],
        ['policy', 'poddisruptionbudgets'],
      ] as const) {
        const allowed = await canI(a, operatorAccount, ['delete', group, resource], ns.namespace);
        expect([resource, allowed]).toEqual([resource, false]);
      }
      const replicaSets = await a.apps.listNamespacedReplicaSet({
        namespace: ns.namespace,
        labelSelector: selector,
      });
      expect(replicaSets.items.length).toBeGreaterThanOrEqual(3);

      // Deleting the live activity: drained, written back, cleaned up, finalizer removed; then the
      // garbage collector follows the owner references down to the Pods.
      await a.custom.deleteNamespacedCustomObject({
        group: 'flashsale.io',
        version: 'v1alpha1',
        namespace: ns.namespace,
        plural: 'flashsaleactivities',
        name: NAME,
      });
      await waitFor(
        'activity gone',
        async () => (await getActivity(a, ns.namespace, NAME)) === undefined,
        90_000,
      );
      await waitFor(
        'runtime objects garbage-collected',
        async () => {
          const [deployments, rs, pods, services] = await Promise.all([
            a.apps.listNamespacedDeployment({ namespace: ns.namespace, labelSelector: selector }),
            a.apps.listNamespacedReplicaSet({ namespace: ns.namespace, labelSelector: selector }),
            a.core.listNamespacedPod({ namespace: ns.namespace, labelSelector: selector }),
            a.core.listNamespacedService({ namespace: ns.namespace, labelSelector: selector }),
          ]);
          let budgetGone = false;
          try {
            await policy.readNamespacedPodDisruptionBudget({ name: `${NAME}-api`, namespace: ns.namespace });
          } catch (err) {
            budgetGone = isApiError(err, 404);
          }
          return (
            budgetGone &&
            deployments.items.length + rs.items.length + pods.items.length + services.items.length === 0
          );
        },
        120_000,
      );
      expect(operator?.records().filter((r) => r.level === 50)).toEqual([]);
    },
    TIMEOUT_MS,
  );
});
