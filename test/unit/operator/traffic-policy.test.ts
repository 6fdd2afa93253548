// The activity's traffic policy as the operator builds it from the spec (spec over the operator's
// defaults) and the deny-list format it reads from a ConfigMap. Pure functions.
import { DEFAULT_TRAFFIC_POLICY, trafficPolicySchema } from '../../../core/traffic-policy.js';
import { loadOperatorConfig } from '../../../operator/config.js';
import { parseDenyList, policyFromSpec, readDenyList } from '../../../operator/reconcile/traffic-policy.js';
import type { FlashSaleActivitySpec } from '../../../operator/api/v1alpha1/types.js';

const base: FlashSaleActivitySpec = {
  schedule: { startAt: '2030-01-01T00:00:00Z', endAt: '2030-01-01T01:00:00Z' },
  items: [{ skuId: 'a', name: 'A', price: '1.00', stock: 1, limitPerUser: 1 }],
  requireOrderCode: false,
  reopenOnRelease: true,
  paused: false,
  runtime: {
    replicas: {
      warmUp: { api: 1, relay: 1, consumer: 1 },
      active: { api: 1, relay: 1, consumer: 1 },
      draining: { api: 1, relay: 1, consumer: 1 },
    },
  },
  payment: { timeout: '15m' },
  drain: { timeout: '5m' },
  cleanup: { policy: 'Delete', resultRetention: '24h' },
};

const required = { DATABASE_URL: 'postgres://x', REDIS_URL: 'redis://x', KAFKA_BROKERS: 'k:9092' };

describe('policyFromSpec', () => {
  it('takes the defaults when the spec says nothing', () => {
    expect(policyFromSpec(base, DEFAULT_TRAFFIC_POLICY)).toEqual(DEFAULT_TRAFFIC_POLICY);
  });

  it('takes each field the spec gives, and the default for the others', () => {
    const p = policyFromSpec(
      {
        ...base,
        trafficShaping: { perAddress: { requests: 50, perSeconds: 5 } },
        eligibility: { preRegistration: true, denyListRef: { name: 'deny', key: 'denied' } },
      },
      DEFAULT_TRAFFIC_POLICY,
    );
    expect(p).toEqual({
      shaping: {
        enabled: true,
        perBuyer: DEFAULT_TRAFFIC_POLICY.shaping.perBuyer,
        perAddress: { requests: 50, perSeconds: 5 },
      },
      eligibility: {
        preRegistration: true,
        orderCodesPerBuyerPerSku: DEFAULT_TRAFFIC_POLICY.eligibility.orderCodesPerBuyerPerSku,
      },
    });
    expect(trafficPolicySchema.safeParse(p).success).toBe(true);
  });

  it('uses the operator configuration as defaults', () => {
    const cfg = loadOperatorConfig({
      ...required,
      TRAFFIC_SHAPING_ENABLED: 'false',
      TRAFFIC_PER_BUYER_REQUESTS: '7',
      TRAFFIC_PER_ADDRESS_REQUESTS: '300',
      TRAFFIC_PER_ADDRESS_SECONDS: '60',
      ORDER_CODES_PER_BUYER_PER_SKU: '0',
    });
    expect(policyFromSpec(base, cfg.trafficPolicy)).toEqual({
      shaping: {
        enabled: false,
        perBuyer: { requests: 7, perSeconds: 10 },
        perAddress: { requests: 300, perSeconds: 60 },
      },
      eligibility: { preRegistration: false, orderCodesPerBuyerPerSku: 0 },
    });
    expect(() => loadOperatorConfig({ ...required, TRAFFIC_PER_BUYER_SECONDS: '0' })).toThrow(
      /TRAFFIC_PER_BUYER_SECONDS/,
    );
  });
});

describe('parseDenyList', () => {
  it('reads ids one per line or comma separated, ignoring comments, blanks and repeats', () => {
    expect(parseDenyList('# bots seen on 11-11\nu1\n u2 , u3,,\n\nu1 # again\n#u9\n')).toEqual([
      'u1',
      'u2',
      'u3',
    ]);
  });

  it('keeps ids with any characters but whitespace, commas and #, and drops absurdly long ones', () => {
    expect(parseDenyList(`用户-7\nA|b\n${'x'.repeat(257)}`)).toEqual(['A|b', '用户-7']);
  });

  it('an empty list denies nobody', () => {
    expect(parseDenyList('')).toEqual([]);
  });
});

describe('trafficPolicySchema', () => {
  it('refuses a zero window and unknown fields', () => {
    const bad = {
      ...DEFAULT_TRAFFIC_POLICY,
      shaping: { ...DEFAULT_TRAFFIC_POLICY.shaping, perBuyer: { requests: 1, perSeconds: 0 } },
    };
    expect(trafficPolicySchema.safeParse(bad).success).toBe(false);
    expect(trafficPolicySchema.safeParse({ ...DEFAULT_TRAFFIC_POLICY, extra: 1 }).success).toBe(false);
  });
});

describe('readDenyList', () => {
  // client-node's ApiException carries the HTTP status as `code`.
  const failing = (code: number) => ({
    readNamespacedConfigMap: () => Promise.reject(Object.assign(new Error(`HTTP ${code}`), { code })),
  });
  const holding = (data: Record<string, string>) => ({
    readNamespacedConfigMap: () => Promise.resolve({ data }),
  });

  it("gives the key's text", async () => {
    await expect(readDenyList(holding({ denied: 'eve' }), 'ns', { name: 'deny' })).resolves.toEqual({
      text: 'eve',
    });
  });

  it('says unavailable, never fails the pass, for a ConfigMap or key missing or forbidden to the operator', async () => {
    await expect(readDenyList(holding({}), 'ns', { name: 'deny', key: 'k' })).resolves.toEqual({
      unavailable: 'deny list ConfigMap deny (key k) not found',
    });
    await expect(readDenyList(failing(404), 'ns', { name: 'deny' })).resolves.toEqual({
      unavailable: 'deny list ConfigMap deny (key denied) not found',
    });
    // A Role trimmed below the shipped one, or a name stored before the CRD refused it.
    await expect(readDenyList(failing(403), 'ns', { name: 'ops/deny' })).resolves.toEqual({
      unavailable:
        'deny list ConfigMap ops/deny (key denied) cannot be read: the operator is forbidden to get it',
    });
  });

  it('fails the pass (retried) when the API server does not answer', async () => {
    await expect(readDenyList(failing(503), 'ns', { name: 'deny' })).rejects.toThrow('HTTP 503');
  });
});
