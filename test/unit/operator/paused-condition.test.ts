// The Paused condition reports the gate, not the spec (operator/reconcile/update-status.ts
// pausedCondition): while Active, what open-gate.ts left it in this pass, or, when the pass failed
// before reaching it (PostgreSQL unreachable: claim-id and restore-cache read it first), what the
// last pass reported. A pause not applied yet is PausePending (buyers are still served), never True.
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import type { ReconcileContext } from '../../../operator/reconcile/context.js';
import { pausedCondition } from '../../../operator/reconcile/update-status.js';

function ctxOf(paused: boolean, gateSeen: string | undefined, previouslyPaused: boolean): ReconcileContext {
  return {
    fsa: {
      spec: { paused },
      status: {
        conditions: [
          {
            type: 'Paused',
            status: previouslyPaused ? 'True' : 'False',
            reason: previouslyPaused ? 'PausedBySpec' : 'NotPaused',
            message: '',
            lastTransitionTime: new Date(0).toISOString(),
          },
        ],
      },
    },
    gateSeen,
  } as unknown as ReconcileContext;
}

const of = (c: { status: string; reason: string }) => `${c.status} ${c.reason}`;

describe('Paused', () => {
  it('is True once open-gate has closed the gate, and only then', () => {
    expect(of(pausedCondition(ctxOf(true, 'paused', false), Phase.Active))).toBe('True PausedBySpec');
    expect(of(pausedCondition(ctxOf(false, 'open', true), Phase.Active))).toBe('False NotPaused');
  });

  it('says PausePending for a pause the operator could not apply in this pass (the gate still open)', () => {
    expect(of(pausedCondition(ctxOf(true, undefined, false), Phase.Active))).toBe('False PausePending');
  });

  it('keeps what the last pass applied when this pass did not reach the gate', () => {
    expect(of(pausedCondition(ctxOf(true, undefined, true), Phase.Active))).toBe('True PausedBySpec');
    expect(of(pausedCondition(ctxOf(false, undefined, true), Phase.Active))).toBe('True ResumePending');
    expect(of(pausedCondition(ctxOf(false, undefined, false), Phase.Active))).toBe('False NotPaused');
  });

  it('before the sale says whether it will start paused; after it, never paused', () => {
    expect(of(pausedCondition(ctxOf(true, undefined, false), Phase.Ready))).toBe('True PausedBySpec');
    expect(of(pausedCondition(ctxOf(true, undefined, true), Phase.Draining))).toBe('False NotPaused');
  });
});
