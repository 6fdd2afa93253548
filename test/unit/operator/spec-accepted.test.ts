// A refused edit stays visible (operator/reconcile/update-status.ts): SpecAccepted is False with
// SpecChangeRefused for as long as the refusal stands for this generation, even when Degraded,
// which holds one reason, shows another problem of the pass.
import type { FlashSaleActivityStatus } from '../../../operator/api/v1alpha1/types.js';
import { Reason } from '../../../operator/api/v1alpha1/types.js';
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
