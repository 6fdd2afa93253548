/**
 * `make bench`: measures the order path side by side with its physical limits and with the
 * database-only approach, and writes docs/benchmarks.md.
 *
 *   node --import tsx bench/run.ts
 *
 * Starts its own PostgreSQL, Redis and Kafka (test/env/env-up.sh into its own state dir) and stops
 * them at the end, or uses the servers given by DATABASE_URL / REDIS_URL / KAFKA_BROKERS. The
 * runtime roles run from a compiled build (core/ and runtime/, compiled into
 * node_modules/.cache/flashsale-bench/dist, or BENCH_DIST). Knobs (environment):
 *   BENCH_DURATION (10 s per measured run)  BENCH_WARMUP (3 s)  BENCH_CONNECTIONS (50)
 *   BENCH_DRAIN_N (100000)  BENCH_WARMUP_SKUS (100000)  BENCH_WARMUP_ROUNDS (7)  BENCH_BUCKETS_ROUNDS (3)
 *   BENCH_CPU_ROUNDS (3: measured runs of the api's and each floor's submissions, median by CPU)
 *   BENCH_PAIRED_ROUNDS (3: rounds of the api and both floors measured in turn; floors phase)
 *   BENCH_ONLY (phases, comma separated)
 *   BENCH_REDIS_APPENDFSYNC (everysec; 'keep' keeps env-up's setting)  BENCH_OUT  BENCH_JSON
 *   BENCH_STATE_DIR  BENCH_DIST  BENCH_KEEP_PROFILES (directory to copy the .cpuprofile files to)
 *   BENCH_POD_MEMORY (the roles' and floors' pod memory limit, from which their heap limit is derived as
 *   Node does in the pod; default: the chart's runtime.resources; `none`: the host's heap limit)
 *   BENCH_SEMI_SPACE_MIB (`relay=8,consumer=8`: a role's V8 semi-space instead of the chart's
 *   runtime.roles.<role>.semiSpaceMiB or its default, core/young-generation.ts; 0 = the image's)
 * Phases: redis submit db soldout floors profile micro ceiling warmup pipeline backlog (the drain of a
 * backlog built with the pipeline paused) fairness (bench/lib/fairness.ts)
 * capacity (bench/lib/capacity.ts: CPU per operation per stage, written into docs/capacity.md)
 * durability (bench/lib/durability.ts: the PostgreSQL guard's and Redis WAIT's cost)
 * buckets (stock buckets on a Redis Cluster, bench/lib/buckets.ts); opt-in only: kafka-replication
 * (Kafka broker CPU at replication 3 vs 1 on three brokers, bench/lib/kafka-replication.ts).
 * A phase that fails is listed in the report ("Phases that failed in this run") and last in the log,
 * and the run exits 1: its figures are not to be quoted.
 */
import { copyFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import {
  benchItem,
  dropActivityKeys,
  migrateSchema,
  openActivity,
  openContext,
  redisCpuS,
  releaseActivities,
} from './lib/context.js';
import type { Ctx } from './lib/context.js';
import { buildRuntime, loadCore, readConfig, serversDown, serversUp } from './lib/env.js';
import type { Phase } from './lib/env.js';
import { Buyers, describe, getLoad, medianByCpu, orderLoad } from './lib/http-load.js';
import type { LoadResult } from './lib/http-load.js';
import { dbOnly, insertCeiling, pgSettings } from './lib/pg-ref.js';
import { microBenchmarks } from './lib/micro.js';
import { backlogDrain, pipelineAndDrain } from './lib/pipeline.js';
import { fairness } from './lib/fairness.js';
import { capacity, writeCapacityPage } from './lib/capacity.js';
import { kafkaReplication, writeReplicationBlock } from './lib/kafka-replication.js';
import { measureFloors, measurePaired } from './lib/floors.js';
import { durability } from './lib/durability.js';
import { bucketsBench } from './lib/buckets.js';
import { summarizeProfile } from './lib/profile.js';
import type { ProfileSummary } from './lib/profile.js';
import { prepareRedisRef, redisRef } from './lib/redis-ref.js';
import { renderReport, targets } from './lib/report.js';
import type { Results } from './lib/report.js';
import {
  heapBreakdown,
  peakRssMb,
  podEnv,
  podNodeArgs,
  startRole,
  stopAllRoles,
  stopRole,
} from './lib/runtime.js';
import type { RoleProcess } from './lib/runtime.js';
import { log, machineLoad, procCpuS, procCpuSplitS, runCmd } from './lib/util.js';
import { warmup } from './lib/warmup.js';

const started = performance.now();
const startedAt = Date.now();
const cfg = readConfig();

function cpuPressureTotalUs(): number | undefined {
  try {
    const m = /some avg10=[\d.]+ avg60=[\d.]+ avg300=[\d.]+ total=(\d+)/.exec(
      readFileSync('/proc/pressure/cpu', 'utf8'),
    );
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

/** Kafka's version, and whether the broker fsyncs every append (the test environment does). */
function kafkaDescription(env: Record<string, string>): string {
  const version = /kafka-([\d.]+)/.exec(env.KAFKA_LIBS ?? '')?.[1] ?? '3.9';
  let flush = '';
  try {
    const conf = env.KAFKA_CONFIG ? readFileSync(env.KAFKA_CONFIG, 'utf8') : '';
    const m = /^log\.flush\.interval\.messages=(\d+)/m.exec(conf);
    if (m) flush = `, log.flush.interval.messages=${m[1]}${m[1] === '1' ? ' (an fsync per append)' : ''}`;
  } catch {
    flush = '';
  }
  return `${version}${flush}`;
}

let cleaningUp: Promise<void> | undefined;
async function cleanup(ctx: Ctx | undefined): Promise<void> {
  cleaningUp ??= (async () => {
    await stopAllRoles().catch(() => undefined);
    if (ctx) {
      const { owned } = ctx.servers;
      if (!owned.redis) {
        for (const a of ctx.activities) await dropActivityKeys(ctx, a).catch(() => undefined);
      }
      if (!owned.postgres) {
        await ctx.pool
          .query(`DELETE FROM orders WHERE activity_id LIKE $1`, [`%-${ctx.runId}`])
          .catch(() => undefined);
        await ctx.pool
          .query(`DELETE FROM activity_stock WHERE activity_id LIKE $1`, [`%-${ctx.runId}`])
          .catch(() => undefined);
      }
      if (!owned.kafka && ctx.topics.size > 0) {
        const admin = ctx.core.kafka
          .createKafka(ctx.servers.env.KAFKA_BROKERS!.split(','), 'bench-cleanup')
          .admin();
        await admin
          .connect()
          .then(() => admin.deleteTopics({ topics: [...ctx.topics] }))
          .catch(() => undefined)
          .finally(() => void admin.disconnect());
      }
      ctx.redis.disconnect();
      await ctx.pool.end().catch(() => undefined);
    }
    await serversDown(cfg).catch((err: Error) => log(`env-down failed: ${err.message}`));
  })();
  return cleaningUp;
}

/** Runs an HTTP load and adds the CPU time per response of the api, Redis and the load generator. */
async function withCpu(c: Ctx, apiPid: number, run: () => Promise<LoadResult>): Promise<LoadResult> {
  const a0 = procCpuS(apiPid);
  const r0 = await redisCpuS(c);
  const h0 = process.cpuUsage();
  const r = await run();
  const h = process.cpuUsage(h0);
  const a1 = procCpuS(apiPid);
  const r1 = await redisCpuS(c);
  const n = Math.max(1, r.total);
  r.cpu = {
    api: a0 !== undefined && a1 !== undefined ? ((a1 - a0) * 1e6) / n : undefined,
    redis: ((r1 - r0) * 1e6) / n,
    loadgen: (h.user + h.system) / n,
  };
  return r;
}

async function phase<T>(
  results: Results,
  name: Phase | string,
  fn: () => Promise<T>,
): Promise<T | undefined> {
  try {
    return await fn();
  } catch (err) {
    const msg = (err as Error).message;
    results.failures[name] = msg;
    log(`phase ${name} FAILED: ${msg}`);
    return undefined;
  }
}

async function profileApi(
  ctx: Ctx,
  activityId: string,
  skuId: string,
  name: string,
  buyers: Buyers,
  prime: (base: string) => Promise<void>,
): Promise<ProfileSummary> {
  const dir = join(ctx.logDir, 'profiles');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${name}.cpuprofile`);
  const api = await startRole('api', {
    distDir: cfg.distDir,
    luaDir: cfg.luaDir,
    logDir: ctx.logDir,
    env: ctx.servers.env,
    activityId,
    label: `api-profile-${name}`,
    nodeArgs: ['--cpu-prof', `--cpu-prof-dir=${dir}`, `--cpu-prof-name=${name}.cpuprofile`],
    roleEnv: cfg.roleEnv,
    extraEnv: { JWT_HS256_SECRET: ctx.secret, JWT_MAX_TOKEN_AGE_SECONDS: '21600' },
  });
  const base = `http://127.0.0.1:${api.port}`;
  let window: { startUs: number; endUs: number } | undefined;
  let cpu: ProfileSummary['cpu'];
  try {
    await prime(base);
    const conns = cfg.connections;
    await orderLoad({ baseUrl: base, activityId, skuId, buyers, seconds: cfg.warmupS, connections: conns });
    const cpu0 = procCpuSplitS(api.pid);
    const startUs = Number(process.hrtime.bigint() / 1000n);
    const r = await orderLoad({
      baseUrl: base,
      activityId,
      skuId,
      buyers,
      seconds: cfg.durationS,
      connections: conns,
    });
    window = { startUs, endUs: Number(process.hrtime.bigint() / 1000n) };
    const cpu1 = procCpuSplitS(api.pid);
    if (cpu0 && cpu1)
      cpu = { userMs: (cpu1.userS - cpu0.userS) * 1000, sysMs: (cpu1.sysS - cpu0.sysS) * 1000 };
    log(`profiled ${name}: ${describe(r)}`);
  } finally {
    await stopRole(api);
  }
  if (!existsSync(file)) throw new Error(`no profile written to ${file}`);
  if (cfg.keepProfilesDir) {
    mkdirSync(cfg.keepProfilesDir, { recursive: true });
    copyFileSync(file, join(cfg.keepProfilesDir, `${name}.cpuprofile`));
  }
  return { ...summarizeProfile(file, cfg.distDir, window), cpu };
}

async function main(): Promise<void> {
  const loadStart = machineLoad();
  const psiStart = cpuPressureTotalUs();
  await buildRuntime(cfg);
  const core = await loadCore(cfg);
  const live: { ctx?: Ctx } = {};
  const onSignal = (sig: string): void => {
    log(`${sig}: stopping`);
    void cleanup(live.ctx).finally(() => process.exit(130));
  };
  process.on('SIGINT', () => onSignal('SIGINT'));
  process.on('SIGTERM', () => onSignal('SIGTERM'));

  const servers = await serversUp(cfg);
  const c = openContext(cfg, servers, core, 'bench');
  const { runId, logDir } = c;
  live.ctx = c;
  try {
    if (servers.owned.redis && cfg.redisAppendfsync !== 'keep') {
      await c.redis.config('SET', 'appendfsync', cfg.redisAppendfsync);
    }
    await migrateSchema(servers, cfg.distDir, cfg.luaDir);
    const redisInfo = (await c.redis.info('server')).match(/redis_version:(\S+)/)?.[1] ?? '?';
    const fsync = ((await c.redis.config('GET', 'appendfsync')) as string[])[1] ?? '?';
    const aof = ((await c.redis.config('GET', 'appendonly')) as string[])[1] ?? '?';
    const pgs = await pgSettings(c);
    const results: Results = {
      meta: {
        date: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
        commit: (await runCmd('git', ['rev-parse', '--short', 'HEAD'], { cwd: cfg.repo })).stdout.trim(),
        dirty: (
          await runCmd('git', ['status', '--porcelain', '--', 'core', 'runtime', 'lua'], { cwd: cfg.repo })
        ).stdout
          .split('\n')
          .filter(Boolean)
          .map((l) => l.slice(3)),
        cpus: cpus().length,
        cpuModel: cpus()[0]?.model.trim() ?? '?',
        memGiB: Math.round(totalmem() / 2 ** 30),
        node: process.versions.node,
        apiNodeOptions: podEnv('api').NODE_OPTIONS ?? '',
        pipelineNodeArgs: { relay: podNodeArgs('relay'), consumer: podNodeArgs('consumer') },
        loadBefore: loadStart.load1,
        loadAfter: NaN,
        cpuPressurePct: undefined,
        otherLoad:
          process.env.BENCH_MACHINE_NOTE ??
          (loadStart.load1 > cpus().length
            ? 'Other load was present: the machine was shared with other work during the run.'
            : 'No significant other load at the start of the run.'),
        redis: `${redisInfo} (appendonly ${aof}, appendfsync ${fsync})`,
        postgres: pgs,
        kafka: kafkaDescription(servers.env),
        servers: Object.values(servers.owned).every(Boolean)
          ? 'started by the benchmark on loopback (test/env/env-up.sh) and stopped afterwards'
          : `given by the environment for ${Object.entries(servers.owned)
              .filter(([, own]) => !own)
              .map(([s]) => s)
              .join(', ')}; the rest started by the benchmark`,
        durationS: cfg.durationS,
        warmupS: cfg.warmupS,
        connections: cfg.connections,
        totalS: NaN,
        command: process.env.BENCH_COMMAND ?? 'make bench',
      },
      redisUnpipelined: [],
      profiles: {},
      failures: {},
    };
    const has = (p: Phase): boolean => cfg.phases.has(p);
    const conns = cfg.connections;
    const secs = cfg.durationS;

    // --- 1/2. Submit and sold-out on one api process --------------------------------------------
    const sale = `bsale-${runId}`;
    const refActivity = `bref-${runId}`;
    // Every order load signs its buyers' tokens ahead of its run (orderLoad).
    const buyers = new Buyers(c.secret, `b${runId}-`, 0);
    let api: RoleProcess | undefined;
    if (has('submit') || has('soldout') || has('profile') || has('floors')) {
      await openActivity(c, sale, [benchItem('hot', 1_000_000_000), benchItem('gone', 1)]);
    }
    if (has('submit') || has('soldout')) {
      api = await phase(results, 'api start', () =>
        startRole('api', {
          distDir: cfg.distDir,
          luaDir: cfg.luaDir,
          logDir,
          env: servers.env,
          activityId: sale,
          roleEnv: cfg.roleEnv,
          extraEnv: { JWT_HS256_SECRET: c.secret, JWT_MAX_TOKEN_AGE_SECONDS: '21600' },
        }),
      );
    }
    // Each phase from here on opens its own sales: what the ones before left in Redis goes first.
    const release = (after: string): Promise<void> =>
      phase(results, 'release', () => releaseActivities(c, after)).then(() => undefined);
    const base = api ? `http://127.0.0.1:${api.port}` : '';
    const pid = api?.pid ?? -1;
    let refCommand: string[] | undefined;
    if (has('redis')) {
      refCommand = await phase(results, 'redis', () => prepareRedisRef(c, refActivity));
    }
    const unpipelinedRef = async (): Promise<void> => {
      if (!refCommand) return;
      const cmd = refCommand;
      const r = await phase(results, 'redis', () =>
        redisRef(c, refActivity, cmd, conns, 1, Math.min(secs, 8)),
      );
      if (r) results.redisUnpipelined.push(r);
    };
    await unpipelinedRef();
    if (has('submit') && api) {
      results.submit = await phase(results, 'submit', async () => {
        await orderLoad({
          baseUrl: base,
          activityId: sale,
          skuId: 'hot',
          buyers,
          seconds: cfg.warmupS,
          connections: conns,
        });
        const r = await medianByCpu(cfg.cpuRounds, () =>
          withCpu(c, pid, () =>
            orderLoad({
              baseUrl: base,
              activityId: sale,
              skuId: 'hot',
              buyers,
              seconds: secs,
              connections: conns,
            }),
          ),
        );
        log(
          `submit: ${describe(r)} (median of ${cfg.cpuRounds} runs by api CPU: ${r.cpuRounds.map((x) => x.toFixed(0)).join(', ')} µs)`,
        );
        return r;
      });
    }
    await unpipelinedRef();
    if (refCommand) {
      const cmd = refCommand;
      results.redisPipelined = await phase(results, 'redis', () =>
        redisRef(c, refActivity, cmd, conns, 16, Math.min(secs, 6)),
      );
      await phase(results, 'redis', async () => {
        const n = await dropActivityKeys(c, refActivity);
        log(`dropped ${n} keys of the EVALSHA reference`);
      });
    }
    if (has('db')) {
      results.dbOnly = await phase(results, 'db', () => dbOnly(c, `bdb-${runId}`, conns, secs));
    }
    if (has('soldout') && api) {
      await phase(results, 'soldout', async () => {
        // The one unit of `gone` goes; the next attempt learns SOLD_OUT from Redis and sets the flag.
        for (let i = 0; i < 2; i += 1) {
          const b = buyers.take();
          await fetch(`${base}/v1/activities/${sale}/orders`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', authorization: `Bearer ${b.token}` },
            body: JSON.stringify({ skuId: 'gone', quantity: 1, requestId: b.requestId }),
          });
        }
        await orderLoad({
          baseUrl: base,
          activityId: sale,
          skuId: 'gone',
          buyers,
          seconds: cfg.warmupS,
          connections: conns,
        });
        // The median of runs, as for submit: one 10 s run of the same server moves by up to 20 %.
        const soldOut = await medianByCpu(cfg.cpuRounds, () =>
          withCpu(c, pid, () =>
            orderLoad({
              baseUrl: base,
              activityId: sale,
              skuId: 'gone',
              buyers,
              seconds: secs,
              connections: conns,
            }),
          ),
        );
        results.soldOut = soldOut;
        log(
          `sold-out: ${describe(soldOut)} (median of ${cfg.cpuRounds} runs by api CPU: ${soldOut.cpuRounds.map((x) => x.toFixed(0)).join(', ')} µs)`,
        );
        await getLoad(base, '/healthz', cfg.warmupS, conns);
        results.healthz = await withCpu(c, pid, () => getLoad(base, '/healthz', secs, conns));
        log(`/healthz: ${describe(results.healthz)}`);
      });
    }
    if (api) {
      // Read before the paired rounds below, which only repeat the submit load.
      results.api = {
        idleMb: (api.idleRssKb ?? 0) / 1024,
        peakMb: peakRssMb(api) ?? NaN,
        heap: await heapBreakdown(api),
      };
    }
    // --- Floors: the same reservation on a bare node:http server and a minimal express route ----
    // The floors and the paired rounds: the same servers, activity, buyers and connections.
    const floorOptions = {
      repo: cfg.repo,
      distDir: cfg.distDir,
      luaDir: cfg.luaDir,
      logDir,
      redisUrl: servers.env.REDIS_URL!,
      secret: c.secret,
    };
    const orders = (baseUrl: string, skuId: string, seconds: number): Promise<LoadResult> =>
      orderLoad({ baseUrl, activityId: sale, skuId, buyers, seconds, connections: conns });
    if (has('floors')) {
      results.floors = await phase(results, 'floors', () =>
        measureFloors(floorOptions, {
          warmupS: cfg.warmupS,
          seconds: secs,
          submit: (b, s) => orders(b, 'hot', s),
          healthz: (b, s) => getLoad(b, '/healthz', s, conns),
          soldOut: (b, s) => orders(b, 'gone', s),
          withCpu: (floorPid, f) => withCpu(c, floorPid, f),
          rounds: cfg.cpuRounds,
        }),
      );
    }

    // --- Paired rounds: the api and both floors in turn, so that a drift of the machine weighs
    // on all three of a round alike (the ratios of 1f and 1g compare different minutes) -------
    if (has('floors') && api && has('submit')) {
      const apiPid = api.pid;
      results.paired = await phase(results, 'floors', () =>
        measurePaired(floorOptions, {
          warmupS: cfg.warmupS,
          seconds: secs,
          rounds: cfg.pairedRounds,
          api: (s) => withCpu(c, apiPid, () => orders(base, 'hot', s)),
          submit: (b, s) => orders(b, 'hot', s),
          withCpu: (floorPid, f) => withCpu(c, floorPid, f),
        }),
      );
    }
    if (api) await stopRole(api);

    // --- Profiles of the api (separate processes: the profiler slows them down) ---------------
    if (has('profile')) {
      results.profiles.submit = await phase(results, 'profile', () =>
        profileApi(c, sale, 'hot', 'submit', buyers, async () => undefined),
      );
      results.profiles.soldOut = await phase(results, 'profile', () =>
        profileApi(c, sale, 'gone', 'sold-out', buyers, async (b) => {
          const t = buyers.take();
          await fetch(`${b}/v1/activities/${sale}/orders`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', authorization: `Bearer ${t.token}` },
            body: JSON.stringify({ skuId: 'gone', quantity: 1, requestId: t.requestId }),
          });
        }),
      );
    }
    await release('the submit, sold-out, floors and profile phases');

    if (has('micro')) {
      results.micro = await phase(results, 'micro', () => microBenchmarks(c));
    }

    // --- 3/4. Pipeline and drain, with the consumer's ceiling measured just before --------------
    if (has('ceiling')) {
      results.ceiling = await phase(results, 'ceiling', () =>
        insertCeiling(c, `bceil-${runId}`, 4, Math.min(secs, 8)),
      );
      results.ceilingOneClient = await phase(results, 'ceiling', () =>
        insertCeiling(c, `bceil1-${runId}`, 1, Math.min(secs, 6)),
      );
    }
    // --- 5. Warm-up --------------------------------------------------------------------------------
    if (has('warmup')) {
      results.warmup = await phase(results, 'warmup', () => warmup(c, cfg.warmupSkus, cfg.warmupRounds));
    }
    if (has('pipeline')) {
      // The drain gets whatever is left of the budget, less what stopping everything takes.
      const deadline = startedAt + cfg.budgetS * 1000 - 30_000;
      results.pipeline = await phase(results, 'pipeline', () =>
        pipelineAndDrain(c, `bpipe-${runId}`, cfg.drainReservations, deadline),
      );
    }
    await release('the pipeline phase');
    if (has('backlog')) {
      const deadline = startedAt + cfg.budgetS * 1000 - 30_000;
      results.backlog = await phase(results, 'backlog', () =>
        backlogDrain(c, `bback-${runId}`, cfg.drainReservations, deadline),
      );
    }
    await release('the backlog phase');

    // --- 6. Fairness under bots: shaping off, then on ------------------------------------------------
    if (has('buckets')) {
      results.buckets = await phase(results, 'buckets', () => bucketsBench(c));
    }
    if (has('fairness')) {
      results.fairness = await phase(results, 'fairness', () => fairness(c));
    }
    await release('the fairness phase');

    if (has('capacity')) {
      const figures = await phase(results, 'capacity', () => capacity(c));
      if (figures) writeCapacityPage(c, figures);
    }
    await release('the capacity phase');
    if (has('kafka-replication')) {
      const figures = await phase(results, 'kafka-replication', () => kafkaReplication(c));
      if (figures) writeReplicationBlock(c, figures);
    }

    // --- 7. Cost of durability (last: it attaches a replica to Redis for a while) ---------------
    if (has('durability')) {
      results.durability = await phase(results, 'durability', () => durability(c));
    }

    const psiEnd = cpuPressureTotalUs();
    results.meta.loadAfter = machineLoad().load1;
    results.meta.totalS = (performance.now() - started) / 1000;
    if (psiStart !== undefined && psiEnd !== undefined) {
      results.meta.cpuPressurePct = (100 * (psiEnd - psiStart)) / (results.meta.totalS * 1e6);
    }
    const analysisFile = join(cfg.repo, 'bench', 'analysis.md');
    const analysis = existsSync(analysisFile) ? readFileSync(analysisFile, 'utf8') : '';
    mkdirSync(dirname(cfg.outFile), { recursive: true });
    writeFileSync(cfg.outFile, renderReport(results, analysis));
    if (process.env.BENCH_JSON) writeFileSync(process.env.BENCH_JSON, JSON.stringify(results, null, 2));
    log(`wrote ${cfg.outFile}`);
    for (const t of targets(results))
      log(`  ${t.verdict.padEnd(6)} ${t.figure}: ${t.detail} (target ${t.target})`);
    // A run with a failed phase is no run to quote: said last, and the exit status says so too.
    for (const [name, msg] of Object.entries(results.failures)) {
      log(`  FAILED phase ${name}: ${msg.split('\n')[0]}`);
      process.exitCode = 1;
    }
  } finally {
    await cleanup(c);
  }
  log(`done in ${((performance.now() - started) / 1000).toFixed(0)} s`);
}

main().catch(async (err: unknown) => {
  log(`benchmark failed: ${(err as Error).stack ?? String(err)}`);
  await stopAllRoles().catch(() => undefined);
  await serversDown(cfg).catch(() => undefined);
  process.exit(1);
});
