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
 * connections). Without pretenuring the api took 0.73x the CPU per reservation and 0.70x per
 * sold-out answer at 200 connections, and 0.97x / 0.99x at 50 (bench/ab.ts, bench/analysis.md). What the api keeps for long (the policies, the
 * metrics, the connections) is small and is simply copied once more by the scavenger.
 *
 * The api also sets how far its old generation may grow between full collections. V8 chooses that
 * factor from the heap limit: up to 4x the live size above a 2 GiB limit, at most 1.3x at the
 * 256 MiB a 512Mi pod gets, where the api (about 20 MB live) collects every 6 MB or so. A factor of
 * 2 took 0.92x and 0.87x of the CPU per reservation in that heap (two A/Bs at 50 connections) for a
 * peak RSS of 1.5x idle (146-148 MB, from 126-132); 3x was no cheaper (0.91x) and peaked at 1.67x.
 * V8 still collects harder as the heap nears its limit, so a pod's limit keeps its meaning.
 *
 * The relay and the consumer set the same factor for themselves. Their large semi-spaces
 * (core/young-generation.ts) count into V8's limit too: after each full collection it allowed the
 * live size times 1.3 plus a young generation's worth, and started marking again once less than
 * a young generation's worth was left, i.e. after the next 7-10 MB promoted with 32 MiB
 * semi-spaces. In the drain of a 100,000-order backlog that was 60 full collections of the
 * consumer in 6 s at 22 MB live; with 2x, 4-7. The relay's CPU per order went from 18.6 to
 * 13.9 µs and the consumer's from 37.6 to 29.9 µs (medians of four alternating rounds) for 13-26 MB
 * more peak RSS each; 4x was no cheaper and peaked 40-60 MB higher (bench/analysis.md, "The
 * pipeline's full collections"). With 2x, 16 MiB semi-spaces cost what 32 did, and are now the
 * roles' default.
 *
 * The young generation's size cannot be set here (V8 sizes it when the isolate is created): it is
 * given per role on the command line, core/young-generation.ts.
 */
import { setFlagsFromString } from 'node:v8';
import type { Role } from './config.js';

export interface V8Tuning {
  /** API_V8_PRETENURING (runtime/config.ts); default false. */
  API_V8_PRETENURING: boolean;
  /** API_V8_HEAP_GROWING_PERCENT (runtime/config.ts); default 100, 0 = V8's own. */
  API_V8_HEAP_GROWING_PERCENT: number;
  /** RELAY_V8_HEAP_GROWING_PERCENT (runtime/config.ts); default 100, 0 = V8's own. */
  RELAY_V8_HEAP_GROWING_PERCENT: number;
  /** CONSUMER_V8_HEAP_GROWING_PERCENT (runtime/config.ts); default 100, 0 = V8's own. */
  CONSUMER_V8_HEAP_GROWING_PERCENT: number;
}

/** The role's old-generation growing factor in percent; 0 = V8's own (every other role). */
function heapGrowingPercent(role: Role, cfg: V8Tuning): number {
  switch (role) {
    case 'api':
      return cfg.API_V8_HEAP_GROWING_PERCENT;
    case 'relay':
      return cfg.RELAY_V8_HEAP_GROWING_PERCENT;
    case 'consumer':
      return cfg.CONSUMER_V8_HEAP_GROWING_PERCENT;
    default:
      return 0;
  }
}

/** The V8 flags a role's process sets for itself. */
export function v8FlagsFor(role: Role, cfg: V8Tuning): string[] {
  const growing = heapGrowingPercent(role, cfg);
  return [
    ...(role === 'api' && !cfg.API_V8_PRETENURING ? ['--no-allocation-site-pretenuring'] : []),
    ...(growing > 0 ? [`--heap-growing-percent=${growing}`] : []),
  ];
}

/** Sets the role's V8 flags; returns them (for the start log). */
export function applyV8Tuning(role: Role, cfg: V8Tuning): string[] {
  const flags = v8FlagsFor(role, cfg);
  for (const flag of flags) setFlagsFromString(flag);
  return flags;
}
