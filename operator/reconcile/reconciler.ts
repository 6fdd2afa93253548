/**
 * The thin outer Reconcile (as CloudNativePG's): fetch the resource, run the verb-named steps in
 * order until one ends the pass, then always write the status. Level-triggered and idempotent:
 * every decision is taken from the API server's copy of the resource and from Redis/PostgreSQL,
 * never from memory, so a new leader (or a restarted process) simply continues.
 */
import { activityIdOf, parseDuration, scheduleOf, splitKey } from '../api/v1alpha1/funcs.js';
import { Phase } from '../api/v1alpha1/types.js';
import { claimId } from './claim-id.js';
import { cleanUp } from './clean-up.js';
import type { ReconcileDeps, Step } from './context.js';
import { ReconcileContext } from './context.js';
import { detectFailure } from './detect-failure.js';
import { drain } from './drain.js';
import { ensureFinalizer } from './ensure-finalizer.js';
import { observeRuntime } from './observe-runtime.js';
import { openGate } from './open-gate.js';
import { protectApi } from './protect-api.js';
import { removeFinalizer } from './remove-finalizer.js';
import { restoreCache } from './restore-cache.js';
import { growPartitions } from './grow-partitions.js';
import { scaleRuntime } from './scale-runtime.js';
import { settle } from './settle.js';
import { syncSpec } from './sync-spec.js';
import { forgetActivityMetrics, updateStatus } from './update-status.js';
import { warmUp } from './warm-up.js';
import { writeBack } from './write-back.js';

/** The steps, in order. Each acts only in the phases it owns and may end the pass. */
export const STEPS: readonly (readonly [string, Step])[] = [
  ['ensure-finalizer', ensureFinalizer],
  ['claim-id', claimId],
  ['detect-failure', detectFailure],
  ['scale-runtime', scaleRuntime],
  ['grow-partitions', growPartitions],
  ['observe-runtime', observeRuntime],
  ['protect-api', protectApi],
  ['restore-cache', restoreCache],
  ['warm-up', warmUp],
  ['sync-spec', syncSpec],
  ['open-gate', openGate],
  ['drain', drain],
  ['write-back', writeBack],
  ['clean-up', cleanUp],
  ['settle', settle],
  ['remove-finalizer', removeFinalizer],
];

export interface ReconcileResult {
  /** Look at the key again at this instant (epoch ms); undefined = only on the next event. */
  requeueAtMs: number | undefined;
  phase: Phase | undefined;
}

const REFRESH_PHASES: readonly Phase[] = [Phase.Active, Phase.Draining, Phase.WritingBack, Phase.CleaningUp];

export class Reconciler {
  private readonly activityIds = new Map<string, string>();

  constructor(private readonly deps: ReconcileDeps) {}

  async reconcile(key: string): Promise<ReconcileResult> {
    const { namespace, name } = splitKey(key);
    const fsa = await this.deps.activities.get(namespace, name);
    if (!fsa) {
      const known = this.activityIds.get(key);
      if (known !== undefined) forgetActivityMetrics(this.deps.metrics, { activity: known, name, namespace });
      this.activityIds.delete(key);
      return { requeueAtMs: undefined, phase: undefined };
    }
    const activityId = activityIdOf(fsa);
    // Remembered for removing the resource's series once it is gone (its uid, part of the id, is
    // then unknown).
    this.activityIds.set(key, activityId);
    const schedule = scheduleOf(fsa.spec, parseDuration(this.deps.config.defaultWarmUpLead));
    const log = this.deps.log.child({ activity: key, activityId });
    const ctx = new ReconcileContext(this.deps, fsa, activityId, schedule, log);
    try {
      for (const [stepName, step] of STEPS) {
        const result = await step(ctx);
        if (result.done) {
          log.debug({ step: stepName, phase: ctx.phase }, 'pass ended');
          break;
        }
      }
    } catch (err) {
      ctx.error = err;
      await updateStatus(ctx).catch((statusErr: unknown) => {
        log.debug({ err: String(statusErr) }, 'could not record the error in the status');
      });
      throw err;
    }
    await updateStatus(ctx);
    const phase = ctx.fsa.status?.phase ?? ctx.phase;
    if (ctx.gone) return { requeueAtMs: undefined, phase };
    if (ctx.transitioned) return { requeueAtMs: this.deps.now().getTime(), phase };
    let at = ctx.requeueAtMs;
    if (REFRESH_PHASES.includes(phase) && this.deps.config.statusRefreshMs > 0) {
      const refresh = ctx.now.getTime() + this.deps.config.statusRefreshMs;
      at = at === undefined ? refresh : Math.min(at, refresh);
    }
    return { requeueAtMs: at, phase };
  }
}
