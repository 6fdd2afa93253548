/**
 * `BENCH_ONLY=buckets`: stock buckets on a Redis Cluster (docs/install.md "Redis Cluster and stock
 * buckets"). On a loopback cluster of three primaries with a replica each
 * (test/env/start-redis-cluster.sh, or the one REDIS_CLUSTER_NODES names):
 * - Redis CPU per reservation (all primaries, INFO cpu) of one SKU without buckets and the same SKU
 *   in 12 buckets (a multiple of the three primaries), through core/reservations.ts reserve();
 * - what Redis does per reservation in either case (commands, client read events, bytes in and
 *   replicated: INFO stats), so the cost of buckets can be told apart from the script's work;
 * - the same with the api's durable acknowledgement on a cluster (core/durable-ack.ts
 *   ClusterReplicaAck, RESERVE_ACK=replica, the default there) after each reservation;
 * - how the reserve script calls spread over the primaries (INFO commandstats evalsha), with buckets;
 * - the relay's drain of BENCH_DRAIN_N reservations (100,000) from 8 bucket streams vs 1 stream:
 *   the real relay role, from the first entry to an empty outbox.
 * Stock is far above the load, so no bucket runs empty (no transfers) while measuring.
 */
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import calculateSlot from 'cluster-key-slot';
import type { Cluster, Redis } from 'ioredis';
import type * as DurableAckModule from '../../core/durable-ack.js';
import type * as RedisModule from '../../core/redis.js';
import type { Ctx } from './context.js';
import { infoField } from './context.js';
import { startRole, stopRole } from './runtime.js';
import { log, mustRun, runCmd } from './util.js';

export interface BucketsResult {
  nodes: string;
  reservations: number;
  /** Redis CPU µs per reservation, summed over the primaries. */
  cpuUsPerReservation: {
    plain: number;
    bucketed: number;
    ratio: number;
    bucketedEqualBatch: number;
    /**
     * The control: the same load without buckets over one sale per primary, so spread over the
     * primaries as the buckets are. Optional: results written before it was measured lack it.
     */
    spreadPlain?: number;
    /** Share of that CPU spent in the kernel (socket reads and writes, polling), median rounds. */
    sysShare?: { plain: number; bucketed: number; spreadPlain: number };
    /** Each alternating round's figures (µs), in order; the values above are their medians. */
    rounds: { plain: number[]; bucketed: number[]; spreadPlain?: number[] };
  };
  /** Per reservation, without buckets and bucketed (INFO stats and commandstats, all primaries). */
  perReservation: { plain: RedisWork; bucketed: RedisWork; spreadPlain?: RedisWork };
  /** Redis CPU µs per reservation with the api's replica acknowledgement after each one. */
  withAck: { plain: number; bucketed: number; ratio: number; waits: { plain: number; bucketed: number } };
  bucketCount: number;
  /** Share of the reserve script calls per primary (bucketed run), in %. */
  spreadPct: number[];
  /** µs per reserve script call on each primary (commandstats): without buckets, then bucketed. */
  usPerCall: { plain: number[]; bucketed: number[]; spreadPlain?: number[] };
  drain: {
    reservations: number;
    oneStreamS: number;
    eightStreamsS: number;
    oneRate: number;
    eightRate: number;
  };
}

/** What Redis did per reservation. */
export interface RedisWork {
  /** Commands, the script's own included. */
  commands: number;
  /** Reads from client sockets: each one read of the commands that arrived together, with its replies and propagation. */
  reads: number;
  inBytes: number;
  replBytes: number;
  waits: number;
}

interface Primaries {
  cluster: Cluster;
  nodes: Redis[];
}

/** CPU seconds of the primaries' main threads and children (INFO cpu), in the kernel and in Redis. */
async function cpuS(nodes: Redis[]): Promise<{ sys: number; user: number }> {
  const s = { sys: 0, user: 0 };
  for (const n of nodes) {
    const info = await n.info('cpu');
    const get = (k: string): number => Number(infoField(info, k) ?? NaN);
    s.sys += get('used_cpu_sys');
    s.user += get('used_cpu_user');
  }
  return s;
}

