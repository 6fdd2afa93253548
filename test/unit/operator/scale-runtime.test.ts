// scale-runtime.ts during a foreground deletion (garbage collection removed the runtime before the
// finalizer's steps): the roles a draining activity still needs are made again, unowned; a Settling
// activity's are not, since it is let go without them.
import { loadOperatorConfig } from '../../../operator/config.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { scaleRuntime } from '../../../operator/reconcile/scale-runtime.js';
import { stepContext } from '../../fixtures/step-context.js';
import { activityFixture } from './activity-fixture.js';

const config = loadOperatorConfig({
  DATABASE_URL: 'postgres://u:secret@db/flashsale',
  REDIS_URL: 'redis://redis:6379',
  KAFKA_BROKERS: 'k1:9092',
});

async function appliedWhileDeleted(phase: Phase): Promise<{ name: string; owners: unknown }[]> {
  const applied: { name: string; owners: unknown }[] = [];
  const now = new Date();
  const ctx = stepContext(
    {
      activityId: 'spring',
      now,
      deleted: true,
      spec: activityFixture().spec as unknown as Record<string, unknown>,
      status: { conditions: enterPhase(undefined, phase, 'test', 1, now) },
      deps: {
        config,
        // Collected by the foreground deletion: none of the runtime Deployments is left.
        deployment: () => undefined,
        apps: {
          patchNamespacedDeployment: async (p: {
            name: string;
            body: { metadata?: { ownerReferences?: unknown } };
          }) => {
            applied.push({ name: p.name, owners: p.body.metadata?.ownerReferences });
          },
        },
        core: {},
      },
    },
    [],
  );
  await scaleRuntime(ctx);
  return applied;
}

describe('scale-runtime during a foreground deletion', () => {
  it('makes a draining activity its runtime again, without an owner', async () => {
    expect(await appliedWhileDeleted(Phase.Draining)).toEqual(
      ['api', 'relay', 'consumer'].map((role) => ({ name: `spring-${role}`, owners: [] })),
    );
  });

  it('makes a Settling activity nothing: it is let go without its runtime', async () => {
    expect(await appliedWhileDeleted(Phase.Settling)).toEqual([]);
  });
});
