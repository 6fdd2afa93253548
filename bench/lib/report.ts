/** Renders the results as docs/benchmarks.md: the summary table first, then the details. */
import { renderDurability } from './durability.js';
import type { DurabilityResult } from './durability.js';
import type { FairnessRun } from './fairness.js';
import type { FloorResults, PairedResults } from './floors.js';
import { renderBuckets } from './buckets.js';
import type { BucketsResult } from './buckets.js';
import type { LoadResult } from './http-load.js';
import type { MicroResult } from './micro.js';
import type { PgbenchResult } from './pg-ref.js';
import type { BacklogResult, PipelineResult } from './pipeline.js';
import type { ProfileSummary } from './profile.js';
import type { RedisRefResult } from './redis-ref.js';
import type { HeapBreakdown } from './runtime.js';
import type { WarmupResult, WarmupRun } from './warmup.js';
import { median } from './util.js';

export interface RunMeta {
  date: string;
  commit: string;
  dirty: string[];
  cpus: number;
  cpuModel: string;
  memGiB: number;
  node: string;
  /** NODE_OPTIONS of the api and the floors: the image's and the pod's heap limit (bench/lib/runtime.ts podEnv). */
  apiNodeOptions?: string;
  /** The node arguments of the relay's and the consumer's command lines (podNodeArgs). */
  pipelineNodeArgs?: { relay: string[]; consumer: string[] };
  loadBefore: number;
  loadAfter: number;
  /** Share of the run during which some task waited for a CPU (/proc/pressure/cpu). */
  cpuPressurePct: number | undefined;
  otherLoad: string;
  redis: string;
  postgres: Record<string, string>;
  kafka: string;
  servers: string;
  durationS: number;
  warmupS: number;
  connections: number;
  totalS: number;
  command: string;
}

export interface Results {
  meta: RunMeta;
  redisUnpipelined: RedisRefResult[];
  redisPipelined?: RedisRefResult;
  submit?: LoadResult;
  dbOnly?: PgbenchResult;
  soldOut?: LoadResult;
  healthz?: LoadResult;
  /** The same reservation on a bare node:http server and a minimal express route (bench/floors). */
  floors?: FloorResults;
  /** The api and both floors measured in turn, round by round (bench/lib/floors.ts measurePaired). */
  paired?: PairedResults;
  ceiling?: { rowsPerS: number; tps: number };
  ceilingOneClient?: { rowsPerS: number; tps: number };
  pipeline?: PipelineResult;
  /** The drain of a backlog built with the pipeline paused (bench/lib/pipeline.ts backlogDrain). */
  backlog?: BacklogResult;
  warmup?: WarmupResult;
  api?: { idleMb: number; peakMb: number; heap?: HeapBreakdown | undefined };
  profiles: { submit?: ProfileSummary; soldOut?: ProfileSummary };
  micro?: MicroResult[];
  /** Shaping off, then on (bench/lib/fairness.ts). */
  fairness?: FairnessRun[];
  /** The guard's and WAIT's cost (bench/lib/durability.ts). */
  durability?: DurabilityResult;
  /** Stock buckets on a Redis Cluster (bench/lib/buckets.ts). */
  buckets?: BucketsResult;
  failures: Record<string, string>;
}

/** The median of the figures, or undefined for none. */
const medianOf = (xs: number[] | undefined): number | undefined =>
  xs && xs.length > 0 ? median(xs) : undefined;

/** "; rounds api/floor µs: 50/41 (1.22×), …" for a paired row, or nothing without rounds. */
function pairedRounds(p: PairedResults | undefined, floor: 'express' | 'nodeHttp'): string {
  if (!p || p.rounds.length === 0) return '';
  const each = p.rounds.map(
    (x) => `${x.api.toFixed(0)}/${x[floor].toFixed(0)} (${(x.api / x[floor]).toFixed(2)}×)`,
  );
  return `; by round, api/floor µs: ${each.join(', ')}`;
}

const f0 = (x: number | undefined): string =>
  x === undefined || !Number.isFinite(x) ? 'n/a' : Math.round(x).toLocaleString('en-US');
const f1 = (x: number | undefined): string =>
  x === undefined || !Number.isFinite(x) ? 'n/a' : x.toFixed(x < 10 ? 2 : 1);
const ratio = (a: number | undefined, b: number | undefined): string =>
  a === undefined || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || b === 0
    ? 'n/a'
    : `${(a / b).toFixed(a / b < 10 ? 2 : 1)}×`;

type Verdict = 'met' | 'MISSED' | 'n/a' | '—';
const verdict = (ok: boolean | undefined): Verdict => (ok === undefined ? 'n/a' : ok ? 'met' : 'MISSED');
const defined = (...xs: (number | undefined)[]): boolean =>
  xs.every((x) => x !== undefined && Number.isFinite(x));

export function meanRef(rs: RedisRefResult[]): RedisRefResult | undefined {
  if (rs.length === 0) return undefined;
  const avg = (f: (r: RedisRefResult) => number): number => rs.reduce((a, r) => a + f(r), 0) / rs.length;
  return {
    rps: avg((r) => r.rps),
    p50Ms: avg((r) => r.p50Ms),
    p99Ms: avg((r) => r.p99Ms),
    calls: rs.reduce((a, r) => a + r.calls, 0),
    reservedRatio: avg((r) => r.reservedRatio),
    redisCpuUs: avg((r) => r.redisCpuUs),
  };
}

export interface TargetCheck {
  figure: string;
  target: string;
  verdict: Verdict;
  detail: string;
}

