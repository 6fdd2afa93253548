// The CRD's OpenAPI schema and CEL rules on the real API server: defaults, invalid specs refused
// with clear messages, edits refused once the sale is Ready or Active, and the operator's RBAC boundary.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import { GROUP, PLURAL, VERSION } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import { isApiError, uniqueId } from '../../../dev/servers.js';
import {
  ROOT,
  SERVICE_ACCOUNT,
  admin,
  canI,
  installCrd,
  prepareNamespace,
} from '../../../dev/operator-harness.js';
import type { Access, Subject } from '../../../dev/operator-harness.js';

const TIMEOUT_MS = 60_000;

type Spec = Record<string, unknown>;

function valid(): Spec {
  return {
    schedule: {
      warmUpAt: '2031-01-01T09:50:00Z',
      startAt: '2031-01-01T10:00:00Z',
      endAt: '2031-01-01T11:00:00Z',
    },
    items: [
      { skuId: 'phone', name: '手机', price: '1999.00', stock: 10 },
      { skuId: 'case', name: '手机壳', price: '29.9', stock: 100, limitPerUser: 3 },
    ],
  };
}

describe('FlashSaleActivity CRD on the API server', () => {
  const a = admin();
  const namespace = uniqueId('op-crd');

  const body = (name: string, spec: Spec): Record<string, unknown> => ({
    apiVersion: `${GROUP}/${VERSION}`,
    kind: 'FlashSaleActivity',
    metadata: { name, namespace },
    spec,
  });
  const create = async (name: string, spec: Spec): Promise<FlashSaleActivity> =>
    (await a.custom.createNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace,
      plural: PLURAL,
      body: body(name, spec),
    })) as FlashSaleActivity;
  /** The API server's message for a refused object, or undefined when it was accepted. */
  const refusal = async (call: Promise<unknown>): Promise<string | undefined> => {
    try {
      await call;
      return undefined;
    } catch (err) {
      if (!isApiError(err, 422)) throw err;
      return JSON.parse(String(err.body)).message as string;
    }
  };
  const patch = (name: string, ops: unknown[]): Promise<unknown> =>
    a.custom.patchNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace,
      plural: PLURAL,
      name,
      body: ops,
    });
  const setPhase = (name: string, phase: string): Promise<unknown> =>
    a.custom.patchNamespacedCustomObjectStatus({
      group: GROUP,
      version: VERSION,
      namespace,
      plural: PLURAL,
      name,
      body: [{ op: 'add', path: '/status', value: { phase } }],
    });

  beforeAll(async () => {
    await installCrd(a);
    await prepareNamespace(namespace, a);
  }, TIMEOUT_MS);

  it(
    'applies the defaults to a minimal activity',
    async () => {
      const fsa = await create('defaults', valid());
      expect(fsa.spec).toMatchObject({
        requireOrderCode: false,
        reopenOnRelease: true,
        paused: false,
        payment: { timeout: '15m' },
        drain: { timeout: '5m' },
        cleanup: { policy: 'Delete', resultRetention: '24h' },
        runtime: {
          replicas: {
            warmUp: { api: 1, relay: 1, consumer: 1 },
            active: { api: 2, relay: 1, consumer: 1 },
            draining: { api: 1, relay: 1, consumer: 1 },
          },
        },
      });
      expect(fsa.spec.items?.[0]?.limitPerUser).toBe(1);
      expect(fsa.spec.items?.[1]?.limitPerUser).toBe(3);
      expect(fsa.spec.items?.[0]?.name).toBe('手机');
    },
    TIMEOUT_MS,
  );

  it(
    'accepts the example in examples/activity.yaml (server-side dry run)',
    async () => {
      const example = parse(readFileSync(join(ROOT, 'examples', 'activity.yaml'), 'utf8')) as Record<
        string,
        unknown
      >;
      const metadata = { ...(example.metadata as Record<string, unknown>), namespace };
      await expect(
        a.custom.createNamespacedCustomObject({
          group: GROUP,
          version: VERSION,
          namespace,
          plural: PLURAL,
          body: { ...example, metadata },
          dryRun: 'All',
          fieldValidation: 'Strict',
        }),
      ).resolves.toBeDefined();
    },
    TIMEOUT_MS,
  );

  const schedule = (s: Record<string, string>): Spec => ({ ...valid(), schedule: s });
  const items = (list: unknown[]): Spec => ({ ...valid(), items: list });
  const item = (over: Record<string, unknown>): Spec =>
    items([{ skuId: 'x', name: 'x', price: '1.00', stock: 1, ...over }]);
  const invalid: [string, Spec, RegExp][] = [
    [
      'start after end',
      schedule({ startAt: '2031-01-01T12:00:00Z', endAt: '2031-01-01T11:00:00Z' }),
      /schedule\.startAt must be before schedule\.endAt/,
    ],
    [
      'start equal to end',
      schedule({ startAt: '2031-01-01T11:00:00Z', endAt: '2031-01-01T11:00:00Z' }),
      /schedule\.startAt must be before schedule\.endAt/,
    ],
    [
      'warm-up after start',
      schedule({
        warmUpAt: '2031-01-01T10:30:00Z',
        startAt: '2031-01-01T10:00:00Z',
        endAt: '2031-01-01T11:00:00Z',
      }),
      /schedule\.warmUpAt must be before schedule\.startAt/,
    ],
    [
      'warm-up instant and lead',
      schedule({
        warmUpAt: '2031-01-01T09:00:00Z',
        warmUpLead: '10m',
        startAt: '2031-01-01T10:00:00Z',
        endAt: '2031-01-01T11:00:00Z',
      }),
      /set schedule\.warmUpAt or schedule\.warmUpLead, not both/,
    ],
    [
      'malformed warm-up lead',
      schedule({ warmUpLead: 'ten minutes', startAt: '2031-01-01T10:00:00Z', endAt: '2031-01-01T11:00:00Z' }),
      /spec\.schedule\.warmUpLead.*should match/,
    ],
    ['no end', schedule({ startAt: '2031-01-01T10:00:00Z' }), /spec\.schedule\.endAt: Required value/],
    ['zero stock', item({ stock: 0 }), /spec\.items\[0\]\.stock.*greater than or equal to 1/],
    ['negative stock', item({ stock: -5 }), /spec\.items\[0\]\.stock.*greater than or equal to 1/],
    [
      'duplicate sku ids',
      items([
        { skuId: 'dup', name: 'a', price: '1', stock: 1 },
        { skuId: 'dup', name: 'b', price: '2', stock: 2 },
      ]),
      /spec\.items\[1\]: Duplicate value: .*"skuId":"dup"/,
    ],
    ['unsafe sku id', item({ skuId: 'a:b*' }), /spec\.items\[0\]\.skuId.*should match/],
    ['price as a float with 3 decimals', item({ price: '19.999' }), /spec\.items\[0\]\.price.*should match/],
    ['negative price', item({ price: '-1.00' }), /spec\.items\[0\]\.price.*should match/],
    ['price as a number', item({ price: 19.9 }), /spec\.items\[0\]\.price.*must be of type string/],
    ['limit 0', item({ limitPerUser: 0 }), /spec\.items\[0\]\.limitPerUser.*greater than or equal to 1/],
    ['no items at all', { schedule: valid().schedule }, /set exactly one of spec\.items or spec\.catalogRef/],
    [
      'items and catalogRef',
      { ...valid(), catalogRef: { name: 'spring' } },
      /set exactly one of spec\.items or spec\.catalogRef/,
    ],
    ['empty item list', items([]), /spec\.items.*should have at least 1 items/],
    [
      'negative replicas',
      { ...valid(), runtime: { replicas: { active: { api: -1 } } } },
      /spec\.runtime\.replicas\.active\.api.*greater than or equal to 0/,
    ],
    [
      'warm-up without an api (the sale would never open, or open with no api)',
      { ...valid(), runtime: { replicas: { warmUp: { api: 0 } } } },
      /warmUp needs at least one api, one relay and one consumer/,
    ],
    [
      'warm-up without any runtime',
      { ...valid(), runtime: { replicas: { warmUp: { api: 0, relay: 0, consumer: 0 } } } },
      /warmUp needs at least one api, one relay and one consumer/,
    ],
    [
      'draining without a consumer',
      { ...valid(), runtime: { replicas: { draining: { consumer: 0 } } } },
      /draining needs at least one relay and one consumer/,
    ],
    [
      'payment timeout too short',
      { ...valid(), payment: { timeout: '1s' } },
      /payment\.timeout must be between 10s and 24h/,
    ],
    [
      'unknown cleanup policy',
      { ...valid(), cleanup: { policy: 'Shred' } },
      /spec\.cleanup\.policy.*Unsupported value: "Shred"/,
    ],
    ['unsafe activity id', { ...valid(), activityId: 'a/b' }, /spec\.activityId.*should match/],
    [
      'deny list in another namespace (the API server would read a subresource)',
      { ...valid(), eligibility: { denyListRef: { name: 'ops/deny' } } },
      /spec\.eligibility\.denyListRef\.name.*should match/,
    ],
    [
      'deny list key no ConfigMap can hold',
      { ...valid(), eligibility: { denyListRef: { name: 'deny', key: 'a b' } } },
      /spec\.eligibility\.denyListRef\.key.*should match/,
    ],
  ];

  it(
    `refuses ${invalid.length} invalid specs, each with a message naming the problem`,
    async () => {
      const results: [string, string | undefined][] = [];
      for (const [what, spec] of invalid) {
        results.push([what, await refusal(create(uniqueId('bad'), spec))]);
      }
      invalid.forEach(([what, , message], i) => {
        const [, got] = results[i] ?? [];
        expect({ what, got }).toEqual({ what, got: expect.stringMatching(message) });
      });
    },
    TIMEOUT_MS,
  );

  it(
    'refuses a name too long for the runtime objects',
    async () => {
      const message = await refusal(create(`a${'b'.repeat(55)}`, valid()));
      expect(message).toMatch(/metadata\.name must be at most 50 characters/);
    },
    TIMEOUT_MS,
  );

  it(
    'refuses a name the runtime Service cannot take (a leading digit, a dot), which the API server accepts for the resource itself',
    async () => {
      for (const name of [`1111-${uniqueId('sale')}`, `${uniqueId('sale')}.v2`]) {
        const message = await refusal(create(name, valid()));
        expect({ name, message }).toEqual({
          name,
          message: expect.stringMatching(
            /metadata\.name must start with a lowercase letter .*DNS-1035 label/,
          ),
        });
      }
    },
    TIMEOUT_MS,
  );

  it(
    'lets stock only grow and keeps activityId immutable',
    async () => {
      await create('grow', { ...valid(), activityId: 'grow-1' });
      expect(
        await refusal(patch('grow', [{ op: 'replace', path: '/spec/items/0/stock', value: 9 }])),
      ).toMatch(/spec\.items\[0\]\.stock: .*stock can only grow/);
      expect(
        await refusal(patch('grow', [{ op: 'replace', path: '/spec/items/0/stock', value: 11 }])),
      ).toBeUndefined();
      expect(
        await refusal(patch('grow', [{ op: 'replace', path: '/spec/activityId', value: 'grow-2' }])),
      ).toMatch(/spec\.activityId is immutable/);
      expect(await refusal(patch('grow', [{ op: 'remove', path: '/spec/activityId' }]))).toMatch(
        /spec\.activityId cannot be added or removed/,
      );
    },
    TIMEOUT_MS,
  );

  it(
    'refuses impossible stock buckets: 0, more than the units, a change once warm-up began',
    async () => {
      const withBuckets = (n: number): Spec => {
        const s = valid();
        s.items = [{ skuId: 'phone', name: '手机', price: '1999.00', stock: 10, buckets: n }];
        return s;
      };
      expect(await refusal(create('bkt-zero', withBuckets(0)))).toMatch(
        /spec\.items\[0\]\.buckets: .*buckets must be at least 1/,
      );
      expect(await refusal(create('bkt-many', withBuckets(11)))).toMatch(
        /spec\.items\[0\]\.buckets: .*buckets cannot exceed stock/,
      );
      await create('bkt', withBuckets(8));
      // Before warm-up the split can still change; from warm-up on (Active included) it cannot.
      expect(
        await refusal(patch('bkt', [{ op: 'replace', path: '/spec/items/0/buckets', value: 4 }])),
      ).toBeUndefined();
      await setPhase('bkt', 'Active');
      expect(
        await refusal(patch('bkt', [{ op: 'replace', path: '/spec/items/0/buckets', value: 8 }])),
      ).toMatch(/spec\.items: .*buckets cannot change once warm-up has begun/);
      expect(
        await refusal(patch('bkt', [{ op: 'replace', path: '/spec/items/0/stock', value: 12 }])),
      ).toBeUndefined();
    },
    TIMEOUT_MS,
  );

  it(
    'refuses impossible automatic bucketing with a clear message, and lets a live sale edit it',
    async () => {
      const withBucketing = (bucketing: Record<string, number>): Spec => ({ ...valid(), bucketing });
      const cases: [Record<string, number>, RegExp][] = [
        [{ stockThreshold: 1 }, /spec\.bucketing\.stockThreshold: .*must be 0 \(never split\) or at least 2/],
        [{ stockThreshold: -1 }, /spec\.bucketing\.stockThreshold/],
        [{ buckets: 1 }, /spec\.bucketing\.buckets: .*must be at least 2/],
        [{ buckets: 65 }, /spec\.bucketing\.buckets/],
        [{ stockThreshold: 4, buckets: 8 }, /buckets cannot exceed bucketing\.stockThreshold/],
      ];
      for (const [i, [bucketing, message]] of cases.entries()) {
        expect(await refusal(create(`auto-bad-${i}`, withBucketing(bucketing)))).toMatch(message);
      }
      await create('auto', withBucketing({ stockThreshold: 0, buckets: 8 }));
      await create('auto-on', withBucketing({ stockThreshold: 10_000, buckets: 8 }));
      // A SKU's count is fixed when it is loaded, so the setting may change while Active: it
      // applies only to SKUs loaded after the edit (test/e2e/operator/buckets.test.ts).
      await setPhase('auto-on', 'Active');
      expect(
        await refusal(
          patch('auto-on', [{ op: 'replace', path: '/spec/bucketing/stockThreshold', value: 50 }]),
        ),
      ).toBeUndefined();
    },
    TIMEOUT_MS,
  );

  it(
    'refuses removing an item once warm-up has begun (it is loaded in Redis), allows it while Pending',
    async () => {
      const three = valid();
      (three.items as unknown[]).push({ skuId: 'cable', name: '数据线', price: '19.9', stock: 50 });
      await create('rm', three);
      expect(await refusal(patch('rm', [{ op: 'remove', path: '/spec/items/2' }]))).toBeUndefined();
      for (const phase of ['WarmingUp', 'Ready']) {
        await setPhase('rm', phase);
        expect({
          phase,
          refused: await refusal(patch('rm', [{ op: 'remove', path: '/spec/items/1' }])),
        }).toEqual({
          phase,
          refused: expect.stringMatching(/spec\.items: .*items cannot be removed once warm-up has begun/),
        });
      }
      // Adding one stays possible.
      expect(
        await refusal(
          patch('rm', [
            {
              op: 'add',
              path: '/spec/items/-',
              value: { skuId: 'cable', name: '数据线', price: '19.9', stock: 5 },
            },
          ]),
        ),
      ).toBeUndefined();
    },
    TIMEOUT_MS,
  );

  it(
    "lets an edit the operator refused (it raced the gate's opening) be undone while Active; refused again once accepted",
    async () => {
      await create('race', valid());
      // Admitted in Ready at 1999.00 -> 1899.00, while the gate had just opened: the operator
      // refused it (SpecAccepted False) and Redis sells at 1999.00.
      const spec = (accepted: 'True' | 'False') =>
        a.custom.patchNamespacedCustomObjectStatus({
          group: GROUP,
          version: VERSION,
          namespace,
          plural: PLURAL,
          name: 'race',
          body: [
            {
              op: 'add',
              path: '/status',
              value: {
                phase: 'Active',
                conditions: [
                  {
                    type: 'SpecAccepted',
                    status: accepted,
                    reason: accepted === 'True' ? 'SpecAccepted' : 'SpecChangeRefused',
                    message: accepted === 'True' ? 'accepted' : 'sku phone: price 1999.00 -> 1899.00',
                    lastTransitionTime: new Date().toISOString(),
                  },
                ],
              },
            },
          ],
        });
      expect(
        await refusal(patch('race', [{ op: 'replace', path: '/spec/items/0/price', value: '1899.00' }])),
      ).toBeUndefined();
      await spec('False');
      // The undo, and a startAt or a settings edit of the same refused kind, are admitted.
      for (const ops of [
        [{ op: 'replace', path: '/spec/items/0/price', value: '1999.00' }],
        [{ op: 'replace', path: '/spec/schedule/startAt', value: '2031-01-01T09:59:00Z' }],
        [{ op: 'replace', path: '/spec/requireOrderCode', value: true }],
      ])
        expect({ ops, refused: await refusal(patch('race', ops)) }).toEqual({ ops, refused: undefined });
      // Once the operator accepted the spec, the Active rules hold again.
      await spec('True');
      expect(
        await refusal(patch('race', [{ op: 'replace', path: '/spec/items/0/price', value: '1.00' }])),
      ).toMatch(/price, name and limitPerUser cannot change/);
    },
    TIMEOUT_MS,
  );

  it(
    'allows only safe edits once the sale is Active, and none once it has ended',
    async () => {
      await create('live', valid());
      // Before the sale: anything goes (within the rules above).
      expect(
        await refusal(patch('live', [{ op: 'replace', path: '/spec/items/0/price', value: '1899.00' }])),
      ).toBeUndefined();
      await setPhase('live', 'Active');
      const refusedWhileActive: [unknown[], RegExp][] = [
        [
          [{ op: 'replace', path: '/spec/schedule/startAt', value: '2031-01-01T09:59:00Z' }],
          /startAt cannot change once the sale is Active/,
        ],
        [
          [{ op: 'replace', path: '/spec/schedule/endAt', value: '2031-01-01T10:30:00Z' }],
          /endAt can only be extended while the sale is Active/,
        ],
        [
          [{ op: 'replace', path: '/spec/items/0/price', value: '1.00' }],
          /price, name and limitPerUser cannot change/,
        ],
        [[{ op: 'replace', path: '/spec/items/1/limitPerUser', value: 5 }], /price, name and limitPerUser/],
        [[{ op: 'remove', path: '/spec/items/1' }], /items cannot be removed/],
        [
          [{ op: 'replace', path: '/spec/requireOrderCode', value: true }],
          /requireOrderCode and spec\.reopenOnRelease/,
        ],
      ];
      for (const [ops, message] of refusedWhileActive) {
        expect(await refusal(patch('live', ops))).toMatch(message);
      }
      // Safe while Active: extend the sale, add stock, add an item, pause, resize the runtime.
      for (const ops of [
        [{ op: 'replace', path: '/spec/schedule/endAt', value: '2031-01-01T12:00:00Z' }],
        [{ op: 'replace', path: '/spec/items/0/stock', value: 20 }],
        [
          {
            op: 'add',
            path: '/spec/items/-',
            value: { skuId: 'charger', name: '充电器', price: '99', stock: 5 },
          },
        ],
        [{ op: 'replace', path: '/spec/paused', value: true }],
        [{ op: 'replace', path: '/spec/runtime/replicas/active/api', value: 6 }],
      ]) {
        expect(await refusal(patch('live', ops))).toBeUndefined();
      }
      await setPhase('live', 'Draining');
      expect(
        await refusal(
          patch('live', [{ op: 'replace', path: '/spec/schedule/endAt', value: '2031-01-01T13:00:00Z' }]),
        ),
      ).toMatch(/the sale has ended; spec\.schedule and spec\.items cannot change/);
      expect(
        await refusal(patch('live', [{ op: 'replace', path: '/spec/items/0/stock', value: 30 }])),
      ).toMatch(/the sale has ended/);
      // Runtime sizes stay adjustable while draining.
      expect(
        await refusal(
          patch('live', [{ op: 'replace', path: '/spec/runtime/replicas/draining/consumer', value: 3 }]),
        ),
      ).toBeUndefined();
    },
    TIMEOUT_MS,
  );

  it(
    'refuses edits of the pinned runtime template (image, payment timeout) from Ready on, allows them before',
    async () => {
      const image = (value: string): unknown[] => [{ op: 'add', path: '/spec/runtime/image', value }];
      const timeout = (value: string): unknown[] => [{ op: 'replace', path: '/spec/payment/timeout', value }];
      const imageRefused = /spec\.runtime: .*spec\.runtime\.image cannot change once the sale is Ready/;
      const timeoutRefused = /spec\.payment: .*spec\.payment\.timeout cannot change once the sale is Ready/;
      await create('pin', valid());
      // Pending and WarmingUp: the operator still (re)applies the pod template.
      for (const phase of [undefined, 'Pending', 'WarmingUp']) {
        if (phase) await setPhase('pin', phase);
        expect([phase, await refusal(patch('pin', image(`registry.example/rt:${phase ?? 'new'}`)))]).toEqual([
          phase,
          undefined,
        ]);
        expect([phase, await refusal(patch('pin', timeout(phase === 'WarmingUp' ? '20m' : '10m')))]).toEqual([
          phase,
          undefined,
        ]);
      }
      // From Ready on the template is pinned: every change is refused, setting or removing the image included.
      for (const phase of ['Ready', 'Active', 'Draining', 'Settling', 'Completed', 'Failed']) {
        await setPhase('pin', phase);
        expect([phase, await refusal(patch('pin', image('registry.example/rt:other')))]).toEqual([
          phase,
          expect.stringMatching(imageRefused),
        ]);
        expect([phase, await refusal(patch('pin', timeout('30m')))]).toEqual([
          phase,
          expect.stringMatching(timeoutRefused),
        ]);
      }
      expect(await refusal(patch('pin', [{ op: 'remove', path: '/spec/runtime/image' }]))).toMatch(
        imageRefused,
      );
      // Unchanged values and the other runtime settings stay editable (replicas are still applied).
      await setPhase('pin', 'Active');
      expect(
        await refusal(
          patch('pin', [
            ...image('registry.example/rt:WarmingUp'),
            ...timeout('20m'),
            { op: 'replace', path: '/spec/runtime/replicas/active/api', value: 4 },
            { op: 'replace', path: '/spec/drain/timeout', value: '10m' },
          ]),
        ),
      ).toBeUndefined();
      // A sale created without an image cannot get one once Ready.
      await create('pin-default', valid());
      await setPhase('pin-default', 'Ready');
      expect(await refusal(patch('pin-default', image('registry.example/rt:late')))).toMatch(imageRefused);
    },
    TIMEOUT_MS,
  );

  it(
    'gives the operator exactly the access its RBAC manifest grants, in its namespace only',
    async () => {
      const operatorAccount: Subject = {
        user: `system:serviceaccount:${namespace}:${SERVICE_ACCOUNT}`,
        groups: ['system:serviceaccounts', `system:serviceaccounts:${namespace}`, 'system:authenticated'],
      };
      const can = (access: Access, ns = namespace) => canI(a, operatorAccount, access, ns);
      const granted: Access[] = [
        ['watch', 'flashsale.io', 'flashsaleactivities'],
        ['patch', 'flashsale.io', 'flashsaleactivities'],
        ['patch', 'flashsale.io', 'flashsaleactivities', 'status'],
        ['patch', 'apps', 'deployments'],
        ['create', 'apps', 'deployments'],
        ['create', '', 'events'],
      ];
      const denied: Access[] = [
        ['delete', 'flashsale.io', 'flashsaleactivities'],
        ['create', 'flashsale.io', 'flashsaleactivities'],
        ['update', 'flashsale.io', 'flashsaleactivities'],
        ['delete', 'apps', 'deployments'],
        ['get', '', 'secrets'],
        ['list', '', 'pods'],
        ['create', 'apps', 'statefulsets'],
        ['delete', 'coordination.k8s.io', 'leases'],
      ];
      const seen = async (list: Access[]) =>
        Promise.all(list.map(async (x) => [x.join(' '), await can(x)] as const));
      expect(await seen(granted)).toEqual(granted.map((x) => [x.join(' '), true]));
      expect(await seen(denied)).toEqual(denied.map((x) => [x.join(' '), false]));
      // Bound in this namespace only.
      expect(await can(['list', 'flashsale.io', 'flashsaleactivities'], 'default')).toBe(false);
    },
    TIMEOUT_MS,
  );
});