async function work(nodes: Redis[]): Promise<RedisWork> {
  const w: RedisWork = { commands: 0, reads: 0, inBytes: 0, replBytes: 0, waits: 0 };
  for (const n of nodes) {
    const info = await n.info('all');
    const get = (k: string): number => Number(infoField(info, k) ?? 0);
    w.commands += get('total_commands_processed');
    w.reads += get('total_reads_processed');
    w.inBytes += get('total_net_input_bytes');
    w.replBytes += get('total_net_repl_output_bytes');
    w.waits += Number(/^cmdstat_wait:calls=(\d+)/m.exec(info)?.[1] ?? 0);
  }
  return w;
}

/** Reserve script calls per primary, and the primary's µs per call (INFO commandstats). */
async function scriptCalls(nodes: Redis[]): Promise<{ calls: number; usPerCall: number }[]> {
  return Promise.all(
    nodes.map(async (n) => {
      const info = await n.info('commandstats');
      const stat = (cmd: string, field: string): number =>
        Number(new RegExp(`^cmdstat_${cmd}:.*?\\b${field}=([\\d.]+)`, 'm').exec(info)?.[1] ?? 0);
      const calls = stat('evalsha', 'calls') + stat('eval', 'calls');
      const usec = stat('evalsha', 'usec') + stat('eval', 'usec');
      return { calls, usPerCall: calls > 0 ? usec / calls : 0 };
    }),
  );
}

/**
 * Reserves `n` units with `inFlight` buyers in flight, each a distinct buyer; with several
 * activities, the reservations go to them in turn.
 */
async function reserveMany(
  ctx: Ctx,
  p: Primaries,
  activityIds: string | readonly string[],
  n: number,
  tag: string,
  inFlight = 64,
  ack?: DurableAckModule.ReservationAck,
): Promise<void> {
  const ids = typeof activityIds === 'string' ? [activityIds] : activityIds;
  let next = 0;
  const worker = async (): Promise<void> => {
    for (let i = next++; i < n; i = next++) {
      const activityId = ids[i % ids.length]!;
      const r = await ctx.core.reservations.reserve(p.cluster, {
        activityId,
        userId: `${tag}-${i}`,
        skuId: 'hot',
        quantity: 1,
        requestId: 'r',
        traceId: 't',
      });
      if (ack && r.kind === 'reserved') await ack.confirm(activityId, r.reservationId, false, r.scope);
    }
  };
  await Promise.all(Array.from({ length: inFlight }, worker));
}

export async function bucketsBench(ctx: Ctx): Promise<BucketsResult> {
  try {
    return await bucketsBenchInner(ctx);
  } catch (err) {
    log(`buckets failed: ${(err as Error).stack ?? String(err)}`);
    throw err;
  }
}

