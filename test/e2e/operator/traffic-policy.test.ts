// The operator carries an activity's traffic policy and deny list to Redis (docs/operator.md
// "Traffic shaping and eligibility"): spec over its defaults at warm-up, edits during the sale, the
// deny list from a ConfigMap (read under the operator's own RBAC), and a missing ConfigMap reported
// without readmitting anyone. The reservation script then refuses denied and unregistered buyers.
import { Redis } from 'ioredis';
import type { FlashSaleError } from '../../../core/errors.js';
import { activityKeys } from '../../../core/keys.js';
import { reserve } from '../../../core/reservations.js';
import { readTrafficPolicy, registerBuyer } from '../../../core/traffic-policy.js';
import { findCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { GROUP, PLURAL, Phase, VERSION } from '../../../operator/api/v1alpha1/types.js';
import { freshDatabase, isApiError, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import {
  activityBody,
  admin,
  createActivity,
  getActivity,
  installCrd,
  prepareNamespace,
  startOperator,
  waitFor,
  waitForPhase,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess } from '../../../dev/operator-harness.js';

const TIMEOUT_MS = 240_000;

describe('operator: traffic policy and deny list', () => {
  const a = admin();
  let db: FreshDatabase;
  let redis: Redis;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;

  beforeAll(async () => {
    await installCrd(a);
    db = await freshDatabase();
    redis = new Redis(testEnv().redisUrl);
    ns = await prepareNamespace(uniqueId('op-shape'), a);
    await a.core.createNamespacedConfigMap({
      namespace: ns.namespace,
      body: { metadata: { name: 'deny' }, data: { denied: '# seen on 11-11\nmallory\neve, trent\n' } },
    });
    operator = await startOperator({
      ns,
      databaseUrl: db.url,
      env: { TRAFFIC_PER_BUYER_REQUESTS: '7', ORDER_CODES_PER_BUYER_PER_SKU: '2' },
    });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await operator?.kill('SIGTERM');
    redis?.disconnect();
    await db?.drop();
  }, TIMEOUT_MS);

  const denied = async (id: string, user: string): Promise<boolean> =>
    (await redis.hexists(activityKeys(id).buyer(user), '~deny')) === 1;
  const refusal = async (id: string, user: string, requestId: string): Promise<string> => {
    try {
      await reserve(redis, {
        activityId: id,
        userId: user,
        skuId: 'tea',
        quantity: 1,
        requestId,
        traceId: 't',
      });
      return 'reserved';
    } catch (err) {
      return (err as FlashSaleError).code;
    }
  };

  it(
    'writes the policy and deny flags, follows ConfigMap and spec edits, keeps flags when the ConfigMap goes',
    async () => {
      const t0 = Date.now();
      await createActivity(
        a,
        activityBody(ns.namespace, 'shape', {
          warmUpAt: new Date(t0),
          startAt: new Date(t0 + 8_000),
          endAt: new Date(t0 + 10 * 60_000),
          items: [{ skuId: 'tea', name: '龙井', price: '398.00', stock: 5 }],
          extraSpec: {
            trafficShaping: { perAddress: { requests: 50, perSeconds: 5 } },
            eligibility: { preRegistration: true, denyListRef: { name: 'deny' } },
          },
        }),
      );
      const ready = await waitForPhase(a, ns.namespace, 'shape', Phase.Ready, 60_000);
      const id = ready.status?.activityId ?? '';
      // Spec over the operator's defaults (TRAFFIC_PER_BUYER_REQUESTS=7, codes 2).
      expect(await readTrafficPolicy(redis, id)).toEqual({
        shaping: {
          enabled: true,
          perBuyer: { requests: 7, perSeconds: 10 },
          perAddress: { requests: 50, perSeconds: 5 },
        },
        eligibility: { preRegistration: true, orderCodesPerBuyerPerSku: 2 },
      });
      expect(await redis.hget(activityKeys(id).meta, 'requireReg')).toBe('1');
      expect(await Promise.all(['mallory', 'eve', 'trent', 'alice'].map((u) => denied(id, u)))).toEqual([
        true,
        true,
        true,
        false,
      ]);
      // Registration is open before the start.
      expect(await registerBuyer(redis, id, 'alice')).toBe('registered');
      expect(await registerBuyer(redis, id, 'trent')).toBe('registered');

      await waitForPhase(a, ns.namespace, 'shape', Phase.Active, 60_000);
      expect(await refusal(id, 'bob', 'b1')).toBe('NOT_REGISTERED');
      expect(await refusal(id, 'trent', 't1')).toBe('BUYER_DENIED');
      expect(await refusal(id, 'alice', 'a1')).toBe('reserved');

      // The ConfigMap is edited: trent is readmitted (he registered in time), eve stays denied.
      await a.core.replaceNamespacedConfigMap({
        name: 'deny',
        namespace: ns.namespace,
        body: { metadata: { name: 'deny' }, data: { denied: 'eve\nmallory\n' } },
      });
      await waitFor('trent readmitted', async () => !(await denied(id, 'trent')), 60_000, 250);
      expect(await refusal(id, 'trent', 't2')).toBe('reserved');
      expect(await denied(id, 'eve')).toBe(true);

      // Limits may change during the sale; pre-registration may not.
      await a.custom.patchNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: ns.namespace,
        plural: PLURAL,
        name: 'shape',
        body: [{ op: 'add', path: '/spec/trafficShaping/perBuyer', value: { requests: 3, perSeconds: 1 } }],
      });
      await waitFor(
        'the new per-buyer limit in Redis',
        async () => (await readTrafficPolicy(redis, id))?.shaping.perBuyer.requests === 3,
        60_000,
        250,
      );
      const refused = await a.custom
        .patchNamespacedCustomObject({
          group: GROUP,
          version: VERSION,
          namespace: ns.namespace,
          plural: PLURAL,
          name: 'shape',
          body: [{ op: 'replace', path: '/spec/eligibility/preRegistration', value: false }],
        })
        .then(
          () => 'accepted',
          (err: unknown) =>
            isApiError(err, 422) ? String((err as { body?: unknown }).body) : `unexpected: ${String(err)}`,
        );
      expect(refused).toMatch(/preRegistration cannot change once the sale is Active/);

      // The ConfigMap disappears: reported, and nobody is readmitted by accident.
      await a.core.deleteNamespacedConfigMap({ name: 'deny', namespace: ns.namespace });
      const degraded = await waitFor(
        'Degraded/DenyListUnavailable',
        async () => {
          const fsa = await getActivity(a, ns.namespace, 'shape');
          const c = findCondition(fsa?.status?.conditions, 'Degraded');
          return c?.status === 'True' && c.reason === 'DenyListUnavailable' ? c : undefined;
        },
        60_000,
        250,
      );
      expect(degraded.message).toMatch(/deny list ConfigMap deny/);
      expect(await Promise.all(['eve', 'mallory'].map((u) => denied(id, u)))).toEqual([true, true]);
    },
    TIMEOUT_MS,
  );
});
