// Outcomes of scenario runs, appended as JSON lines to FAULT_RESULTS (set by test/faults/run.sh,
// which turns them into docs/faults-report.md). Without the variable nothing is written.
import { appendFileSync } from 'node:fs';
import type { Violation } from './invariants.js';

export interface RunRecord {
  scenario: string;
  seed?: number;
  outcome: 'pass' | 'fail';
  ms: number;
  detail?: string;
  violations?: Violation[];
  /** Measured figures shown in the report (latencies, shares). */
  figures?: Record<string, number | string>;
}

export function recordRun(r: RunRecord): void {
  const file = process.env.FAULT_RESULTS;
  if (!file) return;
  appendFileSync(file, `${JSON.stringify(r)}\n`);
}

/** Runs fn, records pass/fail with its duration (and figures of a pass), and rethrows a failure. */
export async function recorded<T>(
  scenario: string,
  seed: number | undefined,
  fn: () => Promise<T>,
  figuresOf?: (v: T) => Record<string, number | string>,
): Promise<T> {
  const t0 = Date.now();
  try {
    const v = await fn();
    recordRun({
      scenario,
      ...(seed !== undefined ? { seed } : {}),
      outcome: 'pass',
      ms: Date.now() - t0,
      ...(figuresOf ? { figures: figuresOf(v) } : {}),
    });
    return v;
  } catch (err) {
    recordRun({
      scenario,
      ...(seed !== undefined ? { seed } : {}),
      outcome: 'fail',
      ms: Date.now() - t0,
      detail: String(err instanceof Error ? err.message : err).slice(0, 2000),
    });
    throw err;
  }
}