export function targets(r: Results): TargetCheck[] {
  const ref = meanRef(r.redisUnpipelined);
  const submit = r.submit?.okRps;
  const out: TargetCheck[] = [];
  const push = (figure: string, target: string, ok: boolean | undefined, detail: string): void => {
    out.push({ figure, target, verdict: verdict(ok), detail });
  };
  push(
    'submit vs unpipelined EVALSHA',
    '≥ 50 %',
    defined(submit, ref?.rps) ? submit! >= 0.5 * ref!.rps : undefined,
    ratio(submit, ref?.rps),
  );
  push(
    'submit vs database-only',
    '≥ 20×',
    defined(submit, r.dbOnly?.tps) ? submit! >= 20 * r.dbOnly!.tps : undefined,
    ratio(submit, r.dbOnly?.tps),
  );
  const apiUs = r.submit?.cpu?.api;
  const fl = r.floors;
  push(
    'api CPU per reservation vs the express floor',
    '≤ 1.25×',
    defined(apiUs, fl?.express?.cpu?.api) ? apiUs! <= 1.25 * fl!.express!.cpu!.api! : undefined,
    ratio(apiUs, fl?.express?.cpu?.api),
  );
  push(
    'api CPU per reservation vs the node:http floor',
    '≤ 4×',
    defined(apiUs, fl?.nodeHttp?.cpu?.api) ? apiUs! <= 4 * fl!.nodeHttp!.cpu!.api! : undefined,
    ratio(apiUs, fl?.nodeHttp?.cpu?.api),
  );
  const paired = r.paired;
  push(
    'api CPU per reservation vs the express floor, paired rounds',
    '≤ 1.25×',
    paired && Number.isFinite(paired.apiOverExpress) ? paired.apiOverExpress <= 1.25 : undefined,
    paired ? `${paired.apiOverExpress.toFixed(2)}×` : '—',
  );
  push(
    'api CPU per reservation vs the node:http floor, paired rounds',
    '≤ 4×',
    paired && Number.isFinite(paired.apiOverNodeHttp) ? paired.apiOverNodeHttp <= 4 : undefined,
    paired ? `${paired.apiOverNodeHttp.toFixed(2)}×` : '—',
  );
  push(
    'api CPU per sold-out answer vs per reservation',
    '≤ 0.6×',
    defined(r.soldOut?.cpu?.api, apiUs) ? r.soldOut!.cpu!.api! <= 0.6 * apiUs! : undefined,
    ratio(r.soldOut?.cpu?.api, apiUs),
  );
  push(
    'api CPU per /healthz vs the node:http floor',
    '≤ 2×',
    defined(r.healthz?.cpu?.api, fl?.nodeHttpHealthz?.cpu?.api)
      ? r.healthz!.cpu!.api! <= 2 * fl!.nodeHttpHealthz!.cpu!.api!
      : undefined,
    ratio(r.healthz?.cpu?.api, fl?.nodeHttpHealthz?.cpu?.api),
  );
  push(
    'submit p99 vs EVALSHA p99',
    '≤ 3×',
    defined(r.submit?.p99Ms, ref?.p99Ms) ? r.submit!.p99Ms <= 3 * ref!.p99Ms : undefined,
    ratio(r.submit?.p99Ms, ref?.p99Ms),
  );
  push(
    'sold-out vs submit',
    '≥ 2×',
    defined(r.soldOut?.rps, submit) ? r.soldOut!.rps >= 2 * submit! : undefined,
    ratio(r.soldOut?.rps, submit),
  );
  push(
    'pipeline vs PostgreSQL ceiling',
    '≥ 30 %',
    defined(r.pipeline?.pipelineRate, r.ceiling?.rowsPerS)
      ? r.pipeline!.pipelineRate >= 0.3 * r.ceiling!.rowsPerS
      : undefined,
    ratio(r.pipeline?.pipelineRate, r.ceiling?.rowsPerS),
  );
  // The drain of a backlog of N reservations when it was measured (the pipeline paused while they
  // were created); otherwise the part left over after a burst the pipeline ran alongside.
  const drainRate = r.backlog ? r.backlog.drainRate : r.pipeline?.drainRate;
  push(
    'drain rate vs PostgreSQL ceiling',
    '≥ 0.3×',
    defined(drainRate, r.ceiling?.rowsPerS) ? drainRate! >= 0.3 * r.ceiling!.rowsPerS : undefined,
    `${ratio(drainRate, r.ceiling?.rowsPerS)}${r.backlog ? ` (backlog of ${f0(r.backlog.n)})` : ''}`,
  );
  push(
    `drain of ${f0(r.pipeline?.n)}`,
    '< 10 s',
    defined(r.pipeline?.drainS) ? r.pipeline!.drained && r.pipeline!.drainS < 10 : undefined,
    `${r.pipeline && !r.pipeline.drained ? 'not drained after ' : ''}${f1(r.pipeline?.drainS)} s`,
  );
  push(
    `warm-up of ${f0(r.warmup?.skus)} SKUs`,
    '≤ 1.1× raw HSET + SADD',
    defined(r.warmup?.loadS, r.warmup?.rawS) ? r.warmup!.loadS <= 1.1 * r.warmup!.rawS : undefined,
    `${f1(r.warmup?.loadS)} s (${ratio(r.warmup?.loadS, r.warmup?.rawS)})`,
  );
  push(
    'api peak RSS',
    '≤ 1.6× idle',
    defined(r.api?.peakMb, r.api?.idleMb) ? r.api!.peakMb <= 1.6 * r.api!.idleMb : undefined,
    `${f0(r.api?.peakMb)} MB (${ratio(r.api?.peakMb, r.api?.idleMb)} idle)`,
  );
  // The least fair of the runs with shaping on (bots flooding early, or starting at the opening).
  const on = r.fairness
    ?.filter((x) => x.shaping === 'on')
    .sort((x, y) => x.ratio - y.ratio || y.bots.worstUse - x.bots.worstUse)[0];
  push(
    'fairness: honest share vs fair share, shaping on',
    '≥ 0.9×',
    defined(on?.ratio) ? on!.ratio >= 0.9 : undefined,
    `${f1(on?.ratio)}×`,
  );
  push(
    'fairness: bot requests past the limiter per account and window, shaping on',
    '≤ per-account limit',
    defined(on?.bots.worstUse) ? on!.bots.worstUse <= 1 : undefined,
    `${f0(on?.bots.maxPassedPerAccount)} over ${f0(on?.bots.windows)} window(s) (limit ${f0(on?.bots.limit)} per window)`,
  );
  return out;
}

/** The fairness section (also usable alone, e.g. for a report of a `BENCH_ONLY=fairness` run). */
export function renderFairness(runs: FairnessRun[] | undefined): string[] {
  if (!runs || runs.length === 0) return [];
  const codes = (c: Record<string, number>): string =>
    Object.entries(c)
      .sort((a, b) => b[1] - a[1])
      .map(([k, n]) => `${k}: ${f0(n)}`)
      .join(', ');
  const first = runs[0]!;
  const L: string[] = [
    '### 7. Fairness under bots (shaping off and on, same run)',
    '',
    `Stock ${f0(first.stock)} units, limit 1 per buyer. Honest buyers click once in the first second of the sale ` +
      '(a second click only after an answer that says nothing about stock); 20 bot accounts send 50 requests/s each ' +
      'from their own addresses; one address drives 200 accounts at 1,000 requests/s; the flood starts before the ' +
      'opening (a third run: from the opening, bots that keep their budget for it). Stock is smaller than the honest demand. "off" is the api with no limiter and no shedding; "on" ' +
      'is the per-buyer default (20 per 10 s), a per-address limit of 20 per 10 s set on the activity, and the ' +
      'default admission control. Client addresses come from X-Forwarded-For (API_TRUST_PROXY=1). ' +
      'The load generator runs in the benchmark process on the same machine (the flood in a worker thread): "late sends" counts requests ' +
      'that left more than 100 ms after their planned instant. Honest buyers, bots and the farm each have their own ' +
      'client connections (1,000, 256, 256).',
    '',
    '| Shaping | Honest won | Bots won | Farm won | Honest share | Fair share | Ratio (target ≥ 0.9× on) | Honest p50 / p99 ms | Inside the api p50 / p99 ms (loop delay p99) | Most past limiter, one bot (windows × limit) | Farm past limiter | Late sends |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...runs.map(
      (x) =>
        `| ${x.shaping}, flood from ${f1(x.leadS ?? 1.5)} s before the opening | ${f0(x.won.honest)} | ${f0(x.won.bots)} | ${f0(x.won.farm)} | ${x.honestShare.toFixed(3)} | ` +
        `${x.fairShare.toFixed(3)} | ${ratio(x.honestShare, x.fairShare)} | ${f0(x.honest.p50Ms)} / ${f0(x.honest.p99Ms)} | ` +
        `${f1(x.server?.p50Ms)} / ${f1(x.server?.p99Ms)} (${f0(x.server?.loopDelayP99Ms)}) | ` +
        `${f0(x.bots.maxPassedPerAccount)} (${x.shaping === 'on' ? `${f0(x.bots.windows)} × ${f0(x.bots.limit)}` : 'no limit'}) | ${f0(x.farm.passed)} | ${f0(x.lateSends)} |`,
    ),
    '',
    ...runs.flatMap((x) => [
      `- ${x.shaping} (flood from ${f1(x.leadS ?? 1.5)} s before): honest answers ${codes(x.honest.statusCounts)}; bots ${codes(x.bots.statusCounts)}; ` +
        `farm ${codes(x.farm.statusCounts)}.`,
    ]),
  ];
  return L;
}

