/**
 * The size of V8's young generation per runtime role, which must be given on the process's command
 * line: V8 sizes its semi-spaces when the isolate is created, so `v8.setFlagsFromString()` at start
 * does not resize them (docs/benchmarks.md, "Memory"), and the runtime image's NODE_OPTIONS
 * (`--max-semi-space-size=8`, the Dockerfile) is the same for every role. The operator puts a
 * role's value on its container's command line (operator/reconcile/runtime-objects.ts), where it
 * takes precedence over NODE_OPTIONS, and `make bench` starts the roles the same way.
 *
 * The api keeps the image's 8 MiB: it bounds the api's peak RSS at little CPU (runtime/v8-tuning.ts).
 * The relay and the consumer allocate per message (Kafka records, Redis stream entries, the SQL
 * arrays of a batch) and hold their batch alive across several awaits, so with 8 MiB semi-spaces
 * much of it survived two scavenges and was promoted: 32 MiB took the drain of a 100,000-order
 * backlog from 15,582 to 18,405 orders/s (medians of 5 runs) and the whole pipeline's CPU per
 * order from 115 to 96 µs, for about 50 MB more peak RSS per pod (docs/benchmarks.md, "The
 * pipeline's young generation, and a quiet PostgreSQL"). Since the roles also let their old
 * generation grow 2x between full collections (runtime/v8-tuning.ts), 16 MiB costs the same CPU per
 * order as 32 (the whole pipeline's 125 against 130 µs, medians of six alternating rounds, each
 * size ahead in three) for about 35 MB less peak RSS per pod (bench/analysis.md, "The pipeline's
 * full collections").
 */
export type YoungGenerationRole = 'api' | 'relay' | 'consumer';

/** MiB per semi-space; 0 = the image's NODE_OPTIONS decides. */
export const DEFAULT_SEMI_SPACE_MIB: Readonly<Record<YoungGenerationRole, number>> = {
  api: 0,
  relay: 16,
  consumer: 16,
};

/** The setting's bound: three semi-spaces of 256 MiB already exceed a pod of the chart's default 512Mi. */
export const MAX_SEMI_SPACE_MIB = 256;

/** The node arguments that give a process `mib` MiB semi-spaces (none for 0). */
export function semiSpaceArgs(mib: number): string[] {
  return mib > 0 ? [`--max-semi-space-size=${mib}`] : [];
}

/** A role's node arguments: its configured semi-space, else the role's default. */
export function roleSemiSpaceArgs(role: YoungGenerationRole, configuredMib: number | undefined): string[] {
  return semiSpaceArgs(configuredMib ?? DEFAULT_SEMI_SPACE_MIB[role]);
}
