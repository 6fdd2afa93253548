// The operator drives one activity through its whole lifecycle on the real API server, with the
// runtime roles running as local processes and buyers reserving over HTTP: every phase in order,
// stock loaded once, orders created, stock written back once, keys cleaned, replicas per phase.
import { spawnSync } from 'node:child_process';
import type { Redis } from 'ioredis';
import { readMeta } from '../../../core/activity-cache.js';
import { readActivityItems } from '../../../core/db/activity-items-store.js';
import { countOrders } from '../../../core/db/orders-store.js';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows, readWriteBack } from '../../../core/db/stock-store.js';
import { activityKeys } from '../../../core/keys.js';
import { findCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { PHASE_ORDER, Phase } from '../../../operator/api/v1alpha1/types.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { httpClient, pool as inParallel, startRole, tokenFor } from '../../../dev/roles.js';
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
  waitForReadyPods,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess, Recorder } from '../../../dev/operator-harness.js';
import { operatorWorld } from './setup.js';
import type { OperatorWorld } from './setup.js';

const TIMEOUT_MS = 150_000;

describe('operator: the whole lifecycle of one activity', () => {
  const a = admin();
  let db: FreshDatabase;
  let pg: Pool;
  let redis: Redis;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;
  let runtime: RoleProcess | undefined;
  let recorder: Recorder;
  let world: OperatorWorld | undefined;
  const activityId = uniqueId('life');

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-life', topicsOf: [activityId] });
    ({ db, pg, redis, ns, recorder } = world);
    // The runtime roles as a local process (no kubelet here), serving this activity.
    [runtime, operator] = await Promise.all([
      // A short payment window: the sale's unpaid orders are closed (and the activity settled)
      // soon after the sale, by this process's sweeper.
      startRole('all', {
        activityId,
        databaseUrl: db.url,
        env: { PAYMENT_TIMEOUT_SECONDS: '15', PAYMENT_SWEEP_CRON: '*/1 * * * * *' },
      }),
      startOperator({ ns, databaseUrl: db.url }),
    ]);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await runtime?.stop();
    await operator?.kill('SIGTERM');
    await world?.close();
  }, TIMEOUT_MS);

  it(
    'passes Pending → WarmingUp → Ready → Active → Draining → WritingBack → CleaningUp → Settling → Completed',
    async () => {
      const name = 'double11';
      const t0 = Date.now();
      const warmUpAt = new Date(t0 + 8_000);
      const startAt = new Date(warmUpAt.getTime() + 10_000);
      const endAt = new Date(startAt.getTime() + 20_000);
      await createActivity(
        a,
        activityBody(ns.namespace, name, {
          warmUpAt,
          startAt,
          endAt,
          items: [
            {
              skuId: 'phone-256g',
              name: '旗舰手机 256G 曜石黑',
              price: '5999.00',
              stock: 12,
              limitPerUser: 1,
            },
            { skuId: 'tea-gift', name: '西湖龙井礼盒', price: '199.9', stock: 9, limitPerUser: 2 },
          ],
          extraSpec: { activityId, payment: { timeout: '15s' } },
          replicas: {
            warmUp: { api: 1, relay: 1, consumer: 1 },
            active: { api: 3, relay: 2, consumer: 2 },
            draining: { api: 0, relay: 1, consumer: 1 },
          },
        }),
      );

      // Pending, with the next look scheduled exactly at warm-up time (no polling).
      const pending = await waitFor('Pending with its next check', async () => {
        const fsa = await getActivity(a, ns.namespace, name);
        return fsa?.status?.phase === Phase.Pending && fsa.status.nextCheckAt ? fsa : undefined;
      });
      expect(pending.status?.activityId).toBe(activityId);
      expect(pending.status?.nextCheckAt).toBe(warmUpAt.toISOString());

      // Ready: topics exist, the cache is loaded once, the warm-up Pods run (kwok plays their
      // kubelet) and the gate is still shut.
      const ready = await waitForPhase(a, ns.namespace, name, [Phase.Ready, Phase.Active], 60_000);
      expect(findCondition(ready.status?.conditions, 'RuntimeReady')?.status).toBe('True');
      expect(ready.status?.cache?.loads).toBe(1);
      const metaReady = await readMeta(redis, activityId);
      expect(metaReady).toMatchObject({ loads: 1, generation: 1 });
      // The gate opens only at startAt: while the resource says Ready, Redis says pending.
      if (ready.status?.phase === Phase.Ready) expect(metaReady?.gate).toBe('pending');

      const active = await waitForPhase(a, ns.namespace, name, Phase.Active, 60_000);
      // The operator's own record of the transition, not the test's clock.
      expect(new Date(active.status?.timestamps?.active ?? 0).getTime()).toBeGreaterThanOrEqual(
        startAt.getTime(),
      );
      expect(findCondition(active.status?.conditions, 'Ready')).toMatchObject({
        status: 'True',
        reason: 'SaleOpen',
      });
      expect((await readMeta(redis, activityId))?.gate).toBe('open');
      await waitFor('active replicas', async () => {
        const r = await a.apps.readNamespacedDeployment({ name: `${name}-api`, namespace: ns.namespace });
        return r.spec?.replicas === 3;
      });
      // The Deployments rolled out to the active size: Pods scheduled, Running and Ready.
      await waitForReadyPods(a, ns.namespace, name, 'api', 3);
      await waitForReadyPods(a, ns.namespace, name, 'relay', 2);
      await waitForReadyPods(a, ns.namespace, name, 'consumer', 2);
      await waitFor('RuntimeReady at the active size', async () => {
        const fsa = await getActivity(a, ns.namespace, name);
        const c = findCondition(fsa?.status?.conditions, 'RuntimeReady');
        return c?.status === 'True' && c.message === 'available: api 3/3, relay 2/2, consumer 2/2';
      });

      // Buyers: more demand than stock.
      const http = httpClient(16);
      const url = `${runtime?.url ?? ''}/v1/activities/${activityId}/orders`;
      const phoneBuyers = Array.from({ length: 20 }, (_, i) => `p-buyer-${i}`);
      const teaBuyers = Array.from({ length: 6 }, (_, i) => `t-buyer-${i}`);
      const submit = async (user: string, skuId: string, quantity: number): Promise<number> => {
        const r = await http.post(url, { skuId, quantity, requestId: `${user}-1` }, await tokenFor(user));
        return r.status;
      };
      const statuses = await inParallel(8, [
        ...phoneBuyers.map((u) => () => submit(u, 'phone-256g', 1)),
        ...teaBuyers.map((u) => () => submit(u, 'tea-gift', 2)),
      ]);
      await http.close();
      expect(statuses.filter((s) => s === 202)).toHaveLength(12 + 4);
      expect(statuses.filter((s) => s !== 202).every((s) => s === 409)).toBe(true);

      const done = await waitForPhase(a, ns.namespace, name, Phase.Completed, 90_000);
      expect(new Date(done.status?.timestamps?.draining ?? 0).getTime()).toBeGreaterThanOrEqual(
        endAt.getTime(),
      );

      // Every phase, in order, as seen by a watch on the resource.
      await recorder.sawPhase(name, Phase.Completed);
      expect(recorder.phases.get(name)).toEqual(PHASE_ORDER);
      const ts = done.status?.timestamps ?? {};
      const times = [
        ts.pending,
        ts.warmingUp,
        ts.ready,
        ts.active,
        ts.draining,
        ts.writingBack,
        ts.cleaningUp,
        ts.settling,
        ts.completed,
      ];
      expect(times.every((t) => typeof t === 'string')).toBe(true);
      const ms = times.map((t) => new Date(t ?? 0).getTime());
      expect([...ms].sort((x, y) => x - y)).toEqual(ms);
      expect(ms[1]).toBeGreaterThanOrEqual(warmUpAt.getTime());
      expect(ms[3]).toBeGreaterThanOrEqual(startAt.getTime());
      expect(ms[4]).toBeGreaterThanOrEqual(endAt.getTime());

      // Deployments: 0 until warm-up, warm-up size, active size, draining size, then zero (applied
      // by the pass after the one that recorded Completed).
      await waitFor('runtime scaled to zero', async () => {
        const list = await a.apps.listNamespacedDeployment({ namespace: ns.namespace });
        return list.items.length === 3 && list.items.every((d) => d.spec?.replicas === 0);
      });
      for (const role of ['api', 'relay', 'consumer']) await recorder.sawReplicas(`${name}-${role}`, 0);
      expect(recorder.replicas.get(`${name}-api`)).toEqual([0, 1, 3, 0]);
      // Ready never without an available runtime: every status the watch saw in Ready says so.
      const readyStatuses = (recorder.statuses.get(name) ?? []).filter(
        (f) => f.status?.phase === Phase.Ready,
      );
      expect(readyStatuses.length).toBeGreaterThan(0);
      for (const f of readyStatuses) {
        expect(findCondition(f.status?.conditions, 'RuntimeReady')?.status).toBe('True');
      }
      // Scaled to zero, the Pods are gone too.
      for (const role of ['api', 'relay', 'consumer'] as const) {
        await waitForReadyPods(a, ns.namespace, name, role, 0);
      }
      expect(recorder.replicas.get(`${name}-relay`)).toEqual([0, 1, 2, 1, 0]);
      expect(recorder.replicas.get(`${name}-consumer`)).toEqual([0, 1, 2, 1, 0]);
      const dep = await a.apps.readNamespacedDeployment({
        name: `${name}-consumer`,
        namespace: ns.namespace,
      });
      expect(dep.metadata?.ownerReferences?.[0]).toMatchObject({
        kind: 'FlashSaleActivity',
        name,
        controller: true,
      });
      const env = Object.fromEntries(
        (dep.spec?.template.spec?.containers[0]?.env ?? []).map((e) => [e.name, e.value ?? '']),
      );
      expect(env).toMatchObject({ ACTIVITY_ID: activityId, PAYMENT_TIMEOUT_SECONDS: '15' });
      expect(dep.spec?.template.spec?.containers[0]?.envFrom?.[0]?.secretRef?.name).toBe(
        'flashsale-runtime-consumer',
      );
      expect(dep.spec?.template.spec?.containers[0]?.args).toEqual(['consumer']);
      const svc = await a.core.readNamespacedService({ name: `${name}-api`, namespace: ns.namespace });
      expect(svc.spec?.selector).toMatchObject({
        'app.kubernetes.io/instance': name,
        'app.kubernetes.io/component': 'api',
      });
      expect(svc.metadata?.ownerReferences?.[0]?.name).toBe(name);

      // The operator recorded the items the consumer checks every order against.
      const items = await readActivityItems(pg, activityId);
      expect([...items.values()].map((i) => `${i.skuId} ${i.price} ${i.limitPerUser}`).sort()).toEqual([
        expect.stringMatching(/^phone-256g 5999\.00 \d+$/),
        'tea-gift 199.90 2',
      ]);
      // Orders created, stock written back once, PostgreSQL is the truth now.
      const orders = await countOrders(pg, activityId);
      // 16 orders for 20 units, all closed unpaid by now (quantity counts live orders only).
      expect(orders).toMatchObject({ orders: 16, quantity: 0 });
      expect(orders.byStatus).toMatchObject({ CLOSED: 16, UNPAID: 0 });
      // Orders whose deadline passed during the sale gave their units back to Redis before the
      // freeze (in the snapshot); the others' went to PostgreSQL after it. Either way 20 were sold.
      const via = await pg.query<{ via: string; q: string }>(
        `SELECT stock_return_via AS via, sum(quantity)::text AS q FROM orders WHERE activity_id = $1 GROUP BY 1`,
        [activityId],
      );
      const returned = new Map(via.rows.map((r) => [r.via, Number(r.q)]));
      expect((returned.get('redis') ?? 0) + (returned.get('postgres') ?? 0)).toBe(20);
      const wb = await readWriteBack(pg, activityId);
      const snapshotRemaining = 1 + (returned.get('redis') ?? 0);
      expect(wb).toMatchObject({
        generation: 1,
        initialTotal: 21,
        remainingTotal: snapshotRemaining,
        reservedTotal: 20,
        ordersTotal: 16,
      });
      // Nobody paid: every order was closed at its deadline and its stock returned to PostgreSQL
      // before the activity could be Completed.
      expect(await readStockRows(pg, activityId)).toEqual([
        { skuId: 'phone-256g', initial: 12, remaining: 12 },
        { skuId: 'tea-gift', initial: 9, remaining: 9 },
      ]);
      expect(done.status?.stock).toMatchObject({ initial: 21, remaining: 21, reserved: 20, ordered: 16 });
      expect(done.status?.settlement).toMatchObject({
        unpaid: 0,
        closed: 16,
        closedUnsettled: 0,
        unsettled: 0,
      });
      expect(done.status?.backlog).toMatchObject({
        halfMessages: 0,
        unconfirmed: 0,
        orderGap: 0,
        consumerLag: 0,
        dlqDepth: 0,
        // The operator's own count, which FlashSaleDLQUnhandled falls back on after Completed.
        dlqUnhandled: 0,
      });
      expect(done.status?.cache?.loads).toBe(1);
      expect(done.status?.writeBack).toMatchObject({
        remaining: snapshotRemaining,
        orders: 16,
        generation: 1,
      });
      expect(findCondition(done.status?.conditions, 'Succeeded')).toMatchObject({
        status: 'True',
        reason: 'Completed',
      });
      expect(findCondition(done.status?.conditions, 'Degraded')).toMatchObject({ status: 'False' });
      expect(done.status?.observedGeneration).toBe(done.metadata.generation);

      // Only the buyers' results are left, with the retention TTL.
      const k = activityKeys(activityId);
      expect(await scanKeys(redis, k.scanPattern)).toEqual([k.results]);
      const ttl = await redis.ttl(k.results);
      expect(ttl).toBeGreaterThan(3000);
      expect(ttl).toBeLessThanOrEqual(3600);
      expect(await redis.hlen(k.results)).toBe(16);

      // Events: one per milestone, all Normal; one load, one write-back.
      const events = await eventsOf(a, ns.namespace, name);
      const reasons = events.map((e) => e.reason);
      for (const r of [
        'WarmUpStarted',
        'CacheLoaded',
        'SaleOpened',
        'DrainStarted',
        'Drained',
        'WroteBack',
        'CleanedUp',
        'Settled',
        'Completed',
      ]) {
        expect(reasons).toContain(r);
      }
      expect(reasons.filter((r) => r === 'WroteBack')).toHaveLength(1);
      expect(reasons.filter((r) => r === 'CacheLoaded')).toHaveLength(1);
      expect(events.filter((e) => e.type !== 'Normal')).toEqual([]);

      // kubectl shows the printer columns.
      // The test environment's kubectl (test/env/build-kube.sh), else the one on PATH: never skipped.
      const kubectl = testEnv().kubectl ?? 'kubectl';
      const out = spawnSync(kubectl, ['get', 'fsa', '-n', ns.namespace], {
        encoding: 'utf8',
        env: { ...process.env, KUBECONFIG: testEnv().kubeconfig },
      });
      expect(out.stdout.split('\n')[0]).toMatch(
        /NAME\s+PHASE\s+START\s+END\s+REMAINING\s+RUNTIME\s+ORDER-GAP\s+UNSETTLED\s+AGE\s+ID/,
      );
      expect(out.stdout).toMatch(
        new RegExp(
          `${name}\\s+Completed\\s+\\S+\\s+\\S+\\s+21\\s+False\\s+0\\s+0\\s+\\S+\\s+${activityId}\\s*$`,
          'm',
        ),
      );

      // The operator's own endpoints.
      const base = `http://127.0.0.1:${operator?.port ?? 0}`;
      expect((await fetch(`${base}/healthz`)).status).toBe(200);
      expect((await fetch(`${base}/readyz`)).status).toBe(200);
      const metrics = await (await fetch(`${base}/metrics`)).text();
      expect(metrics).toContain(
        // The activity id, as on the runtime's series, and the resource's name.
        `flashsale_activity_phase{activity="${activityId}",name="${name}",namespace="${ns.namespace}",phase="Completed",component="operator"} 1`,
      );
      expect(metrics).toMatch(
        /flashsale_reconcile_total\{result="(success|requeue)",component="operator"\} \d+/,
      );
      expect(metrics).toContain('flashsale_leader{component="operator"} 1');
    },
    TIMEOUT_MS,
  );
});
