import { loadOperatorConfig } from '../../../operator/config.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import {
  deploymentUpToDate,
  desiredApiService,
  desiredDeployment,
  SPEC_HASH_ANNOTATION,
} from '../../../operator/reconcile/runtime-objects.js';

const config = loadOperatorConfig({
  DATABASE_URL: 'postgres://u:secret@db/flashsale',
  REDIS_URL: 'redis://redis:6379',
  KAFKA_BROKERS: 'k1:9092,k2:9092',
  RUNTIME_RESOURCES: '{"requests":{"cpu":"250m","memory":"256Mi"},"limits":{"memory":"512Mi"}}',
});

const fsa: FlashSaleActivity = {
  apiVersion: 'flashsale.io/v1alpha1',
  kind: 'FlashSaleActivity',
  metadata: { name: 'spring', namespace: 'shop', uid: 'uid-1', generation: 3, resourceVersion: '9' },
  spec: {
    schedule: { startAt: '2030-01-01T10:00:00Z', endAt: '2030-01-01T11:00:00Z' },
    items: [{ skuId: 'a', name: 'A', price: '1.00', stock: 1, limitPerUser: 1 }],
    requireOrderCode: false,
    reopenOnRelease: true,
    paused: false,
    runtime: {
      replicas: {
        warmUp: { api: 1, relay: 1, consumer: 1 },
        active: { api: 2, relay: 1, consumer: 1 },
        draining: { api: 1, relay: 1, consumer: 1 },
      },
    },
    payment: { timeout: '10m' },
    drain: { timeout: '5m' },
    cleanup: { policy: 'Delete', resultRetention: '24h' },
  },
};

describe('runtime objects', () => {
  const d = desiredDeployment(fsa, 'relay', 3, 'shop.spring-uid1', config);

  it('names, labels and owns the Deployment', () => {
    expect(d.metadata).toMatchObject({
      name: 'spring-relay',
      namespace: 'shop',
      labels: {
        'app.kubernetes.io/name': 'flashsale-runtime',
        'app.kubernetes.io/instance': 'spring',
        'app.kubernetes.io/component': 'relay',
        'app.kubernetes.io/managed-by': 'flashsale-operator',
        'flashsale.io/activity': 'shop.spring-uid1',
      },
      ownerReferences: [
        {
          apiVersion: 'flashsale.io/v1alpha1',
          kind: 'FlashSaleActivity',
          name: 'spring',
          uid: 'uid-1',
          controller: true,
          blockOwnerDeletion: true,
        },
      ],
    });
    expect(d.spec?.replicas).toBe(3);
    expect(d.spec?.selector.matchLabels).toEqual({
      'app.kubernetes.io/name': 'flashsale-runtime',
      'app.kubernetes.io/instance': 'spring',
      'app.kubernetes.io/component': 'relay',
    });
  });

  it('runs the role with the runtime environment and the connection Secret', () => {
    const c = d.spec?.template.spec?.containers[0];
    expect(c?.command).toEqual(['node', 'dist/runtime/main.js']);
    expect(c?.args).toEqual(['relay']);
    expect(c?.image).toBe('ghcr.io/flashsale/flashsale:0.1.0');
    const env = Object.fromEntries(
      (c?.env ?? []).filter((e) => e.value !== undefined).map((e) => [e.name, e.value]),
    );
    expect(env).toEqual({
      ACTIVITY_ID: 'shop.spring-uid1',
      HTTP_PORT: '8080',
      METRICS_PORT: '9090',
      PAYMENT_TIMEOUT_SECONDS: '600',
      KAFKA_TOPIC_PREFIX: 'flashsale',
    });
    expect(c?.envFrom).toEqual([{ secretRef: { name: 'flashsale-runtime' } }]);
    // /metrics has its own named port; probes stay on the service port.
    expect(c?.ports).toEqual([
      { name: 'http', containerPort: 8080, protocol: 'TCP' },
      { name: 'metrics', containerPort: 9090, protocol: 'TCP' },
    ]);
    expect(d.spec?.template.metadata?.annotations?.['prometheus.io/port']).toBe('9090');
    expect(c?.readinessProbe?.httpGet?.port).toBe('http');
    expect(c?.resources).toEqual({ requests: { cpu: '250m', memory: '256Mi' }, limits: { memory: '512Mi' } });
    expect(c?.readinessProbe?.httpGet?.path).toBe('/readyz');
    expect(c?.livenessProbe?.httpGet?.path).toBe('/healthz');
    expect(d.spec?.template.spec?.automountServiceAccountToken).toBe(false);
    expect(c?.securityContext).toMatchObject({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
    });
  });

  it('takes the image from the spec when given', () => {
    const own = desiredDeployment(
      { ...fsa, spec: { ...fsa.spec, runtime: { ...fsa.spec.runtime, image: 'registry/rt:2' } } },
      'api',
      1,
      'x',
      config,
    );
    expect(own.spec?.template.spec?.containers[0]?.image).toBe('registry/rt:2');
  });

  it('hashes the template, not the replicas, so only real changes are written', () => {
    const same = desiredDeployment(fsa, 'relay', 0, 'shop.spring-uid1', config);
    expect(same.metadata?.annotations?.[SPEC_HASH_ANNOTATION]).toBe(
      d.metadata?.annotations?.[SPEC_HASH_ANNOTATION],
    );
    const other = desiredDeployment(
      { ...fsa, spec: { ...fsa.spec, payment: { timeout: '20m' } } },
      'relay',
      3,
      'shop.spring-uid1',
      config,
    );
    expect(other.metadata?.annotations?.[SPEC_HASH_ANNOTATION]).not.toBe(
      d.metadata?.annotations?.[SPEC_HASH_ANNOTATION],
    );
    expect(deploymentUpToDate(d, d)).toBe(true);
    expect(deploymentUpToDate(d, same)).toBe(false); // replicas differ
    expect(deploymentUpToDate(d, other)).toBe(false);
    expect(deploymentUpToDate(undefined, d)).toBe(false);
  });

  it('exposes the api role through a Service', () => {
    const s = desiredApiService(fsa, 'x');
    expect(s.metadata?.name).toBe('spring-api');
    expect(s.spec?.selector).toMatchObject({
      'app.kubernetes.io/component': 'api',
      'app.kubernetes.io/instance': 'spring',
    });
    expect(s.spec?.ports?.[0]).toMatchObject({ port: 80, targetPort: 'http' });
  });
});
