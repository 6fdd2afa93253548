// Two operator replicas and two activities at once: the standby never reconciles; when the
// leader is SIGKILLed the standby takes the Lease over after it expires and finishes the work;
// a replica stopped with SIGTERM releases the Lease so the next one takes over at once. Neither
// activity touches the other's keys, rows or Deployments. Both sales are ended by deleting the
// activity (drain, write-back, cleanup, then the finalizer goes), so that no step depends on how
// fast this machine starts a process.
import { CoordinationV1Api } from '@kubernetes/client-node';
import type { Redis } from 'ioredis';
import { readMeta, readStock } from '../../../core/activity-cache.js';
import { countOrders } from '../../../core/db/orders-store.js';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows, readWriteBack } from '../../../core/db/stock-store.js';
import { activityKeys } from '../../../core/keys.js';
import { reserve } from '../../../core/reservations.js';
import { GROUP, PHASE_ORDER, PLURAL, Phase, VERSION } from '../../../operator/api/v1alpha1/types.js';
import { isApiError, uniqueId } from '../../../dev/servers.js';
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

describe('operator: two replicas, two activities', () => {
  const a = admin();
  let world: OperatorWorld | undefined;
  const idY = uniqueId('take-y');
  let db: FreshDatabase;
  let pg: Pool;
  let redis: Redis;
  let ns: OperatorNamespace;
  let runtimeY: RoleProcess | undefined;
  const operators: OperatorProcess[] = [];
  let recorder: Recorder;

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-take', topicsOf: [idY] });
    ({ db, pg, redis, ns, recorder } = world);
    const [runtime, opA] = await Promise.all([
      startRole('all', { activityId: idY, databaseUrl: db.url }),
      startOperator({
        ns,
        databaseUrl: db.url,
        identity: 'operator-a',
        env: { LEASE_DURATION_SECONDS: '15' },
      }),
    ]);
    runtimeY = runtime;
    operators.push(opA);
    operators.push(
      await startOperator({ ns, databaseUrl: db.url, identity: 'operator-b', waitFor: 'serving' }),
    );
  }, TIMEOUT_MS);

  afterAll(async () => {
    for (const op of operators) await op.kill('SIGKILL');
    await runtimeY?.stop();
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
  const leaseHolder = async (): Promise<string | undefined> => {
    const lease = await a.kc
      .makeApiClient(CoordinationV1Api)
      .readNamespacedLease({ name: 'flashsale-operator', namespace: ns.namespace });
    return lease.spec?.holderIdentity;
  };
  const transitions = (op: OperatorProcess): number =>
    op.records().filter((r) => typeof r.to === 'string').length;
  const becameLeader = (op: OperatorProcess): boolean => op.records().some((r) => r.msg === 'became leader');

  it(
    'hands the Lease over on SIGKILL and on SIGTERM and keeps the activities apart',
    async () => {
      const [opA, opB] = operators as [OperatorProcess, OperatorProcess];
      expect(await leaseHolder()).toBe('operator-a');
      const t0 = Date.now();
      const startAt = new Date(t0 + 6_000);
      const items = [
        { skuId: 'shared-sku', name: '同款商品', price: '10.00', stock: 7 },
        { skuId: 'only-here', name: '独有商品', price: '20.00', stock: 3 },
      ];
      await createActivity(
        a,
        activityBody(ns.namespace, 'x', {
          warmUpAt: new Date(t0),
          startAt,
          endAt: new Date(t0 + 3_600_000),
          items,
          drainTimeout: '3s',
        }),
      );
      await createActivity(
        a,
        activityBody(ns.namespace, 'y', {
          warmUpAt: new Date(t0),
          startAt,
          endAt: new Date(t0 + 3_600_000),
          items,
          drainTimeout: '3s',
          extraSpec: { activityId: idY },
        }),
      );
      const x = await waitForPhase(a, ns.namespace, 'x', Phase.Active, 60_000);
      await waitForPhase(a, ns.namespace, 'y', Phase.Active, 60_000);
      const idX = x.status?.activityId ?? '';
      expect(idX).toMatch(new RegExp(`^${ns.namespace}\\.x-[0-9a-f]{8}$`)); // the default id
      expect(idX).not.toBe(idY);

      // Buyers of Y only (the same sku ids exist in X).
      for (let i = 0; i < 5; i += 1) {
        await reserve(redis, {
          activityId: idY,
          userId: `buyer-${i}`,
          skuId: 'shared-sku',
          quantity: 1,
          requestId: `q${i}`,
          traceId: `t${i}`,
        });
      }

      // Each activity's Deployments belong to it and serve it (checked while both are live: the
      // garbage collector removes them with their activity).
      for (const [name, id] of [
        ['x', idX],
        ['y', idY],
      ] as const) {
        for (const role of ['api', 'relay', 'consumer']) {
          const d = await a.apps.readNamespacedDeployment({
            name: `${name}-${role}`,
            namespace: ns.namespace,
          });
          expect(d.metadata?.ownerReferences?.map((o) => o.name)).toEqual([name]);
          expect(d.metadata?.labels?.['flashsale.io/activity']).toBe(id);
          const env = d.spec?.template.spec?.containers[0]?.env?.find((e) => e.name === 'ACTIVITY_ID');
          expect(env?.value).toBe(id);
        }
      }

      // The standby has done nothing so far.
      expect(becameLeader(opB)).toBe(false);
      expect(transitions(opB)).toBe(0);
      expect(transitions(opA)).toBeGreaterThan(0);

      // SIGKILL the leader, and delete X meanwhile: B takes over once the Lease expires, then
      // drains, writes back and cleans up X and lets it go.
      expect((await opA.kill('SIGKILL')).signal).toBe('SIGKILL');
      await remove('x');
      await waitFor('operator-b to lead', async () => becameLeader(opB), 60_000);
      expect(await leaseHolder()).toBe('operator-b');
      await waitFor('x deleted', async () => !(await getActivity(a, ns.namespace, 'x')), 90_000);
      await recorder.sawDeleted('x');
      const xDone = recorder.statuses.get('x')?.findLast((f) => f.status?.phase === Phase.Completed);
      expect(transitions(opB)).toBeGreaterThan(0);

      // X is gone from Redis except its results; Y is live and untouched.
      const kx = activityKeys(idX);
      const ky = activityKeys(idY);
      expect(await scanKeys(redis, kx.scanPattern)).toEqual([]); // nobody bought from X: no results
      expect(await readMeta(redis, idY)).toMatchObject({ gate: 'open', loads: 1 });
      const yStock = await readStock(redis, idY);
      expect(yStock.skus).toEqual([
        { skuId: 'only-here', initial: 3, remaining: 3 },
        { skuId: 'shared-sku', initial: 7, remaining: 2 },
      ]);
      expect((await scanKeys(redis, ky.scanPattern)).length).toBeGreaterThan(5);
      expect(await readWriteBack(pg, idY)).toBeUndefined();
      expect(await readWriteBack(pg, idX)).toMatchObject({
        initialTotal: 10,
        remainingTotal: 10,
        reservedTotal: 0,
      });
      expect(await readStockRows(pg, idX)).toEqual([
        { skuId: 'only-here', initial: 3, remaining: 3 },
        { skuId: 'shared-sku', initial: 7, remaining: 7 },
      ]);
      expect(xDone?.status?.cache?.loads).toBe(1);
      const y = await a.apps.readNamespacedDeployment({ name: 'y-api', namespace: ns.namespace });
      expect(y.spec?.replicas).toBe(2);
      // X's runtime went with X (owner references, garbage collector), after being scaled to zero.
      await recorder.sawReplicas('x-relay', 0);
      await waitFor('x-relay garbage-collected', async () => {
        try {
          await a.apps.readNamespacedDeployment({ name: 'x-relay', namespace: ns.namespace });
          return false;
        } catch (err) {
          return isApiError(err, 404);
        }
      });

      // A standby comes back; SIGTERM on B releases the Lease, so A leads again without waiting
      // for it to expire.
      const opA2 = await startOperator({
        ns,
        databaseUrl: db.url,
        identity: 'operator-a',
        waitFor: 'serving',
      });
      operators.push(opA2);
      expect((await opB.kill('SIGTERM')).code).toBe(0);
      expect(opB.records().some((r) => r.msg === 'lease released')).toBe(true);
      await waitFor('operator-a to lead again', async () => becameLeader(opA2), 30_000);
      expect(await leaseHolder()).toBe('operator-a');

      await remove('y');
      await waitFor('y deleted', async () => !(await getActivity(a, ns.namespace, 'y')), 90_000);
      await recorder.sawDeleted('y');
      // Y was deleted with five unpaid orders: released from Settling; X had none: Completed.
      const yDone = recorder.statuses.get('y')?.findLast((f) => f.status?.phase === Phase.Settling);
      expect(recorder.phases.get('x')).toEqual(PHASE_ORDER);
      expect(recorder.phases.get('y')).toEqual(PHASE_ORDER.filter((p) => p !== Phase.Completed));
      expect(yDone?.status?.settlement).toMatchObject({ unpaid: 5, unsettled: 5 });
      expect(yDone?.status?.cache?.loads).toBe(1);
      expect(await readWriteBack(pg, idY)).toMatchObject({
        initialTotal: 10,
        remainingTotal: 5,
        reservedTotal: 5,
      });
      expect(await readStockRows(pg, idY)).toEqual([
        { skuId: 'only-here', initial: 3, remaining: 3 },
        { skuId: 'shared-sku', initial: 7, remaining: 2 },
      ]);
      expect((await countOrders(pg, idY)).orders).toBe(5);
      expect((await countOrders(pg, idX)).orders).toBe(0);
      expect(await scanKeys(redis, ky.scanPattern)).toEqual([ky.results]);

      for (const name of ['x', 'y']) {
        const reasons = (await eventsOf(a, ns.namespace, name)).map((e) => e.reason);
        expect(reasons.filter((r) => r === 'WroteBack')).toHaveLength(1);
      }
    },
    TIMEOUT_MS,
  );
});