async function bucketsBenchInner(ctx: Ctx): Promise<BucketsResult> {
  const redisMod = (await import(
    pathToFileURL(join(ctx.cfg.distDir, 'core', 'redis.js')).href
  )) as typeof RedisModule;
  const ackMod = (await import(
    pathToFileURL(join(ctx.cfg.distDir, 'core', 'durable-ack.js')).href
  )) as typeof DurableAckModule;
  let nodesEnv = process.env.REDIS_CLUSTER_NODES;
  const state = join(ctx.cfg.stateDir, 'redis-cluster');
  if (!nodesEnv) {
    log('starting a Redis Cluster (test/env/start-redis-cluster.sh)');
    await mustRun('bash', [join(ctx.cfg.repo, 'test', 'env', 'start-redis-cluster.sh'), state], {
      cwd: ctx.cfg.repo,
      timeoutMs: 120_000,
    });
    const env = (await runCmd('cat', [join(state, 'redis-cluster.env')])).stdout;
    nodesEnv = /^REDIS_CLUSTER_NODES=(.*)$/m.exec(env)?.[1];
  }
  if (!nodesEnv) throw new Error('no Redis Cluster');
  const clusterNodes = redisMod.parseSentinels(nodesEnv.split(','));
  // The api's client options (runtime/main.ts): each reservation is its own command on the wire,
  // as in the deployed api, not a share of an auto-pipelined batch.
  const cluster = redisMod.createRedis(
    { clusterNodes },
    { enableAutoPipelining: false, maxRetriesPerRequest: 3 },
  ) as Cluster;
  try {
    await new Promise<void>((resolve, reject) => {
      cluster.once('ready', resolve);
      cluster.once('error', reject);
    });
    const nodes = cluster.nodes('master');
    const p: Primaries = { cluster, nodes };
    const n = Math.min(ctx.cfg.drainReservations, 30_000);
    const big = 1_000_000_000;
    const item = (buckets?: number) => ({
      skuId: 'hot',
      name: 'Bench hot item',
      price: '19.99',
      stock: big,
      limitPerUser: 1,
      ...(buckets ? { buckets } : {}),
    });
    const load = async (id: string, buckets?: number): Promise<void> => {
      ctx.activities.add(id);
      await ctx.core.cache.loadActivity(cluster, {
        id,
        generation: 1,
        startAt: new Date(Date.now() - 60_000),
        endAt: new Date(Date.now() + 6 * 3600_000),
        requireOrderCode: false,
        reopenOnRelease: false,
        items: [item(buckets)],
      });
      await ctx.core.cache.setGate(cluster, id, 'open');
    };

    // 1. CPU per reservation, plain vs 12 buckets (warm-up runs first: scripts loaded, JIT warm).
    const BUCKETS = 12;
    const measure = async (
      id: string | readonly string[],
      buckets?: number,
      inFlight = 64,
      ack?: DurableAckModule.ReservationAck,
    ): Promise<{
      cpu: number;
      sysShare: number;
      calls: { calls: number; usPerCall: number }[];
      work: RedisWork;
    }> => {
      const ids = typeof id === 'string' ? [id] : id;
      for (const x of ids) await load(x, buckets);
      await reserveMany(ctx, p, ids, 2_000, `${ids[0]}-w`, inFlight, ack);
      await Promise.all(nodes.map((x) => x.config('RESETSTAT')));
      const w0 = await work(nodes);
      const c0 = await cpuS(nodes);
      await reserveMany(ctx, p, ids, n, `${ids[0]}-m`, inFlight, ack);
      const c1 = await cpuS(nodes);
      const w1 = await work(nodes);
      // Per reservation; the INFO calls of the two readings are left out of the commands.
      const per = (k: keyof RedisWork): number =>
        (w1[k] - w0[k] - (k === 'commands' ? 2 * nodes.length : 0)) / n;
      return {
        cpu: c1.sys + c1.user - c0.sys - c0.user,
        sysShare: (c1.sys - c0.sys) / (c1.sys + c1.user - c0.sys - c0.user),
        calls: await scriptCalls(nodes),
        work: {
          commands: per('commands'),
          reads: per('reads'),
          inBytes: per('inBytes'),
          replBytes: per('replBytes'),
          waits: per('waits'),
        },
      };
    };
    // Alternating rounds, medians reported: one pair of runs moved by ±15 % between runs on a
    // shared 2-core machine, more than the difference being measured.
    const rounds = ctx.cfg.bucketsRounds;
    const plainRuns: Awaited<ReturnType<typeof measure>>[] = [];
    const bucketedRuns: Awaited<ReturnType<typeof measure>>[] = [];
    const spreadRuns: Awaited<ReturnType<typeof measure>>[] = [];
    for (let i = 0; i < rounds; i += 1) {
      log(
        `buckets: round ${i + 1}/${rounds}: ${n} reservations without buckets, in ${BUCKETS} buckets, ` +
          `then over ${nodes.length} sales without buckets, one per primary`,
      );
      plainRuns.push(await measure(`bkp${i}-${ctx.runId}`));
      bucketedRuns.push(await measure(`bkb${i}-${ctx.runId}`, BUCKETS));
      // The control: the same load spread over the primaries by sales, not buckets. What it costs
      // over one primary is the spreading's, not the buckets'.
      spreadRuns.push(await measure(onePerPrimary(ctx, cluster, nodes, `bks${i}-${ctx.runId}`)));
    }
    const plain = medianRun(plainRuns);
    const bucketed = medianRun(bucketedRuns);
    const spread = medianRun(spreadRuns);
    const us = (x: { cpu: number; sysShare: number }): string =>
      `${((x.cpu / n) * 1e6).toFixed(1)} (${(100 * x.sysShare).toFixed(0)} % sys)`;
    log(
      `buckets: Redis µs per reservation by round, without / with / spread without: ${plainRuns
        .map((x, i) => `${us(x)} / ${us(bucketedRuns[i]!)} / ${us(spreadRuns[i]!)}`)
        .join(', ')}`,
    );
    // The same with three times as many in flight: each primary's command batches as large as the
    // single primary's were (Redis' per-batch costs: reads, writes and replication, shared alike).
    const equalBatch = await measure(`bkq-${ctx.runId}`, BUCKETS, 64 * nodes.length);
    const totalCalls = bucketed.calls.reduce((a, b) => a + b.calls, 0);
    // The api's path on a cluster: each reservation confirmed on a replica (one replica, 1 s).
    const ack = new ackMod.ClusterReplicaAck(cluster, 1, 1000);
    const plainAck = await measure(`bkpa-${ctx.runId}`, undefined, 64, ack);
    const bucketedAck = await measure(`bkba-${ctx.runId}`, BUCKETS, 64, ack);

    // 2. Drain: N reservations waiting in 1 stream vs 8 bucket streams, one relay role each time.
    const drainN = ctx.cfg.drainReservations;
    const drain = async (id: string, buckets?: number): Promise<number> => {
      await load(id, buckets);
      const kafka = ctx.core.kafka.createKafka(
        ctx.servers.env.KAFKA_BROKERS!.split(','),
        `bench-${ctx.runId}`,
      );
      const admin = kafka.admin();
      await admin.connect();
      const topics = ctx.core.kafka.topicsFor(id);
      try {
        await ctx.core.kafka.ensureTopics(admin, topics, 4, 1);
        ctx.topics.add(topics.orders).add(topics.dlq);
      } finally {
        await admin.disconnect();
      }
      log(`buckets: ${drainN} reservations into ${buckets ?? 1} stream(s)`);
      await reserveMany(ctx, p, id, drainN, `${id}-d`);
      const t0 = performance.now();
      const relay = await startRole('relay', {
        distDir: ctx.cfg.distDir,
        luaDir: ctx.cfg.luaDir,
        logDir: ctx.logDir,
        env: ctx.servers.env,
        activityId: id,
        label: `relay-${buckets ?? 1}`,
        ...(ctx.cfg.roleEnv ? { roleEnv: ctx.cfg.roleEnv } : {}),
        extraEnv: { REDIS_CLUSTER_NODES: nodesEnv },
      });
      try {
        for (;;) {
          const f = await ctx.core.cache.readOutbox(cluster, id);
          if (f.halfMessages === 0) break;
          await new Promise((r) => setTimeout(r, 100));
        }
        return (performance.now() - t0) / 1000;
      } finally {
        await stopRole(relay);
      }
    };
    const oneStreamS = await drain(`bkd1-${ctx.runId}`);
    const eightStreamsS = await drain(`bkd8-${ctx.runId}`, 8);

    return {
      nodes: nodesEnv,
      reservations: n,
      cpuUsPerReservation: {
        plain: (plain.cpu / n) * 1e6,
        bucketed: (bucketed.cpu / n) * 1e6,
        ratio: bucketed.cpu / plain.cpu,
        bucketedEqualBatch: (equalBatch.cpu / n) * 1e6,
        spreadPlain: (spread.cpu / n) * 1e6,
        sysShare: { plain: plain.sysShare, bucketed: bucketed.sysShare, spreadPlain: spread.sysShare },
        rounds: {
          plain: plainRuns.map((x) => (x.cpu / n) * 1e6),
          bucketed: bucketedRuns.map((x) => (x.cpu / n) * 1e6),
          spreadPlain: spreadRuns.map((x) => (x.cpu / n) * 1e6),
        },
      },
      perReservation: { plain: plain.work, bucketed: bucketed.work, spreadPlain: spread.work },
      withAck: {
        plain: (plainAck.cpu / n) * 1e6,
        bucketed: (bucketedAck.cpu / n) * 1e6,
        ratio: bucketedAck.cpu / plainAck.cpu,
        waits: { plain: plainAck.work.waits, bucketed: bucketedAck.work.waits },
      },
      bucketCount: BUCKETS,
      spreadPct: bucketed.calls.map((c) => (100 * c.calls) / Math.max(1, totalCalls)),
      usPerCall: {
        plain: plain.calls.filter((c) => c.calls > 0).map((c) => c.usPerCall),
        bucketed: bucketed.calls.map((c) => c.usPerCall),
        spreadPlain: spread.calls.map((c) => c.usPerCall),
      },
      drain: {
        reservations: drainN,
        oneStreamS,
        eightStreamsS,
        oneRate: drainN / oneStreamS,
        eightRate: drainN / eightStreamsS,
      },
    };
  } finally {
    cluster.disconnect();
    if (!process.env.REDIS_CLUSTER_NODES) {
      await runCmd('bash', [join(ctx.cfg.repo, 'test', 'env', 'env-down.sh'), state], {
        cwd: ctx.cfg.repo,
        timeoutMs: 60_000,
      });
    }
  }
}

