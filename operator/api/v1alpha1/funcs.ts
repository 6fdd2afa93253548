/**
 * Behaviour that belongs to the API types: durations, the activity id, the schedule, replicas per
 * phase. Pure functions; no I/O.
 */
import type { FlashSaleActivity, FlashSaleActivitySpec, Phase, RoleReplicas, RuntimeRole } from './types.js';
import { Phase as P } from './types.js';

const DURATION = /^(?:\d+(?:ms|s|m|h))+$/;
const PART = /(\d+)(ms|s|m|h)/g;
const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** Parses the CRD's duration strings (`15m`, `1h30m`, `90s`, `500ms`) into milliseconds. */
export function parseDuration(text: string): number {
  if (!DURATION.test(text)) throw new Error(`invalid duration "${text}" (use e.g. 15m, 1h30m, 90s)`);
  let ms = 0;
  for (const m of text.matchAll(PART)) ms += Number(m[1]) * (UNIT_MS[m[2] ?? 's'] ?? 0);
  return ms;
}

/**
 * The id of the activity in Redis keys, Kafka topics and PostgreSQL rows: spec.activityId, or
 * `<namespace>.<name>-<first 8 hex of the uid>`. The uid part keeps a re-created resource of the
 * same name from inheriting the previous one's write-back fence, results and topics.
 */
export function activityIdOf(fsa: Pick<FlashSaleActivity, 'metadata' | 'spec'>): string {
  if (fsa.spec.activityId) return fsa.spec.activityId;
  const base = `${fsa.metadata.namespace}.${fsa.metadata.name}`.slice(0, 54);
  const uid = fsa.metadata.uid.replace(/-/g, '').slice(0, 8).toLowerCase();
  return `${base}-${uid}`;
}

export const DEFAULT_WARM_UP_LEAD_MS = 5 * 60_000;

export interface EffectiveSchedule {
  warmUpAt: Date;
  startAt: Date;
  endAt: Date;
}

export function scheduleOf(
  spec: FlashSaleActivitySpec,
  defaultLeadMs = DEFAULT_WARM_UP_LEAD_MS,
): EffectiveSchedule {
  const startAt = new Date(spec.schedule.startAt);
  const endAt = new Date(spec.schedule.endAt);
  const warmUpAt = spec.schedule.warmUpAt
    ? new Date(spec.schedule.warmUpAt)
    : new Date(
        startAt.getTime() -
          (spec.schedule.warmUpLead ? parseDuration(spec.schedule.warmUpLead) : defaultLeadMs),
      );
  return { warmUpAt, startAt, endAt };
}

const ZERO: RoleReplicas = { api: 0, relay: 0, consumer: 0 };

/** Replicas of each runtime role in a phase, from spec.runtime.replicas. */
export function replicasFor(spec: FlashSaleActivitySpec, phase: Phase): RoleReplicas {
  const r = spec.runtime.replicas;
  switch (phase) {
    case P.WarmingUp:
    case P.Ready:
      return { ...r.warmUp };
    case P.Active:
      return { ...r.active };
    case P.Draining:
    case P.WritingBack:
    case P.CleaningUp:
    case P.Settling:
      // Orders outlive the sale: in Settling the activity's roles keep their draining size (its
      // consumer runs the sweeper, its api answers buyers) until nothing is left to settle.
      return { ...r.draining };
    case P.Pending:
    case P.Completed:
    case P.Failed:
      return { ...ZERO };
  }
}

export function deploymentName(activityName: string, role: RuntimeRole): string {
  return `${activityName}-${role}`;
}

export function objectKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

export function splitKey(key: string): { namespace: string; name: string } {
  const i = key.indexOf('/');
  return { namespace: key.slice(0, i), name: key.slice(i + 1) };
}