function share(p: ProfileSummary | undefined, name: string): number | undefined {
  return p?.byOwner.find((s) => s.name === name)?.pct;
}

const pct = (x: number | undefined): string => (x === undefined ? 'n/a' : `${x.toFixed(0)} %`);

/** The measured runs behind two medians, e.g. "; medians of runs 42, 51, 44 / 37, 37, 38 µs". */
function rounds(a: LoadResult | undefined, b: LoadResult | undefined): string {
  const list = (r: LoadResult | undefined): string =>
    r?.cpuRounds?.map((x) => x.toFixed(0)).join(', ') ?? 'n/a';
  return a?.cpuRounds || b?.cpuRounds ? `; medians of the runs ${list(a)} / ${list(b)} µs` : '';
}

/** For each missed target, the figures of this run that explain it. */
export function reasons(r: Results): string[] {
  const out: string[] = [];
  const missed = new Set(
    targets(r)
      .filter((t) => t.verdict === 'MISSED')
      .map((t) => t.figure.replace(/ of .*/, '')),
  );
  const ref = meanRef(r.redisUnpipelined);
  const sub = r.submit;
  const jwt = share(r.profiles.submit, 'npm: fast-jwt');
  const express =
    (share(r.profiles.submit, 'npm: express') ?? 0) + (share(r.profiles.submit, 'npm: router') ?? 0);
  if (missed.has('submit vs unpipelined EVALSHA') && sub?.cpu?.api && ref) {
    out.push(
      `Submit vs EVALSHA: one POST costs the api ${f0(sub.cpu.api)} µs of CPU (plus ${f0(sub.cpu.loadgen)} µs for the load ` +
        `generator on the same cores), one reserve call costs Redis ${f0(ref.redisCpuUs)} µs: the api needs ` +
        `${(sub.cpu.api / ref.redisCpuUs).toFixed(1)}× the CPU of Redis per reservation. One single-threaded api process ` +
        `on an equal share of CPU can therefore reach about ${((100 * ref.redisCpuUs) / sub.cpu.api).toFixed(0)} % of the ` +
        `EVALSHA rate; 50 % needs the api's cost within 2× of Redis', or more api processes on more cores than this ` +
        `machine has (Redis, the api and the load generator share ${r.meta.cpus}). In the profile, JWT verification ` +
        `(fast-jwt) takes ${pct(jwt)} and express + router ${pct(express)} of the api's CPU.`,
    );
  }
  if (missed.has('submit vs database-only') && sub && r.dbOnly) {
    out.push(
      `Submit vs database-only: the database-only transaction is bounded by commit latency on one hot row ` +
        `(p50 ${f1(r.dbOnly.p50Ms)} ms with ${r.meta.connections} clients queued on the row lock) and uses little CPU, ` +
        `so CPU starvation hardly slows it; the api is CPU-bound (${f0(sub.cpu?.api)} µs per request, i.e. at most ` +
        `${f0(sub.cpu?.api ? 1e6 / sub.cpu.api : undefined)} req/s per CPU-second it gets), and on this machine it got ` +
        `${sub.cpu?.api ? ((sub.okRps * sub.cpu.api) / 1e6).toFixed(2) : 'n/a'} CPU-seconds per second.`,
    );
  }
  const soldOutMissed =
    missed.has('sold-out vs submit') || missed.has('api CPU per sold-out answer vs per reservation');
  if (soldOutMissed && r.soldOut && sub) {
    const fl = r.floors;
    out.push(
      `Sold-out: a sold-out answer still needs Redis (lua/soldOutChecks-var.lua: the replay rule, so a ` +
        `buyer who reserved earlier gets the reservation back, and the buyer's rate-limit window), in one call shared ` +
        `by the sold-out answers of one turn of the api's event loop, and costs the api ` +
        `${f0(r.soldOut.cpu?.api)} µs of CPU against ${f0(sub.cpu?.api)} µs for a reservation: the token check, the ` +
        `body, node's HTTP server and express cost what they cost for any request (GET /healthz: ` +
        `${f0(r.healthz?.cpu?.api)} µs). The floors answer the same sold-out SKU with one reserve call and none of ` +
        `the api's own work: ${f0(fl?.expressSoldOut?.cpu?.api)} vs ${f0(fl?.express?.cpu?.api)} µs on the express ` +
        `floor (${ratio(fl?.expressSoldOut?.cpu?.api, fl?.express?.cpu?.api)}), ${f0(fl?.nodeHttpSoldOut?.cpu?.api)} ` +
        `vs ${f0(fl?.nodeHttp?.cpu?.api)} µs on the node:http floor ` +
        `(${ratio(fl?.nodeHttpSoldOut?.cpu?.api, fl?.nodeHttp?.cpu?.api)}), where sold-out req/s is ` +
        `${ratio(fl?.nodeHttpSoldOut?.rps, fl?.nodeHttp?.rps)} of submit req/s: a server that makes one Redis call ` +
        `per sold-out answer spends about what a reservation costs on it. What the shared call leaves is the ` +
        `request's own cost (HTTP, token, body, express) and its share of the call.`,
    );
  }
  const p = r.pipeline;
  if (missed.has('pipeline vs PostgreSQL ceiling') && p && r.ceiling) {
    const inKafka = p.backlogAtClose.missingOrders - p.backlogAtClose.halfMessages;
    out.push(
      `Pipeline: at gate close ${f0(p.backlogAtClose.halfMessages)} of the ${f0(p.backlogAtClose.missingOrders)} ` +
        `reservations without an order were still in the Redis stream (relay side) and ${f0(inKafka)} in Kafka ` +
        `(consumer side). During the burst the pipeline moved ${f0(p.pipelineRate)} rows/s; once the burst had ` +
        `ended it drained ${f0(p.backlogAtClose.missingOrders)} orders in ${f1(p.drainS)} s, ` +
        `${f0(p.drainS > 0 ? p.backlogAtClose.missingOrders / p.drainS : undefined)} rows/s ` +
        `(${ratio(p.drainS > 0 ? p.backlogAtClose.missingOrders / p.drainS : undefined, r.ceiling.rowsPerS)} of the ` +
        `ceiling): during the burst the load generator and Redis take their share of the machine's ` +
        `${r.meta.cpus} cores from Kafka, the relay and the consumer.` +
        (p.profiles?.relay
          ? ` The relay was idle ${((100 * p.profiles.relay.idleMs) / p.profiles.relay.totalMs).toFixed(0)} % and the consumer ` +
            `${((100 * (p.profiles.consumer?.idleMs ?? 0)) / (p.profiles.consumer?.totalMs ?? 1)).toFixed(0)} % of the run; ` +
            `kafkajs (message encoding) took ${pct(share(p.profiles.relay, 'npm: kafkajs'))} of the relay's busy time.`
          : ''),
    );
  }
  if (missed.has('drain') && p) {
    out.push(
      `Drain: the burst created ${f0(p.createRate)} reservations/s, the pipeline moved ${f0(p.pipelineRate)}/s, so ` +
        `${f0(p.backlogAtClose.missingOrders)} reservations were still without an order at gate close; draining them ` +
        `at the pipeline's rate takes ${f1(p.backlogAtClose.missingOrders / p.pipelineRate)} s (measured ${f1(p.drainS)} s).`,
    );
  }
  const b = r.backlog;
  if (missed.has('drain rate vs PostgreSQL ceiling') && b && r.ceiling && b.relayedS > 0) {
    const c = b.cpuPerOrderUs;
    const perOrder = (c.relay ?? 0) + (c.consumer ?? 0) + (c.kafka ?? 0) + c.redis + (c.postgres ?? 0);
    const cpuBound = perOrder > 0 ? (r.meta.cpus * 1e6) / perOrder : undefined;
    const relayRate = b.n / b.relayedS;
    out.push(
      `Backlog drain: the relay emptied the stream of ${f0(b.n)} half messages into Kafka in ${f1(b.relayedS)} s ` +
        `(${f0(relayRate)} messages/s, ${ratio(relayRate, r.ceiling.rowsPerS)} of the ceiling, with the consumer ` +
        `working beside it)${relayRate < 0.3 * r.ceiling.rowsPerS ? ', which bounds the drain before the consumer has written a row' : ''}. ` +
        `Per order the drain cost relay ${f0(c.relay)} + consumer ${f0(c.consumer)} + Kafka ${f0(c.kafka)} + Redis ` +
        `${f0(c.redis)}${c.postgres === undefined ? '' : ` + PostgreSQL ${f0(c.postgres)}`} = ${f0(perOrder)} µs of CPU` +
        `${c.postgres === undefined ? " besides PostgreSQL's own work" : ''}; the machine's ${r.meta.cpus} ` +
        `cores allow at most ${f0(cpuBound)} orders/s for that (${ratio(cpuBound, r.ceiling.rowsPerS)} of the ` +
        `ceiling). The pgbench ceiling writes only the orders, with none of these processes, none of the ` +
        `journal, outbox and guard rows the consumer writes per order (at most ` +
        `${f0(r.ceiling.rowsPerS > 0 ? (r.meta.cpus * 1e6) / r.ceiling.rowsPerS : undefined)} µs of the machine's ` +
        `CPU per row there), and no hot SKU's guard row serialising the transactions.`,
    );
  }
  const bare = r.floors?.rss?.['node-http'];
  if (missed.has('api peak RSS') && r.api && bare) {
    const ex = r.floors?.rss?.express;
    out.push(
      `api peak RSS: ${f0(r.api.idleMb)} MB idle, ${f0(r.api.peakMb)} MB after the load ` +
        `(${ratio(r.api.peakMb, r.api.idleMb)}). The floors under the same load, with the same NODE_OPTIONS: ` +
        `bare node:http ${f0(bare.idleMb)} → ${f0(bare.peakMb)} MB (${ratio(bare.peakMb, bare.idleMb)})` +
        (ex ? `, express ${f0(ex.idleMb)} → ${f0(ex.peakMb)} MB (${ratio(ex.peakMb, ex.idleMb)})` : '') +
        `: V8's old generation grows with the allocation rate of any Node server at this request rate, so ` +
        `most of the growth is the runtime's, not the api's.`,
    );
  }
  if (missed.has('warm-up') && r.warmup) {
    const w = r.warmup;
    out.push(
      `Warm-up: loadActivity took ${f1(w.loadS)} s and plain pipelined HSET + SADD of the same SKUs ` +
        `${f1(w.rawS)} s (${ratio(w.loadS, w.rawS)}, medians of ${w.rounds} alternating rounds); Redis CPU ` +
        `${f1(median(w.load.map((x) => x.redisCpuS)))} vs ${f1(median(w.raw.map((x) => x.redisCpuS)))} s: the ` +
        `script's interpreter work on top of the same writes.`,
    );
  }
  return out;
}