/**
 * One sale id per primary, in the primaries' order: each id's hash tag (core/keys.ts) lands in a
 * slot the primary serves.
 */
function onePerPrimary(ctx: Ctx, cluster: Cluster, nodes: Redis[], base: string): string[] {
  const addressOf = (r: Redis): string => `${r.options.host}:${r.options.port}`;
  const ids: (string | undefined)[] = nodes.map(() => undefined);
  for (let k = 0; ids.some((x) => x === undefined); k += 1) {
    if (k > 10_000) throw new Error('no sale id found for every primary');
    const id = `${base}-${k}`;
    const owner = cluster.slots[calculateSlot(ctx.core.keys.activityKeys(id).meta)]?.[0];
    const i = nodes.findIndex((r) => addressOf(r) === owner);
    if (i >= 0 && ids[i] === undefined) ids[i] = id;
  }
  return ids as string[];
}

/** The run whose Redis CPU is the median of the rounds (the lower middle one of an even count). */
function medianRun<T extends { cpu: number }>(runs: T[]): T {
  const sorted = [...runs].sort((a, b) => a.cpu - b.cpu);
  return sorted[Math.floor((sorted.length - 1) / 2)]!;
}

/** The report's section (docs/benchmarks.md). */
export function renderBuckets(r: BucketsResult): string[] {
  const c = r.cpuUsPerReservation;
  const w = r.perReservation;
  const a = r.withAck;
  const third = 100 / 3;
  const spreadOk = r.spreadPct.every((s) => Math.abs(s - third) <= third * 0.15);
  const control = w.spreadPlain;
  const ctl = control ? ' / the control' : '';
  const three = (f: (x: RedisWork) => string): string =>
    [w.plain, w.bucketed, ...(control ? [control] : [])].map(f).join(' / ');
  const reason =
    c.ratio > 1.2 && c.spreadPlain !== undefined
      ? [
          `**Measured reason (this run):** the script does the same work either way (${w.plain.commands.toFixed(2)} / ` +
            `${w.bucketed.commands.toFixed(2)} Redis commands per reservation). The control spreads the same load ` +
            `without buckets over the ${r.spreadPct.length} primaries, one sale each, and costs ` +
            `${c.spreadPlain.toFixed(1)} µs, ${(c.spreadPlain / c.plain).toFixed(2)}× one primary; the buckets cost ` +
            `${(c.bucketed / c.spreadPlain).toFixed(2)}× the control. What the spreading costs over one primary is ` +
            `each primary's share of the batches (client socket reads per reservation ${three((x) => x.reads.toFixed(3))}) ` +
            `and the primaries sharing this machine's cores with each other, their replicas and the client.`,
          '',
        ]
      : [];
  return [
    '## Stock buckets on a Redis Cluster',
    '',
    `Loopback Redis Cluster of three primaries with one replica each (${r.nodes}), reservations through ` +
      `core/reservations.ts from the benchmark process (64 in flight), ${r.reservations} per run after 2,000 warm-up ones; ` +
      `the per-reservation rows without and with buckets are those of the median round.`,
    '',
    '| Figure | Value | Target | Verdict |',
    '|---|---:|---|---|',
    `| Redis CPU per reservation, one SKU without buckets (all primaries) | ${c.plain.toFixed(1)} µs | | |`,
    `| Redis CPU per reservation, the SKU in ${r.bucketCount} buckets | ${c.bucketed.toFixed(1)} µs | | |`,
    `| Bucketed / not bucketed (medians of ${c.rounds.plain.length} alternating rounds; by round ${c.rounds.plain.map((x, i) => `${(c.rounds.bucketed[i]! / x).toFixed(2)}×`).join(', ')}) | ${c.ratio.toFixed(2)}× | ≤ 1.2× | ${c.ratio <= 1.2 ? 'met' : 'missed'} |`,
    ...(c.spreadPlain !== undefined
      ? [
          `| Control: Redis CPU per reservation without buckets, the load over ${r.spreadPct.length} sales, one per primary (spread as the buckets are; medians of the rounds, by round ${(c.rounds.spreadPlain ?? []).map((x) => `${x.toFixed(1)}`).join(', ')} µs) | ${c.spreadPlain.toFixed(1)} µs (${(c.spreadPlain / c.plain).toFixed(2)}× one primary; bucketed ${(c.bucketed / c.spreadPlain).toFixed(2)}× it) | | |`,
        ]
      : []),
    ...(c.sysShare
      ? [
          `| Share of that Redis CPU in the kernel (socket I/O and polling): one primary / ${r.bucketCount} buckets / the control | ${[c.sysShare.plain, c.sysShare.bucketed, c.sysShare.spreadPlain].map((x) => `${(100 * x).toFixed(0)} %`).join(' / ')} | | |`,
        ]
      : []),
    `| Redis CPU per reservation, ${r.bucketCount} buckets, 3× in flight (as many in flight per primary as without buckets) | ${c.bucketedEqualBatch.toFixed(1)} µs (${(c.bucketedEqualBatch / c.plain).toFixed(2)}×) | | |`,
    `| Per reservation without / with buckets${ctl}: Redis commands (the script's own included) | ${three((x) => x.commands.toFixed(2))} | | |`,
    `| Per reservation without / with buckets${ctl}: client socket reads (each one read of the commands that arrived together) | ${three((x) => x.reads.toFixed(3))} | | |`,
    `| Per reservation without / with buckets${ctl}: bytes in, bytes replicated | ${three((x) => `${x.inBytes.toFixed(0)}, ${x.replBytes.toFixed(0)}`)} | | |`,
    `| With the api's replica acknowledgement (ClusterReplicaAck): Redis CPU per reservation without / with buckets | ${a.plain.toFixed(1)} / ${a.bucketed.toFixed(1)} µs (${a.ratio.toFixed(2)}×); WAITs per reservation ${a.waits.plain.toFixed(3)} / ${a.waits.bucketed.toFixed(3)} | | |`,
    `| Reserve script calls per primary (${r.bucketCount} buckets) | ${r.spreadPct.map((s) => `${s.toFixed(1)} %`).join(' / ')} | each 33.3 % ± 15 % | ${spreadOk ? 'met' : 'missed'} |`,
    `| µs per reserve script call, per primary (commandstats): without buckets / with${ctl} | ${[r.usPerCall.plain, r.usPerCall.bucketed, ...(r.usPerCall.spreadPlain ? [r.usPerCall.spreadPlain] : [])].map((xs) => xs.map((x) => x.toFixed(1)).join(', ')).join(' / ')} | | |`,
    `| Relay drain of ${r.drain.reservations} reservations, 1 stream (relay start included) | ${r.drain.oneStreamS.toFixed(1)} s (${r.drain.oneRate.toFixed(0)}/s) | | |`,
    `| Relay drain of ${r.drain.reservations} reservations, 8 bucket streams (relay start included) | ${r.drain.eightStreamsS.toFixed(1)} s (${r.drain.eightRate.toFixed(0)}/s) | | |`,
    '',
    ...reason,
  ];
}
