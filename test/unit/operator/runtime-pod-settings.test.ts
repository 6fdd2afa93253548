// The operator's per-role pod settings (RUNTIME_ROLE_SETTINGS, pull secrets, extra env and volumes)
// land in the runtime Deployments, and the pinning rule of scale-runtime.ts: from Ready on a live
// Deployment's template is never re-applied.
import type { V1Deployment } from '@kubernetes/client-node';
import { loadOperatorConfig } from '../../../operator/config.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { desiredDeployment } from '../../../operator/reconcile/runtime-objects.js';
import { runtimePinned } from '../../../operator/reconcile/scale-runtime.js';
import { ConfigError } from '../../../core/config.js';
import { activityFixture } from './activity-fixture.js';

const required = {
  DATABASE_URL: 'postgres://u:secret@db/flashsale',
  REDIS_URL: 'redis://redis:6379',
  KAFKA_BROKERS: 'k1:9092',
};

const fsa = activityFixture({ generation: 1, replicas: { active: { api: 2 } } });

describe('runtime pod settings', () => {
  const config = loadOperatorConfig({
    ...required,
    RUNTIME_RESOURCES: '{"requests":{"cpu":"250m"}}',
    RUNTIME_IMAGE_PULL_SECRETS: 'regcred, regcred,mirror',
    RUNTIME_EXTRA_ENV: JSON.stringify([
      { name: 'NODE_EXTRA_CA_CERTS', value: '/etc/flashsale/ca/ca.crt' },
      { name: 'ACTIVITY_ID', value: 'hijack' },
    ]),
    RUNTIME_EXTRA_VOLUMES: JSON.stringify([{ name: 'ca', configMap: { name: 'corp-ca' } }]),
    RUNTIME_EXTRA_VOLUME_MOUNTS: JSON.stringify([
      { name: 'ca', mountPath: '/etc/flashsale/ca', readOnly: true },
    ]),
    RUNTIME_ROLE_SETTINGS: JSON.stringify({
      api: {
        priorityClassName: 'sale-critical',
        preStopSeconds: 7,
        topologySpreadConstraints: [
          { maxSkew: 1, topologyKey: 'topology.kubernetes.io/zone', whenUnsatisfiable: 'ScheduleAnyway' },
        ],
        resources: { requests: { cpu: '2' }, limits: { memory: '1Gi' } },
      },
      consumer: { disruptionBudget: false, semiSpaceMiB: 0 },
      relay: { semiSpaceMiB: 64 },
    }),
  });

  it('gives each role its own priority class, spread, preStop delay and resources', () => {
    const api = desiredDeployment(fsa, 'api', 2, 'shop.spring-uid1', config).spec?.template.spec;
    expect(api?.priorityClassName).toBe('sale-critical');
    expect(api?.terminationGracePeriodSeconds).toBe(37);
    expect(api?.topologySpreadConstraints).toEqual([
      {
        maxSkew: 1,
        topologyKey: 'topology.kubernetes.io/zone',
        whenUnsatisfiable: 'ScheduleAnyway',
        labelSelector: {
          matchLabels: {
            'app.kubernetes.io/name': 'flashsale-runtime',
            'app.kubernetes.io/instance': 'spring',
            'app.kubernetes.io/component': 'api',
          },
        },
      },
    ]);
    expect(api?.containers[0]?.lifecycle).toEqual({ preStop: { sleep: { seconds: 7 } } });
    expect(api?.containers[0]?.resources).toEqual({ requests: { cpu: '2' }, limits: { memory: '1Gi' } });

    const relay = desiredDeployment(fsa, 'relay', 1, 'shop.spring-uid1', config).spec?.template.spec;
    expect(relay?.priorityClassName).toBeUndefined();
    expect(relay?.topologySpreadConstraints).toBeUndefined();
    expect(relay?.terminationGracePeriodSeconds).toBe(30);
    expect(relay?.containers[0]?.lifecycle).toBeUndefined();
    expect(relay?.containers[0]?.resources).toEqual({ requests: { cpu: '250m' } });
    expect(config.runtime.roles.consumer.disruptionBudget).toBe(false);
    expect(config.runtime.roles.relay.disruptionBudget).toBe(true);
  });

  it("puts a role's V8 semi-space on its command line, where NODE_OPTIONS cannot override it", () => {
    const command = (role: 'api' | 'relay' | 'consumer', c = config): string[] | undefined =>
      desiredDeployment(fsa, role, 1, 'shop.spring-uid1', c).spec?.template.spec?.containers[0]?.command;
    // Configured: the relay's 64, the consumer's 0 (the image's NODE_OPTIONS decide).
    expect(command('relay')).toEqual(['node', '--max-semi-space-size=64', 'dist/runtime/main.js']);
    expect(command('consumer')).toEqual(['node', 'dist/runtime/main.js']);
    // Defaults: the api keeps the image's 8 MiB, the pipeline roles get 16.
    const plain = loadOperatorConfig(required);
    expect(command('api', plain)).toEqual(['node', 'dist/runtime/main.js']);
    expect(command('relay', plain)).toEqual(['node', '--max-semi-space-size=16', 'dist/runtime/main.js']);
    expect(command('consumer', plain)).toEqual(['node', '--max-semi-space-size=16', 'dist/runtime/main.js']);
  });

  it('passes pull secrets, extra env and volumes to every role, never overriding the operator', () => {
    for (const role of ['api', 'relay', 'consumer'] as const) {
      const pod = desiredDeployment(fsa, role, 1, 'shop.spring-uid1', config).spec?.template.spec;
      expect(pod?.imagePullSecrets).toEqual([{ name: 'regcred' }, { name: 'mirror' }]);
      expect(pod?.volumes).toEqual([{ name: 'ca', configMap: { name: 'corp-ca' } }]);
      const c = pod?.containers[0];
      expect(c?.volumeMounts).toEqual([{ name: 'ca', mountPath: '/etc/flashsale/ca', readOnly: true }]);
      const env = c?.env ?? [];
      expect(env.filter((e) => e.name === 'ACTIVITY_ID')).toEqual([
        { name: 'ACTIVITY_ID', value: 'shop.spring-uid1' },
      ]);
      expect(env.at(-1)).toEqual({ name: 'NODE_EXTRA_CA_CERTS', value: '/etc/flashsale/ca/ca.crt' });
    }
  });

  it('refuses malformed settings at start-up, naming the variable', () => {
    const bad = (over: Record<string, string>): string => {
      try {
        loadOperatorConfig({ ...required, ...over });
        return 'accepted';
      } catch (err) {
        expect(err).toBeInstanceOf(ConfigError);
        return (err as Error).message;
      }
    };
    expect(bad({ RUNTIME_ROLE_SETTINGS: '{"api":{"preStopSecond":5}}' })).toMatch(/RUNTIME_ROLE_SETTINGS/);
    expect(bad({ RUNTIME_ROLE_SETTINGS: '{"web":{}}' })).toMatch(/RUNTIME_ROLE_SETTINGS/);
    expect(bad({ RUNTIME_ROLE_SETTINGS: '{"relay":{"semiSpaceMiB":-1}}' })).toMatch(/RUNTIME_ROLE_SETTINGS/);
    expect(bad({ RUNTIME_ROLE_SETTINGS: '{"relay":{"semiSpaceMiB":300}}' })).toMatch(/RUNTIME_ROLE_SETTINGS/);
    expect(bad({ RUNTIME_ROLE_SETTINGS: '{"relay":{"semiSpaceMiB":1.5}}' })).toMatch(/RUNTIME_ROLE_SETTINGS/);
    expect(bad({ RUNTIME_EXTRA_ENV: '[{"value":"x"}]' })).toMatch(/RUNTIME_EXTRA_ENV/);
    expect(bad({ RUNTIME_EXTRA_VOLUME_MOUNTS: '[{"name":"ca"}]' })).toMatch(/RUNTIME_EXTRA_VOLUME_MOUNTS/);
    expect(bad({ RUNTIME_EXTRA_VOLUMES: 'not json' })).toMatch(/RUNTIME_EXTRA_VOLUMES: not JSON/);
    // Secrets reach a role only through its own Secret (the tenant-isolation invariant).
    const secretEnv = [{ name: 'X', valueFrom: { secretKeyRef: { name: 'other', key: 'k' } } }];
    expect(bad({ RUNTIME_EXTRA_ENV: JSON.stringify(secretEnv) })).toMatch(
      /RUNTIME_EXTRA_ENV.*no Secret references/,
    );
    expect(bad({ RUNTIME_EXTRA_VOLUMES: '[{"name":"s","secret":{"secretName":"other"}}]' })).toMatch(
      /RUNTIME_EXTRA_VOLUMES.*no Secret references/,
    );
    const projected = [{ name: 'p', projected: { sources: [{ secret: { name: 'other' } }] } }];
    expect(bad({ RUNTIME_EXTRA_VOLUMES: JSON.stringify(projected) })).toMatch(/no Secret references/);
    // A ConfigMap value is fine.
    const fromConfigMap = [{ name: 'Y', valueFrom: { configMapKeyRef: { name: 'cm', key: 'k' } } }];
    expect(bad({ RUNTIME_EXTRA_ENV: JSON.stringify(fromConfigMap) })).toBe('accepted');
  });

  it('pins a live template from Ready on; applies it only while Pending or WarmingUp', () => {
    const live: V1Deployment = { metadata: { name: 'spring-api' } };
    expect(runtimePinned(Phase.Pending, false, live)).toBe(false);
    expect(runtimePinned(Phase.WarmingUp, false, live)).toBe(false);
    for (const phase of [
      Phase.Ready,
      Phase.Active,
      Phase.Draining,
      Phase.WritingBack,
      Phase.CleaningUp,
      Phase.Completed,
      Phase.Failed,
    ]) {
      expect([phase, runtimePinned(phase, false, live)]).toEqual([phase, true]);
    }
    // Being deleted: only scaled down. Nothing live: created (with the current configuration).
    expect(runtimePinned(Phase.WarmingUp, true, live)).toBe(true);
    expect(runtimePinned(Phase.Active, false, undefined)).toBe(false);
  });
});
