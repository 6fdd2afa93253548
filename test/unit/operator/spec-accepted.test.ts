// Degraded's reasons (operator/reconcile/update-status.ts). A refused edit stays visible (operator/reconcile/update-status.ts): SpecAccepted is False with
// SpecChangeRefused for as long as the refusal stands for this generation, even when Degraded,
// which holds one reason, shows another problem of the pass.
import type { FlashSaleActivityStatus } from '../../../operator/api/v1alpha1/types.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase, Reason } from '../../../operator/api/v1alpha1/types.js';
import type { ReconcileContext } from '../../../operator/reconcile/context.js';
import { degradedCondition, specAcceptedCondition } from '../../../operator/reconcile/update-status.js';

const refused = 'sku oil: stock 4 -> 2 (stock can only grow)';
const ctxOf = (generation: number, degraded?: { reason: string; message: string }) =>
  ({ generation, degraded, error: undefined }) as unknown as ReconcileContext;
const statusOf = (refusalGeneration: number) =>
  ({ cache: { refusal: { generation: refusalGeneration, message: refused } } }) as FlashSaleActivityStatus;

describe('SpecAccepted', () => {
  it('is False with SpecChangeRefused while another reason holds Degraded', () => {
    const ctx = ctxOf(4, { reason: Reason.PartitionsCapped, message: '8 consumers, 4 partitions' });
    expect(degradedCondition(ctx, statusOf(4))).toMatchObject({ reason: Reason.PartitionsCapped });
    expect(specAcceptedCondition(ctx, statusOf(4))).toEqual({
      type: 'SpecAccepted',
      status: 'False',
      reason: 'SpecChangeRefused',
      message: refused,
    });
  });

  it('is True once the refused generation is not the current one (the edit was undone or replaced)', () => {
    expect(specAcceptedCondition(ctxOf(5), statusOf(4))).toMatchObject({
      status: 'True',
      reason: 'SpecAccepted',
    });
    expect(specAcceptedCondition(ctxOf(5), {})).toMatchObject({ status: 'True', reason: 'SpecAccepted' });
  });
});

describe('Degraded after a drain that timed out', () => {
  const drained = (phase: Phase): FlashSaleActivityStatus => ({
    conditions: enterPhase(undefined, phase, 'm', 1, new Date()),
    drain: { timedOut: true, leftover: '2 half message(s) not yet in Kafka' },
  });

  it('is DrainTimedOut while the leftover can still matter (WritingBack, CleaningUp, Failed)', () => {
    for (const phase of [Phase.WritingBack, Phase.CleaningUp, Phase.Failed])
      expect({ phase, reason: degradedCondition(ctxOf(1), drained(phase)).reason }).toEqual({
        phase,
        reason: 'DrainTimedOut',
      });
  });

  it('clears once the cleanup found nothing in flight (Settling, Completed): the leftover is history', () => {
    for (const phase of [Phase.Settling, Phase.Completed])
      expect({ phase, condition: degradedCondition(ctxOf(1), drained(phase)) }).toEqual({
        phase,
        condition: expect.objectContaining({ status: 'False', reason: 'AsExpected' }),
      });
  });
});
