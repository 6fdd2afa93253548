/**
 * Crash windows for the operator's SIGKILL tests, with the same contract as core/crash.ts: when
 * FLASHSALE_CRASH_POINT names a point, the process kills itself with SIGKILL there (no cleanup, no
 * lease release, no status write) the Nth time it passes (FLASHSALE_CRASH_AFTER, default 1).
 * Each point sits right after a side effect and before the status records it, which is exactly
 * where a crash is hardest to recover from. Production never sets these variables.
 */
const point = process.env.FLASHSALE_CRASH_POINT ?? '';
const after = Math.max(1, Number(process.env.FLASHSALE_CRASH_AFTER ?? '1') || 1);
let hits = 0;

export type OperatorCrashPoint =
  | 'operator-after-finalizer'
  | 'operator-after-topics'
  | 'operator-after-load'
  | 'operator-after-open-gate'
  | 'operator-after-close-gate'
  | 'operator-after-drain'
  | 'operator-after-freeze'
  | 'operator-after-write-back'
  | 'operator-after-cleanup';

export function crashPoint(name: OperatorCrashPoint): void {
  if (point !== name) return;
  hits += 1;
  if (hits >= after) process.kill(process.pid, 'SIGKILL');
}
