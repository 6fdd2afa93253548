import {
  CONDITION_MESSAGE_MAX,
  derivePhase,
  enterPhase,
  findCondition,
  lifecycleConditions,
  setCondition,
} from '../../../operator/api/v1alpha1/conditions.js';
import { PHASE_ORDER, Phase } from '../../../operator/api/v1alpha1/types.js';
import type { Condition } from '../../../operator/api/v1alpha1/types.js';

const t1 = new Date('2030-01-01T00:00:00Z');
const t2 = new Date('2030-01-01T00:01:00Z');

describe('conditions', () => {
  it('cuts a message longer than the CRD allows, saying how much was left out (the status write would fail)', () => {
    const long = 'x'.repeat(40_000);
    const [c] = setCondition([], { type: 'Degraded', status: 'True', reason: 'R', message: long }, 1, t1);
    expect(c!.message.length).toBeLessThanOrEqual(CONDITION_MESSAGE_MAX);
    expect(c!.message).toMatch(/^x+ \.\.\. \(7296 more characters\)$/);
    const [short] = setCondition([], { type: 'Degraded', status: 'True', reason: 'R', message: 'ok' }, 1, t1);
    expect(short!.message).toBe('ok');
  });
  it('moves lastTransitionTime only when the status changes (meta.SetStatusCondition)', () => {
    let list = setCondition([], { type: 'Ready', status: 'False', reason: 'A', message: 'a' }, 1, t1);
    list = setCondition(list, { type: 'Ready', status: 'False', reason: 'B', message: 'b' }, 2, t2);
    expect(list).toEqual([
      {
        type: 'Ready',
        status: 'False',
        reason: 'B',
        message: 'b',
        observedGeneration: 2,
        lastTransitionTime: t1.toISOString(),
      },
    ]);
    list = setCondition(list, { type: 'Ready', status: 'True', reason: 'C', message: 'c' }, 2, t2);
    expect(list[0]?.lastTransitionTime).toBe(t2.toISOString());
  });

  it('does not mutate its input', () => {
    const before: Condition[] = [
      { type: 'Ready', status: 'False', reason: 'A', message: 'a', lastTransitionTime: t1.toISOString() },
    ];
    const copy = structuredClone(before);
    setCondition(before, { type: 'Ready', status: 'True', reason: 'B', message: 'b' }, 1, t2);
    expect(before).toEqual(copy);
  });

  it('derives Pending from no conditions', () => {
    expect(derivePhase(undefined)).toBe(Phase.Pending);
    expect(derivePhase([])).toBe(Phase.Pending);
  });

  it.each([...PHASE_ORDER, Phase.Failed])('round-trips %s through its conditions', (phase) => {
    const conditions = enterPhase([], phase, 'm', 1, t1, phase === Phase.Failed ? 'CacheLost' : undefined);
    expect(derivePhase(conditions)).toBe(phase);
  });

  it('derives every phase of the lifecycle in order from successive transitions', () => {
    let conditions: Condition[] = [];
    const seen: Phase[] = [];
    for (const phase of PHASE_ORDER) {
      conditions = enterPhase(conditions, phase, `now ${phase}`, 1, t1);
      seen.push(derivePhase(conditions));
    }
    expect(seen).toEqual(PHASE_ORDER);
    expect(findCondition(conditions, 'Succeeded')).toMatchObject({ status: 'True', reason: 'Completed' });
  });

  it('records the failure reason on Succeeded=False and keeps Degraded/Paused apart', () => {
    let conditions = enterPhase([], Phase.Active, 'm', 1, t1);
    conditions = setCondition(
      conditions,
      { type: 'Degraded', status: 'True', reason: 'DrainTimedOut', message: 'x' },
      1,
      t1,
    );
    conditions = setCondition(
      conditions,
      { type: 'Paused', status: 'True', reason: 'PausedBySpec', message: 'p' },
      1,
      t1,
    );
    expect(derivePhase(conditions)).toBe(Phase.Active);
    conditions = enterPhase(conditions, Phase.Failed, 'cache gone', 1, t2, 'CacheLost');
    expect(derivePhase(conditions)).toBe(Phase.Failed);
    expect(findCondition(conditions, 'Succeeded')).toMatchObject({
      status: 'False',
      reason: 'CacheLost',
      message: 'cache gone',
    });
    expect(findCondition(conditions, 'Degraded')?.reason).toBe('DrainTimedOut');
  });

  it('uses CamelCase reasons that satisfy the CRD pattern of metav1.Condition', () => {
    const pattern = /^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$/;
    for (const phase of [...PHASE_ORDER, Phase.Failed]) {
      for (const c of lifecycleConditions(phase, 'm', 'CacheLost')) expect(c.reason).toMatch(pattern);
    }
  });

  it('ignores an unknown Progressing reason rather than inventing a phase', () => {
    const conditions: Condition[] = [
      {
        type: 'Progressing',
        status: 'True',
        reason: 'Mystery',
        message: '',
        lastTransitionTime: t1.toISOString(),
      },
      {
        type: 'Ready',
        status: 'True',
        reason: 'CacheLoaded',
        message: '',
        lastTransitionTime: t1.toISOString(),
      },
    ];
    expect(derivePhase(conditions)).toBe(Phase.Ready);
  });
});