function profileTable(p: ProfileSummary): string[] {
  const lines: string[] = [];
  lines.push(
    `Busy ${f0(p.busyMs)} ms of ${f0(p.totalMs)} ms profiled (idle ${((100 * p.idleMs) / p.totalMs).toFixed(0)} %). ` +
      'Shares are of busy time.' +
      (p.cpu
        ? ` On the CPU in the same window (/proc, all threads): ${f0(p.cpu.userMs)} ms in user mode, ` +
          `${f0(p.cpu.sysMs)} ms in the kernel (the profile covers the main thread; this, every thread of ` +
          'the process). Socket writes and reads on loopback carry the kernel side of both ends of the connection.'
        : ''),
    '',
    '| Self time by package / module (natives count for their caller) | ms | share |',
    '|---|---:|---:|',
  );
  for (const s of p.byGroup) lines.push(`| ${s.name} | ${f0(s.ms)} | ${s.pct.toFixed(1)} % |`);
  lines.push(
    '',
    '| Charged to the first package / module of ours on the stack | ms | share |',
    '|---|---:|---:|',
  );
  for (const s of p.byOwner) lines.push(`| ${s.name} | ${f0(s.ms)} | ${s.pct.toFixed(1)} % |`);
  lines.push('', '| Hottest functions (self) | ms | share |', '|---|---:|---:|');
  for (const s of p.topFunctions)
    lines.push(`| \`${s.name.replace(/\|/g, '\\|')}\` | ${f0(s.ms)} | ${s.pct.toFixed(1)} % |`);
  return lines;
}

/** The sentence on PostgreSQL's upkeep before a pipeline measurement (pipeline.ts quiescePostgres). */
function quiesced(seconds: number | undefined, before: string): string {
  return seconds === undefined
    ? `PostgreSQL could not be vacuumed and checkpointed before ${before} (see the log), so its upkeep of earlier phases' rows may fall in the window. `
    : `Before ${before} PostgreSQL vacuumed and analyzed the order tables and checkpointed (${f1(seconds)} s), so its upkeep of the earlier phases' rows falls outside the window. `;
}

