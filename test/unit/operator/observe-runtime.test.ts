import type { V1Deployment } from '@kubernetes/client-node';
import { loadOperatorConfig } from '../../../operator/config.js';
import { roleRollout, rolloutsOf, runtimeCondition } from '../../../operator/reconcile/observe-runtime.js';
import { apiMinAvailable, desiredApiBudget } from '../../../operator/reconcile/protect-api.js';
import { desiredDeployment, runtimeImageOf } from '../../../operator/reconcile/runtime-objects.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import type { RoleReplicas, RuntimeRole } from '../../../operator/api/v1alpha1/types.js';
import { activityFixture } from './activity-fixture.js';

const config = loadOperatorConfig({
  DATABASE_URL: 'postgres://u:secret@db/flashsale',
  REDIS_URL: 'redis://redis:6379',
  KAFKA_BROKERS: 'k1:9092',
});

const fsa = activityFixture({ replicas: { active: { api: 3 }, draining: { api: 0 } } });

/** What the Deployment controller would report for `desired` after `available` Pods became ready. */
function live(desired: V1Deployment, available: number, observed = true): V1Deployment {
  return {
    ...desired,
    metadata: { ...desired.metadata, generation: 4 },
    status: {
      observedGeneration: observed ? 4 : 3,
      replicas: desired.spec?.replicas,
      updatedReplicas: desired.spec?.replicas,
      availableReplicas: available,
    },
  };
}

describe('RuntimeReady', () => {
  const api = desiredDeployment(fsa, 'api', 3, 'act-1', config);
  const relay = desiredDeployment(fsa, 'relay', 1, 'act-1', config);
  const none = desiredDeployment(fsa, 'consumer', 0, 'act-1', config);

  it('is True only when every role the phase runs has all its replicas available', () => {
    const ok = runtimeCondition([
      roleRollout('api', api, live(api, 3)),
      roleRollout('relay', relay, live(relay, 1)),
      roleRollout('consumer', none, undefined),
    ]);
    expect(ok).toMatchObject({
      status: 'True',
      reason: 'RuntimeAvailable',
      message: 'available: api 3/3, relay 1/1',
    });
    const partial = runtimeCondition([
      roleRollout('api', api, live(api, 2)),
      roleRollout('relay', relay, live(relay, 1)),
    ]);
    expect(partial).toMatchObject({
      status: 'False',
      reason: 'RuntimeUnavailable',
      message: 'available: api 2/3, relay 1/1',
    });
  });

  it('is False while a Deployment is missing, stale in the cache, or not yet observed by its controller', () => {
    expect(runtimeCondition([roleRollout('api', api, undefined)])).toMatchObject({
      status: 'False',
      message: 'available: api 0/3 (rolling out: api)',
    });
    // The cache still holds the previous replicas (the apply of this pass is not seen yet).
    const previous = desiredDeployment(fsa, 'api', 1, 'act-1', config);
    expect(runtimeCondition([roleRollout('api', api, live(previous, 1))]).status).toBe('False');
    expect(runtimeCondition([roleRollout('api', api, live(api, 3, false))])).toMatchObject({
      status: 'False',
      reason: 'RuntimeUnavailable',
    });
  });

  it('says NoRuntime when the phase runs no replicas', () => {
    expect(runtimeCondition([roleRollout('consumer', none, undefined)])).toMatchObject({
      status: 'False',
      reason: 'NoRuntime',
    });
  });
});

describe('RuntimeReady against what scale-runtime applies', () => {
  const replicas: RoleReplicas = { api: 2, relay: 1, consumer: 1 };
  /** The Deployments scale-runtime.ts applies for `a` with `cfg`, as their controller reports them. */
  const applied = (a: typeof fsa, cfg: typeof config) =>
    new Map<RuntimeRole, V1Deployment>(
      (['api', 'relay', 'consumer'] as const).map((role) => {
        const d = desiredDeployment(a, role, replicas[role], 'act-1', cfg, runtimeImageOf(a, cfg, undefined));
        return [role, live(d, replicas[role])];
      }),
    );

  it('is True for an activity that runs an allowed image of its own (spec.runtime.image)', () => {
    const cfg = loadOperatorConfig({
      DATABASE_URL: 'postgres://u:secret@db/flashsale',
      REDIS_URL: 'redis://redis:6379',
      KAFKA_BROKERS: 'k1:9092',
      RUNTIME_ALLOWED_IMAGES: 'registry.example/flashsale:0.2.0-canary',
    });
    const canary = activityFixture();
    canary.spec.runtime.image = 'registry.example/flashsale:0.2.0-canary';
    const deployments = applied(canary, cfg);
    expect(deployments.get('api')?.spec?.template.spec?.containers[0]?.image).toBe(
      'registry.example/flashsale:0.2.0-canary',
    );
    const rollouts = rolloutsOf(
      { fsa: canary, phase: Phase.WarmingUp, deleting: false, activityId: 'act-1', config: cfg, replicas },
      (role) => deployments.get(role),
    );
    expect(runtimeCondition(rollouts)).toMatchObject({ status: 'True', reason: 'RuntimeAvailable' });
  });

  it('is True for a pinned runtime warmed up under another operator configuration (an upgrade mid-sale)', () => {
    const before = applied(fsa, config);
    const upgraded = loadOperatorConfig({
      DATABASE_URL: 'postgres://u:secret@db/flashsale',
      REDIS_URL: 'redis://redis:6379',
      KAFKA_BROKERS: 'k1:9092',
      RUNTIME_IMAGE: 'ghcr.io/flashsale/flashsale:0.2.0',
    });
    const at = (phase: Phase) =>
      runtimeCondition(
        rolloutsOf({ fsa, phase, deleting: false, activityId: 'act-1', config: upgraded, replicas }, (role) =>
          before.get(role),
        ),
      );
    // Served from: the template stays as it was warmed up; the replicas are what counts.
    expect(at(Phase.Active)).toMatchObject({ status: 'True', reason: 'RuntimeAvailable' });
    // Before the sale the template is applied again with the new configuration: rolling out.
    expect(at(Phase.WarmingUp)).toMatchObject({ status: 'False', reason: 'RuntimeUnavailable' });
  });
});

describe('the api disruption budget', () => {
  it('keeps every api replica but one, and never fewer than one', () => {
    expect([1, 2, 3, 10].map(apiMinAvailable)).toEqual([1, 1, 2, 9]);
  });

  it('selects the api Pods and is owned by the activity', () => {
    const pdb = desiredApiBudget(fsa, 'act-1', 2);
    expect(pdb.spec).toEqual({
      minAvailable: 2,
      selector: { matchLabels: desiredDeployment(fsa, 'api', 3, 'act-1', config).spec?.selector.matchLabels },
    });
    expect(pdb.metadata?.ownerReferences).toEqual([
      expect.objectContaining({ kind: 'FlashSaleActivity', uid: 'uid-1', controller: true }),
    ]);
  });
});
