import { loadOperatorConfig } from '../../../operator/config.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import {
  deploymentUpToDate,
  desiredApiService,
  desiredDeployment,
  runtimeImageFor,
  SPEC_HASH_ANNOTATION,
} from '../../../operator/reconcile/runtime-objects.js';
import { RUNTIME_ROLES } from '../../../operator/api/v1alpha1/types.js';
import { activityFixture } from './activity-fixture.js';

const config = loadOperatorConfig({
  DATABASE_URL: 'postgres://u:secret@db/flashsale',
  REDIS_URL: 'redis://redis:6379',
  KAFKA_BROKERS: 'k1:9092,k2:9092',
  RUNTIME_RESOURCES: '{"requests":{"cpu":"250m","memory":"256Mi"},"limits":{"memory":"512Mi"}}',
  RUNTIME_ALLOWED_IMAGES: `registry/rt:2,sha256:${'0'.repeat(64)}`,
});

const fsa = activityFixture({ replicas: { active: { api: 2 } } });

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
    expect(c?.command).toEqual(['node', '--max-semi-space-size=16', 'dist/runtime/main.js']);
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
      KAFKA_REPLICATION_FACTOR: '1',
      KAFKA_MIN_INSYNC_REPLICAS: '1',
    });
    expect(c?.envFrom).toEqual([{ secretRef: { name: 'flashsale-runtime-relay' } }]);
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

  it('runs the image the operator chooses: RUNTIME_IMAGE, or an allowed spec.runtime.image', () => {
    const withImage = (image: string | undefined): FlashSaleActivity => ({
      ...fsa,
      spec: { ...fsa.spec, runtime: { ...fsa.spec.runtime, ...(image ? { image } : {}) } },
    });
    expect(runtimeImageFor(withImage(undefined), config)).toEqual({
      allowed: true,
      image: 'ghcr.io/flashsale/flashsale:0.1.0',
    });
    expect(runtimeImageFor(withImage('registry/rt:2'), config)).toEqual({
      allowed: true,
      image: 'registry/rt:2',
    });
    const pinned = `other.example/rt@sha256:${'0'.repeat(64)}`;
    expect(runtimeImageFor(withImage(pinned), config)).toEqual({ allowed: true, image: pinned });
    for (const refused of [
      'registry/rt:3',
      'registry/rt:2-evil',
      `x/rt@sha256:${'1'.repeat(64)}`,
      'registry/rt',
    ]) {
      const choice = runtimeImageFor(withImage(refused), config);
      expect(choice).toMatchObject({ allowed: false });
      expect(choice.allowed ? '' : choice.message).toContain(refused);
    }
    // The pure builder never reads spec.runtime.image: the image is an argument.
    const own = desiredDeployment(withImage('evil/miner:1'), 'api', 1, 'x', config);
    expect(own.spec?.template.spec?.containers[0]?.image).toBe('ghcr.io/flashsale/flashsale:0.1.0');
    const chosen = desiredDeployment(withImage('registry/rt:2'), 'api', 1, 'x', config, 'registry/rt:2');
    expect(chosen.spec?.template.spec?.containers[0]?.image).toBe('registry/rt:2');
  });

  it("mounts only the role's own Secret in each role's pod template", () => {
    for (const role of RUNTIME_ROLES) {
      const pod = desiredDeployment(fsa, role, 1, 'x', config).spec?.template.spec;
      const refs = (pod?.containers ?? []).flatMap((c) => [
        ...(c.envFrom ?? []).map((f) => f.secretRef?.name),
        ...(c.env ?? []).map((e) => e.valueFrom?.secretKeyRef?.name).filter((n) => n !== undefined),
      ]);
      expect(refs).toEqual([`flashsale-runtime-${role}`]);
      expect(pod?.volumes ?? []).toEqual([]);
      expect(pod?.automountServiceAccountToken).toBe(false);
    }
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