export function renderReport(r: Results, analysis: string): string {
  const m = r.meta;
  const ref = meanRef(r.redisUnpipelined);
  const L: string[] = [];
  L.push(
    '# Benchmarks',
    '',
    `Generated by \`${m.command}\` (bench/run.ts) on ${m.date}, commit \`${m.commit}\`` +
      (m.dirty.length ? ` with uncommitted changes in ${m.dirty.join(', ')}` : '') +
      `; the whole run took ${f0(m.totalS)} s. Regenerate with \`make bench\`; never edit the tables by hand.`,
    '',
    `**Machine:** ${m.cpus} cores (${m.cpuModel}), ${m.memGiB} GiB, Node ${m.node}` +
      (m.apiNodeOptions !== undefined
        ? ` (the api and the floors run as in their pods: NODE_OPTIONS \`${m.apiNodeOptions}\`, the image's ` +
          "settings and the heap limit Node derives from the chart's memory limit" +
          (m.pipelineNodeArgs
            ? `; the relay and the consumer also with \`${m.pipelineNodeArgs.relay.join(' ') || '—'}\` and ` +
              `\`${m.pipelineNodeArgs.consumer.join(' ') || '—'}\` on their command lines, as the operator starts them`
            : '') +
          ')'
        : '') +
      `. ${m.otherLoad} ` +
      `Load average ${m.loadBefore.toFixed(1)} at the start, ${m.loadAfter.toFixed(1)} at the end` +
      (m.cpuPressurePct !== undefined
        ? `; some task was waiting for a CPU during ${m.cpuPressurePct.toFixed(0)} % of the run (PSI).`
        : '.') +
      ' Absolute figures drift with that load; each is therefore set beside a reference measured in the same run, ' +
      'on the same servers, moments apart.',
    '',
    `**Servers:** ${m.servers}. Redis ${m.redis}; PostgreSQL ${m.postgres.server_version ?? '?'} ` +
      `(synchronous_commit=${m.postgres.synchronous_commit ?? '?'}, fsync=${m.postgres.fsync ?? '?'}, ` +
      `shared_buffers=${m.postgres.shared_buffers ?? '?'}); Kafka ${m.kafka} (one broker, 4 partitions, acks=all). ` +
      `HTTP load: autocannon, ${m.connections} keep-alive connections, no HTTP pipelining, ${m.warmupS} s warm-up, ` +
      `${m.durationS} s measured; every order request is a distinct buyer (pre-signed HS256 token) with a fresh requestId.`,
    '',
    '## Summary',
    '',
    '| # | Figure | Ours | Reference (same run) | Ratio | Target | Verdict |',
    '|---|---|---:|---:|---:|---|---|',
  );
  const t = Object.fromEntries(targets(r).map((x) => [x.figure.replace(/ of .*/, ''), x]));
  const v = (key: string): string => t[key]?.verdict ?? '—';
  const sub = r.submit;
  L.push(
    `| 1a | Submit: POST orders, 202/s (api role) | ${f0(sub?.okRps)} | ${f0(ref?.rps)} EVALSHA reserve/s, redis-benchmark -c ${m.connections} | ${ratio(sub?.okRps, ref?.rps)} | ≥ 0.5× | ${v('submit vs unpipelined EVALSHA')} |`,
    `| 1b | Submit vs pipelined EVALSHA | ${f0(sub?.okRps)} | ${f0(r.redisPipelined?.rps)} EVALSHA/s, -c ${m.connections} -P 16 | ${ratio(sub?.okRps, r.redisPipelined?.rps)} | — | — |`,
    `| 1c | Submit vs database-only (docs/sources seed 004) | ${f0(sub?.okRps)} | ${f0(r.dbOnly?.tps)} tx/s, pgbench -c ${m.connections} | ${ratio(sub?.okRps, r.dbOnly?.tps)} | ≥ 20× | ${v('submit vs database-only')} |`,
    `| 1d | Submit latency p50 / p99 (ms) | ${f1(sub?.p50Ms)} / ${f1(sub?.p99Ms)} | EVALSHA ${f1(ref?.p50Ms)} / ${f1(ref?.p99Ms)}; database-only ${f1(r.dbOnly?.p50Ms)} / ${f1(r.dbOnly?.p99Ms)} | ${ratio(sub?.p50Ms, ref?.p50Ms)} (p50 vs EVALSHA) | — | — |`,
    `| 2a | Sold-out: POST orders once stock is gone, req/s | ${f0(r.soldOut?.rps)} | ${f0(r.healthz?.rps)} GET /healthz req/s | ${ratio(r.soldOut?.rps, r.healthz?.rps)} | — | — |`,
    `| 2b | Sold-out vs submit | ${f0(r.soldOut?.rps)} | ${f0(sub?.okRps)} submit 202/s | ${ratio(r.soldOut?.rps, sub?.okRps)} | ≥ 2× | ${v('sold-out vs submit')} |`,
    `| 3 | Pipeline: reservations → orders in PostgreSQL, rows/s | ${f0(r.pipeline?.pipelineRate)} | ${f0(r.ceiling?.rowsPerS)} rows/s, 500-row INSERT … ON CONFLICT DO NOTHING, pgbench -c 4 | ${ratio(r.pipeline?.pipelineRate, r.ceiling?.rowsPerS)} | ≥ 0.3× | ${v('pipeline vs PostgreSQL ceiling')} |`,
  );
  const fl = r.floors;
  L.push(
    `| 1e | Submit p99 vs EVALSHA p99 (ms) | ${f1(sub?.p99Ms)} | ${f1(ref?.p99Ms)} | ${ratio(sub?.p99Ms, ref?.p99Ms)} | ≤ 3× | ${v('submit p99 vs EVALSHA p99')} |`,
    `| 1f | api CPU µs per reservation vs the express floor (bench/floors: express route, body read without body-parser, same token check, same EVALSHA)${rounds(sub, fl?.express)} | ${f0(sub?.cpu?.api)} | ${f0(fl?.express?.cpu?.api)} | ${ratio(sub?.cpu?.api, fl?.express?.cpu?.api)} | ≤ 1.25× | ${v('api CPU per reservation vs the express floor')} |`,
    `| 1g | api CPU µs per reservation vs the node:http floor (same token check, same EVALSHA) | ${f0(sub?.cpu?.api)} | ${f0(fl?.nodeHttp?.cpu?.api)} | ${ratio(sub?.cpu?.api, fl?.nodeHttp?.cpu?.api)} | ≤ 4× | ${v('api CPU per reservation vs the node:http floor')} |`,
    `| 1h | api CPU µs per reservation vs the express floor, paired rounds (the api and both floors measured in turn, the order rotating; median of each round's ratio)${pairedRounds(r.paired, 'express')} | ${f0(medianOf(r.paired?.rounds.map((x) => x.api)))} | ${f0(medianOf(r.paired?.rounds.map((x) => x.express)))} | ${r.paired ? `${r.paired.apiOverExpress.toFixed(2)}×` : '—'} | ≤ 1.25× | ${v('api CPU per reservation vs the express floor, paired rounds')} |`,
    `| 1i | api CPU µs per reservation vs the node:http floor, paired rounds${pairedRounds(r.paired, 'nodeHttp')} | ${f0(medianOf(r.paired?.rounds.map((x) => x.api)))} | ${f0(medianOf(r.paired?.rounds.map((x) => x.nodeHttp)))} | ${r.paired ? `${r.paired.apiOverNodeHttp.toFixed(2)}×` : '—'} | ≤ 4× | ${v('api CPU per reservation vs the node:http floor, paired rounds')} |`,
    `| 2c | api CPU µs per sold-out answer vs per reservation${rounds(r.soldOut, sub)} | ${f0(r.soldOut?.cpu?.api)} | ${f0(sub?.cpu?.api)} | ${ratio(r.soldOut?.cpu?.api, sub?.cpu?.api)} | ≤ 0.6× | ${v('api CPU per sold-out answer vs per reservation')} |`,
    `| 2d | api CPU µs per GET /healthz vs the node:http floor's | ${f0(r.healthz?.cpu?.api)} | ${f0(fl?.nodeHttpHealthz?.cpu?.api)} | ${ratio(r.healthz?.cpu?.api, fl?.nodeHttpHealthz?.cpu?.api)} | ≤ 2× | ${v('api CPU per /healthz vs the node:http floor')} |`,
    `| 2e | Sold-out answer vs reservation on the express floor, CPU µs (the same answer with none of the api's own work: one reserve call answering SOLD_OUT) | ${f0(fl?.expressSoldOut?.cpu?.api)} | ${f0(fl?.express?.cpu?.api)} | ${ratio(fl?.expressSoldOut?.cpu?.api, fl?.express?.cpu?.api)} | — | — |`,
    `| 2f | Sold-out answer vs reservation on the node:http floor, CPU µs; sold-out req/s vs submit req/s there: ${ratio(fl?.nodeHttpSoldOut?.rps, fl?.nodeHttp?.rps)} | ${f0(fl?.nodeHttpSoldOut?.cpu?.api)} | ${f0(fl?.nodeHttp?.cpu?.api)} | ${ratio(fl?.nodeHttpSoldOut?.cpu?.api, fl?.nodeHttp?.cpu?.api)} | — | — |`,
    r.backlog
      ? `| 3b | Drain rate after the burst (what was left at gate close), rows/s | ${f0(r.pipeline?.drainRate)} | ${f0(r.ceiling?.rowsPerS)} rows/s ceiling | ${ratio(r.pipeline?.drainRate, r.ceiling?.rowsPerS)} | — | — |`
      : `| 3b | Drain rate after the burst, rows/s | ${f0(r.pipeline?.drainRate)} | ${f0(r.ceiling?.rowsPerS)} rows/s ceiling | ${ratio(r.pipeline?.drainRate, r.ceiling?.rowsPerS)} | ≥ 0.3× | ${v('drain rate vs PostgreSQL ceiling')} |`,
    ...(r.backlog
      ? [
          `| 3c | Drain of a backlog of ${f0(r.backlog.n)} reservations (relay and consumer paused while they were made), rows/s | ${r.backlog.drained ? '' : '> '}${f0(r.backlog.drainRate)} (${f1(r.backlog.drainS)} s) | ${f0(r.ceiling?.rowsPerS)} rows/s ceiling | ${ratio(r.backlog.drainRate, r.ceiling?.rowsPerS)} | ≥ 0.3× | ${v('drain rate vs PostgreSQL ceiling')} |`,
        ]
      : []),
  );
  const lowerBound =
    r.pipeline && r.ceiling ? r.pipeline.backlogAtClose.missingOrders / r.ceiling.rowsPerS : undefined;
  L.push(
    `| 4 | Drain: gate close → zero half messages and zero gap after ${f0(r.pipeline?.n)} reservations, s | ${r.pipeline && !r.pipeline.drained ? '> ' : ''}${f1(r.pipeline?.drainS)} | ${f1(lowerBound)} s to write the backlog at close (${f0(r.pipeline?.backlogAtClose.missingOrders)} orders) at the ceiling | ${ratio(r.pipeline?.drainS, lowerBound)} | < 10 s | ${v('drain')} |`,
    `| 5 | Warm-up: loadActivity of ${f0(r.warmup?.skus)} SKUs, s | ${f1(r.warmup?.loadS)} | ${f1(r.warmup?.rawS)} s raw pipelined HSET + SADD | ${ratio(r.warmup?.loadS, r.warmup?.rawS)} | ≤ 1.1× | ${v('warm-up')} |`,
    `| 6a | Memory: api peak RSS under load, MB | ${f0(r.api?.peakMb)} | ${f0(r.api?.idleMb)} MB idle after start | ${ratio(r.api?.peakMb, r.api?.idleMb)} | ≤ 1.6× | ${v('api peak RSS')} |`,
    `| 6b | Memory: relay peak RSS under load, MB | ${f0(r.pipeline?.rss.relay.peakMb)} | ${f0(r.pipeline?.rss.relay.idleMb)} MB idle | ${ratio(r.pipeline?.rss.relay.peakMb, r.pipeline?.rss.relay.idleMb)} | — | — |`,
    `| 6c | Memory: consumer peak RSS under load, MB | ${f0(r.pipeline?.rss.consumer.peakMb)} | ${f0(r.pipeline?.rss.consumer.idleMb)} MB idle | ${ratio(r.pipeline?.rss.consumer.peakMb, r.pipeline?.rss.consumer.idleMb)} | — | — |`,
  );
  const fOff = r.fairness?.find((x) => x.shaping === 'off');
  const fOn = r.fairness
    ?.filter((x) => x.shaping === 'on')
    .sort((x, y) => x.ratio - y.ratio || y.bots.worstUse - x.bots.worstUse)[0];
  if (fOn || fOff) {
    L.push(
      `| 7a | Fairness: honest share of stock vs fair share, shaping on | ${f1(fOn?.honestShare)} | ${f1(fOn?.fairShare)} fair share; ${f1(fOff?.honestShare)} with shaping off | ${ratio(fOn?.honestShare, fOn?.fairShare)} | ≥ 0.9× | ${v('fairness: honest share vs fair share, shaping on')} |`,
      `| 7b | Fairness: honest p99 latency under the flood, ms | ${f0(fOn?.honest.p99Ms)} | ${f0(fOff?.honest.p99Ms)} ms with shaping off | ${ratio(fOn?.honest.p99Ms, fOff?.honest.p99Ms)} | — | — |`,
      `| 7c | Fairness: most bot requests past the limiter, one account | ${f0(fOn?.bots.maxPassedPerAccount)} | ${f0(fOn?.bots.limit)} per window × ${f0(fOn?.bots.windows)} window(s) spanned | ${fOn ? `${fOn.bots.worstUse.toFixed(2)}×` : 'n/a'} | ≤ 1× | ${v('fairness: bot requests past the limiter per account and window, shaping on')} |`,
    );
  }
  const missed = targets(r).filter((x) => x.verdict === 'MISSED');
  L.push(
    '',
    missed.length === 0
      ? '**Targets missed:** none of those measured.'
      : `**Targets missed:** ${missed.map((x) => `${x.figure} (${x.detail}, target ${x.target})`).join('; ')}.`,
  );
  const why = reasons(r);
  if (why.length > 0) L.push('', '**Measured reasons (this run):**', '', ...why.map((w) => `- ${w}`));
  if (Object.keys(r.failures).length > 0) {
    L.push('', '**Phases that failed in this run:**', '');
    for (const [phase, msg] of Object.entries(r.failures)) L.push(`- ${phase}: ${msg.split('\n')[0]}`);
  }

  L.push('', '## Details', '', '### 1. Submit path', '');
  if (sub) {
    L.push(
      `api: ${f0(sub.total)} responses in ${f1(sub.durationS)} s, status codes ${JSON.stringify(sub.statusCounts)}` +
        `${sub.errors ? `, ${sub.errors} socket errors/timeouts` : ''}; latency avg ${f1(sub.avgMs)} ms.`,
    );
  }
  const cpuRows: string[] = [];
  const cpuRow = (label: string, x: LoadResult | undefined): void => {
    if (x?.cpu) {
      const cap = x.cpu.api ? 1e6 / x.cpu.api : undefined;
      cpuRows.push(
        `| ${label} | ${f0(x.cpu.api)} | ${f0(x.cpu.redis)} | ${f0(x.cpu.loadgen)} | ${f0(cap)} |`,
      );
    }
  };
  cpuRow('submit (POST orders, 202)', sub);
  cpuRow('sold-out (POST orders, 409)', r.soldOut);
  cpuRow('GET /healthz', r.healthz);
  cpuRow('floor: node:http, same token check and EVALSHA (202)', fl?.nodeHttp);
  cpuRow(
    'floor: express route, body read without body-parser, same token check and EVALSHA (202)',
    fl?.express,
  );
  cpuRow('floor: node:http GET /healthz', fl?.nodeHttpHealthz);
  if (ref)
    cpuRows.push(`| EVALSHA reserve (redis-benchmark, 50 clients) | — | ${f0(ref.redisCpuUs)} | — | — |`);
  if (r.redisPipelined) {
    cpuRows.push(`| EVALSHA reserve, -P 16 | — | ${f0(r.redisPipelined.redisCpuUs)} | — | — |`);
  }
  if (cpuRows.length > 0) {
    L.push(
      '',
      'CPU time per request (µs; from /proc/<pid>/stat of the api, INFO cpu of Redis and process.cpuUsage() of the ' +
        'load generator). Throughput on a shared machine depends on how much CPU each process gets; the cost per ' +
        'request does much less, so it is the better figure to compare runs and to find where a request is expensive.',
      '',
      '| Request | api CPU µs | Redis CPU µs | load generator CPU µs | api req/s per CPU-second |',
      '|---|---:|---:|---:|---:|',
      ...cpuRows,
    );
  }
  if (r.redisUnpipelined.length > 0) {
    L.push(
      '',
      `redis-benchmark EVALSHA of the registry's reserve script, 50 clients, unpipelined, measured right before and right after the api run: ` +
        r.redisUnpipelined
          .map(
            (x) =>
              `${f0(x.rps)} ops/s (p50 ${f1(x.p50Ms)} ms, p99 ${f1(x.p99Ms)} ms, ${(100 * x.reservedRatio).toFixed(1)} % of ${f0(x.calls)} calls reserved)`,
          )
          .join(' and ') +
        '; the table uses their mean.',
    );
  }
  if (r.redisPipelined) {
    L.push(
      '',
      `Pipelined (-P 16): ${f0(r.redisPipelined.rps)} ops/s, p50 ${f1(r.redisPipelined.p50Ms)} ms, ` +
        `${(100 * r.redisPipelined.reservedRatio).toFixed(1)} % reserved.`,
    );
  }
  if (r.dbOnly) {
    L.push(
      '',
      `Database-only (pgbench -M prepared, ${m.connections} clients, ${m.durationS} s): BEGIN; UPDATE activity_stock SET remaining = remaining - 1 ` +
        `WHERE … AND remaining >= 1; INSERT INTO orders …; COMMIT — ${f0(r.dbOnly.transactions)} transactions, ${f0(r.dbOnly.tps)} tx/s, ` +
        `p50 ${f1(r.dbOnly.p50Ms)} ms, p99 ${f1(r.dbOnly.p99Ms)} ms, ${r.dbOnly.failed} failed.`,
    );
  }
  L.push('', '### 2. Sold-out path', '');
  if (r.soldOut) {
    L.push(
      `Sold-out: ${f0(r.soldOut.rps)} req/s, p50 ${f1(r.soldOut.p50Ms)} ms, p99 ${f1(r.soldOut.p99Ms)} ms, status codes ${JSON.stringify(r.soldOut.statusCounts)} ` +
        '(each request still authenticates the buyer and validates the body; the process-local flag skips the reserve ' +
        'script, and the sold-out answers of one turn of the event loop share one call for the replay rule and the ' +
        "buyers' windows, lua/soldOutChecks-var.lua).",
    );
  }
  if (r.healthz) {
    L.push(
      '',
      `/healthz: ${f0(r.healthz.rps)} req/s, p50 ${f1(r.healthz.p50Ms)} ms, p99 ${f1(r.healthz.p99Ms)} ms.`,
    );
  }
  L.push('', '### 3–4. Pipeline and drain', '');
  const p = r.pipeline;
  if (p) {
    L.push(
      `${f0(p.n)} reservations were created directly with the reserve script (EVALSHA from the benchmark process, 50 pipelines of 16 in flight, distinct buyers) ` +
        `in ${f1(p.createS)} s (${f0(p.createRate)}/s) while one relay and one consumer process ran. ` +
        quiesced(p.quiescedS, 'the burst') +
        `Pipeline rate = orders counted in PostgreSQL between 10 % and 90 % of the burst: ${f0(p.pipelineRate)} rows/s ` +
        `(${p.backlogged ? 'the backlog never ran dry in that window, so this is the capacity' : 'the backlog ran dry in that window: the rate is bounded by the input'}). ` +
        `At gate close ${f0(p.backlogAtClose.halfMessages)} half messages were in the stream and ${f0(p.backlogAtClose.missingOrders)} reservations had no order yet; ` +
        (p.drained
          ? `drained in ${f1(p.drainS)} s`
          : `NOT drained when the benchmark's time budget ran out, ${f1(p.drainS)} s after gate close`) +
        `; ${f0(p.ordersInPg)} of ${f0(p.n)} reservations are orders in PostgreSQL afterwards` +
        (p.released > 0
          ? ` and ${f0(p.released)} were released by the consumer (refused by the database's buyer-slot key: the compensation path).`
          : '.'),
    );
    const c = p.cpuPerOrderUs;
    L.push(
      '',
      `CPU µs per order from the start of the burst until drained: relay ${f0(c.relay)}, consumer ${f0(c.consumer)}, ` +
        `Kafka broker ${f0(c.kafka)}, Redis ${f0(c.redis)} (the reserve script, the relay's stream reads and ` +
        `acknowledgements). Drain after the burst: ${f0(p.drainRate)} rows/s, ${ratio(p.drainRate, r.ceiling?.rowsPerS)} ` +
        `of the 500-row ceiling.`,
    );
    if (r.ceilingOneClient) {
      L.push(
        '',
        `Ceiling with one client: ${f0(r.ceilingOneClient.rowsPerS)} rows/s (the consumer writes up to CONSUMER_PARTITION_CONCURRENCY = 4 partitions at once, so the four-client figure is the reference).`,
      );
    }
    const step = Math.max(1, Math.floor(p.samples.length / 12));
    L.push(
      '',
      '| t (s) | orders in PostgreSQL | half messages | reservations without order |',
      '|---:|---:|---:|---:|',
    );
    p.samples
      .filter((_, i) => i % step === 0 || i === p.samples.length - 1)
      .forEach((s) =>
        L.push(`| ${s.t.toFixed(1)} | ${f0(s.orders)} | ${f0(s.halfMessages)} | ${f0(s.unconfirmed)} |`),
      );
  }
  const b = r.backlog;
  if (b) {
    const c = b.cpuPerOrderUs;
    L.push(
      '',
      `**Drain of a backlog.** Relay and consumer started and carried 200 orders, then both processes were ` +
        `paused (SIGSTOP) while ${f0(b.n)} reservations were made (${f1(b.createS)} s) and the gate closed; they ` +
        `resumed together (SIGCONT). ` +
        quiesced(b.quiescedS, 'the resume') +
        (b.drained
          ? `Zero half messages and zero gap ${f1(b.drainS)} s later: ${f0(b.drainRate)} rows/s, ` +
            `${ratio(b.drainRate, r.ceiling?.rowsPerS)} of the 500-row ceiling`
          : `NOT drained when the benchmark's time budget ran out, ${f1(b.drainS)} s after the resume`) +
        `; the stream was empty (everything in Kafka) after ${f1(b.relayedS)} s; ${f0(b.ordersInPg)} of ${f0(b.n)} ` +
        `reservations are orders in PostgreSQL afterwards. For this run only the consumer's group session and the ` +
        `relay's reclaim idle time are 300 s, so the pause causes neither a rebalance nor a re-publication. CPU µs ` +
        `per order during the drain: relay ${f0(c.relay)}, consumer ${f0(c.consumer)}, Kafka broker ${f0(c.kafka)}, ` +
        `Redis ${f0(c.redis)}${c.postgres === undefined ? '' : `, PostgreSQL ${f0(c.postgres)}`}. Peak RSS: relay ` +
        `${f0(b.rss.relay.peakMb)} MB (${f0(b.rss.relay.idleMb)} idle), ` +
        `consumer ${f0(b.rss.consumer.peakMb)} MB (${f0(b.rss.consumer.idleMb)} idle).`,
      '',
      '| t (s) after the resume | orders in PostgreSQL | half messages | reservations without order |',
      '|---:|---:|---:|---:|',
    );
    const step = Math.max(1, Math.floor(b.samples.length / 12));
    b.samples
      .filter((_, i) => i % step === 0 || i === b.samples.length - 1)
      .forEach((x) =>
        L.push(`| ${x.t.toFixed(1)} | ${f0(x.orders)} | ${f0(x.halfMessages)} | ${f0(x.unconfirmed)} |`),
      );
  }
  L.push('', '### 5. Warm-up', '');
  if (r.warmup) {
    const w = r.warmup;
    const runs = (xs: WarmupRun[]): string =>
      xs
        .map((x) => `${f1(x.wallS)} s (Redis ${f1(x.redisCpuS)}, client ${f1(x.clientCpuS)} s CPU)`)
        .join('; ');
    L.push(
      `loadActivity of ${f0(w.skus)} SKUs (chunks of 2,000 per script call, 4 in flight): median ${f1(w.loadS)} s; ` +
        `the same hashes written with plain pipelined HSET + SADD (2,000 per pipeline): median ${f1(w.rawS)} s; ` +
        `${w.rounds} rounds, alternating which goes first, each into a fresh activity.`,
      '',
      `- loadActivity: ${runs(w.load)}`,
      `- raw HSET + SADD: ${runs(w.raw)}`,
      `- by round, loadActivity / raw: ${w.load.map((x, i) => ratio(x.wallS, w.raw[i]?.wallS)).join(', ')}`,
    );
  }
  L.push('', '### 6. Memory', '');
  L.push(
    'Peak RSS = VmHWM of the role process (/proc/<pid>/status) at the end of its load phase: the api after the submit, ' +
      'sold-out and /healthz runs; relay and consumer after the pipeline and drain run.',
  );
  const heap = r.api?.heap;
  if (heap) {
    L.push(
      '',
      `api memory right after its load (prom-client default metrics): RSS ${f0(heap.rssMb)} MB; V8 heap spaces committed ` +
        Object.entries(heap.spacesMb)
          .filter(([, mb]) => mb >= 0.5)
          .map(([space, mb]) => `${space} ${f1(mb)} MB`)
          .join(', ') +
        `; external ${f1(heap.externalMb)} MB. The roles run with the runtime image's NODE_OPTIONS ` +
        '(Dockerfile), which caps the young generation ("new"), and the heap limit of their pod\'s memory limit, ' +
        'which bounds how far V8 lets the old generation grow between full collections.',
    );
  }
  if (r.floors?.rss) {
    L.push(
      '',
      'Floors for comparison (bench/floors, same load): ' +
        Object.entries(r.floors.rss)
          .map(
            ([k, v]) =>
              `${k} ${f0(v.idleMb)} MB idle, ${f0(v.peakMb)} MB peak (${ratio(v.peakMb, v.idleMb)})`,
          )
          .join('; ') +
        '.',
    );
  }
  const fair = renderFairness(r.fairness);
  if (fair.length > 0) L.push('', ...fair);
  if (r.buckets) L.push('', ...renderBuckets(r.buckets));
  L.push('', '## Where the time goes (node --cpu-prof of the api)', '');
  if (r.profiles.submit) {
    L.push(
      `### Submit path (${m.durationS} s of load, profiled in a separate api process)`,
      '',
      ...profileTable(r.profiles.submit),
    );
  }
  if (r.profiles.soldOut) {
    L.push('', '### Sold-out path', '', ...profileTable(r.profiles.soldOut));
  }
  if (r.micro && r.micro.length > 0) {
    L.push(
      '',
      '### Per-operation costs (in-process micro-benchmarks)',
      '',
      'Variants of a group run interleaved in one process (7 rounds, median); CPU time includes the libuv ' +
        'threads WebCrypto jobs run on. "proposed" rows are the candidate code of the Analysis section ' +
        '(bench/lib/micro.ts holds it).',
      '',
      '| Group | Variant | CPU µs/op | wall µs/op |',
      '|---|---|---:|---:|',
      ...r.micro.map((x) => `| ${x.group} | ${x.name} | ${x.cpuUs.toFixed(2)} | ${x.wallUs.toFixed(2)} |`),
    );
  }
  if (r.pipeline?.profiles?.relay) {
    L.push(
      '',
      '### Relay during the pipeline run (BENCH_PROFILE_ROLES=1)',
      '',
      ...profileTable(r.pipeline.profiles.relay),
    );
  }
  if (r.pipeline?.profiles?.consumer) {
    L.push('', '### Consumer during the pipeline run', '', ...profileTable(r.pipeline.profiles.consumer));
  }
  if (r.backlog?.profiles?.relay) {
    L.push('', '### Relay during the backlog drain', '', ...profileTable(r.backlog.profiles.relay));
  }
  if (r.backlog?.profiles?.consumer) {
    L.push('', '### Consumer during the backlog drain', '', ...profileTable(r.backlog.profiles.consumer));
  }
  L.push(...renderDurability(r.durability));
  L.push('', analysis.trim(), '');
  return L.join('\n');
}
