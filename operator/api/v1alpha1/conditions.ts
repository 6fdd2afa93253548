/**
 * metav1.Condition handling and the phase derived from the conditions (as Argo Rollouts'
 * CalculateRolloutPhase): the conditions are the state, `status.phase` is their summary.
 */
import type { Condition, ConditionStatus, Phase } from './types.js';
import { ConditionType, Phase as P, Reason } from './types.js';

export function findCondition(
  conditions: readonly Condition[] | undefined,
  type: string,
): Condition | undefined {
  return conditions?.find((c) => c.type === type);
}

export function isTrue(conditions: readonly Condition[] | undefined, type: string): boolean {
  return findCondition(conditions, type)?.status === 'True';
}

export interface ConditionInput {
  type: string;
  status: ConditionStatus;
  reason: string;
  message: string;
}

/** The CRD's (and metav1.Condition's) limit on a condition message. */
export const CONDITION_MESSAGE_MAX = 32768;

/** A message cut to `max` characters, saying so: a longer one would make the status write fail. */
export function boundedMessage(message: string, max = CONDITION_MESSAGE_MAX): string {
  if (message.length <= max) return message;
  const kept = max - 64; // room for the note
  return `${message.slice(0, kept)} ... (${message.length - kept} more characters)`;
}

/**
 * Sets a condition as meta.SetStatusCondition does: lastTransitionTime moves only when the status
 * changes; reason, message and observedGeneration are updated in place. Returns a new array.
 */
export function setCondition(
  conditions: readonly Condition[] | undefined,
  input: ConditionInput,
  observedGeneration: number,
  now: Date,
): Condition[] {
  const list = [...(conditions ?? [])];
  const i = list.findIndex((c) => c.type === input.type);
  const previous = i >= 0 ? list[i] : undefined;
  const next: Condition = {
    type: input.type,
    status: input.status,
    observedGeneration,
    lastTransitionTime:
      previous && previous.status === input.status ? previous.lastTransitionTime : now.toISOString(),
    reason: input.reason,
    message: boundedMessage(input.message),
  };
  if (i >= 0) list[i] = next;
  else list.push(next);
  return list;
}

const PROGRESSING_PHASES: Readonly<Record<string, Phase>> = {
  [Reason.WarmingUp]: P.WarmingUp,
  [Reason.Draining]: P.Draining,
  [Reason.WritingBack]: P.WritingBack,
  [Reason.CleaningUp]: P.CleaningUp,
  [Reason.Settling]: P.Settling,
};

/** The phase the conditions describe. No conditions (a new resource) is Pending. */
export function derivePhase(conditions: readonly Condition[] | undefined): Phase {
  const succeeded = findCondition(conditions, ConditionType.Succeeded);
  if (succeeded?.status === 'True') return P.Completed;
  if (succeeded?.status === 'False') return P.Failed;
  const progressing = findCondition(conditions, ConditionType.Progressing);
  if (progressing?.status === 'True') {
    const phase = PROGRESSING_PHASES[progressing.reason];
    if (phase) return phase;
  }
  const ready = findCondition(conditions, ConditionType.Ready);
  if (ready?.status === 'True') return ready.reason === Reason.SaleOpen ? P.Active : P.Ready;
  return P.Pending;
}

/** The Ready, Progressing and Succeeded conditions that put an activity in `phase`. */
export function lifecycleConditions(phase: Phase, message: string, failureReason?: string): ConditionInput[] {
  const c = (type: string, status: ConditionStatus, reason: string, msg = message): ConditionInput => ({
    type,
    status,
    reason,
    message: msg,
  });
  const running = c(ConditionType.Succeeded, 'Unknown', Reason.InProgress, 'the activity has not finished');
  switch (phase) {
    case P.Pending:
      return [
        c(ConditionType.Ready, 'False', Reason.WaitingForWarmUp),
        c(ConditionType.Progressing, 'False', Reason.WaitingForWarmUp),
        running,
      ];
    case P.WarmingUp:
      return [
        c(ConditionType.Ready, 'False', Reason.WarmingUp),
        c(ConditionType.Progressing, 'True', Reason.WarmingUp),
        running,
      ];
    case P.Ready:
      return [
        c(ConditionType.Ready, 'True', Reason.CacheLoaded),
        c(ConditionType.Progressing, 'False', Reason.WaitingForStart),
        running,
      ];
    case P.Active:
      return [
        c(ConditionType.Ready, 'True', Reason.SaleOpen),
        c(ConditionType.Progressing, 'False', Reason.SaleRunning),
        running,
      ];
    case P.Draining:
    case P.WritingBack:
    case P.CleaningUp:
    case P.Settling:
      return [
        c(ConditionType.Ready, 'False', Reason.SaleEnded, 'the sale has ended'),
        c(ConditionType.Progressing, 'True', phase),
        running,
      ];
    case P.Completed:
      return [
        c(ConditionType.Ready, 'False', Reason.SaleEnded, 'the sale has ended'),
        c(ConditionType.Progressing, 'False', Reason.Completed),
        c(ConditionType.Succeeded, 'True', Reason.Completed),
      ];
    case P.Failed:
      return [
        c(ConditionType.Ready, 'False', failureReason ?? 'Failed'),
        c(ConditionType.Progressing, 'False', failureReason ?? 'Failed'),
        c(ConditionType.Succeeded, 'False', failureReason ?? 'Failed'),
      ];
  }
}

/** Applies lifecycleConditions(phase) to a condition list. */
export function enterPhase(
  conditions: readonly Condition[] | undefined,
  phase: Phase,
  message: string,
  generation: number,
  now: Date,
  failureReason?: string,
): Condition[] {
  let list = [...(conditions ?? [])];
  for (const input of lifecycleConditions(phase, message, failureReason)) {
    list = setCondition(list, input, generation, now);
  }
  return list;
}
