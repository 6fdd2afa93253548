/**
 * V8 settings a role applies to its own process, before it takes traffic. They are set here rather
 * than on the image's command line so that every way of starting a role (the operator's pods, the
 * chart's after-sale Deployment, `make run`, the bench) runs with them, and only the roles they
 * were measured for get them.
 *
 * The api: V8's allocation-site pretenuring watches, at each young-generation collection, how many
 * objects of an allocation site are still alive, and from a high share on allocates that site's
 * objects directly in the old generation. An api under load always has its requests in flight, so
 * when requests take longer (more connections, a busy machine) the sites of a request's objects
 * (express' layers, the HTTP parser's, ioredis' commands) cross that share and are pretenured:
 * 14.4 kB of every request's 35.5 kB then died in the old generation instead of 3.9 kB, and the
 * 256 MiB heap limit of a 512Mi pod (V8 grows the old generation by at most 1.3x its live size
 * there) needed 66 full collections instead of 25 in the same 8 s (bench/heap-sample.ts, 200
 * connections). Without pretenuring the api took 0.80x the CPU per reservation at 200 connections
 * and 0.97x at 50 (bench/ab.ts, docs/benchmarks.md). What the api keeps for long (the policies, the
 * metrics, the connections) is small and is simply copied once more by the scavenger.
 */
import { setFlagsFromString } from 'node:v8';
import type { Role } from './config.js';

export interface V8Tuning {
  /** API_V8_PRETENURING (runtime/config.ts); default false. */
  API_V8_PRETENURING: boolean;
}

/** The V8 flags a role's process sets for itself. */
export function v8FlagsFor(role: Role, cfg: V8Tuning): string[] {
  if (role === 'api' && !cfg.API_V8_PRETENURING) return ['--no-allocation-site-pretenuring'];
  return [];
}

/** Sets the role's V8 flags; returns them (for the start log). */
export function applyV8Tuning(role: Role, cfg: V8Tuning): string[] {
  const flags = v8FlagsFor(role, cfg);
  for (const flag of flags) setFlagsFromString(flag);
  return flags;
}
