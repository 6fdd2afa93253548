/**
 * Pipeline and drain: reservations become orders in PostgreSQL through the relay (Redis stream ->
 * Kafka) and the consumer (Kafka -> PostgreSQL), both running as their own role processes.
 *
 * 1. Relay and consumer start; a small warm-up batch proves the whole path (group joined).
 * 2. N reservations are created directly with the reserve script (EVALSHA from the benchmark
 *    process, 50 pipelines of 16 in flight, distinct buyers, reservation ids derived from buyer and
 *    requestId as the consumer requires: redis-ref.ts reserveBurst) as fast as Redis takes them:
 *    the sale's burst, without a load generator competing for the CPU.
 * 3. The gate closes. Drain = time from gate close until zero half messages (stream empty) and
 *    zero gap (no reservation without an order: the ledger of unconfirmed reservations is empty).
 * Orders are counted in PostgreSQL every 200 ms; the pipeline rate is the slope between 10 % and
 * 90 % of the burst's orders (the backlog never runs dry in that window when the burst outpaces
 * the pipeline, which the report checks).
 */
import { copyFileSync, existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { redisCpuS } from './context.js';
import type { Ctx } from './context.js';
import { summarizeProfile } from './profile.js';
import type { ProfileSummary } from './profile.js';
import { prepareRedisRef, reservations, reserveBurst } from './redis-ref.js';
import { peakRssMb, startRole, stopRole } from './runtime.js';
import type { RoleProcess } from './runtime.js';
import { log, pidFrom, procCpuS, sleep, treeCpuS, waitFor } from './util.js';

export interface Sample {
  t: number;
  orders: number;
  halfMessages: number;
  unconfirmed: number;
}

export interface PipelineResult {
  /** Reservations created by the burst (the script's own count). */
  n: number;
  /** False when the drain did not finish before the benchmark's deadline. */
  drained: boolean;
  createS: number;
  createRate: number;
  /** Orders per second between 10 % and 90 % of the burst. */
  pipelineRate: number;
  /** The backlog stayed above zero through the rate window (rate = capacity, not input). */
  backlogged: boolean;
  drainS: number;
  backlogAtClose: { halfMessages: number; missingOrders: number };
  ordersInPg: number;
  /** Reservations released by the consumer (a buyer-slot conflict), hence without an order. */
  released: number;
  /** Seconds PostgreSQL's VACUUM and CHECKPOINT took before the burst (undefined: refused). */
  quiescedS?: number;
  rss: Record<'relay' | 'consumer', { idleMb: number; peakMb: number }>;
  samples: Sample[];
  /** Orders per second from gate close until drained (the backlog at close over the drain time). */
  drainRate: number;
  /**
   * CPU microseconds per order of each process from the start of the burst until drained: relay,
   * consumer, the Kafka broker (undefined when its pid is unknown) and Redis (the reserve script
   * plus the relay's stream reads and acknowledgements).
   */
  cpuPerOrderUs: { relay?: number; consumer?: number; kafka?: number; redis: number };
  /** With BENCH_PROFILE_ROLES=1: where the relay's and the consumer's time went during the run. */
  profiles?: { relay?: ProfileSummary; consumer?: ProfileSummary };
}

/**
 * Lets PostgreSQL finish the upkeep of the earlier phases' rows before a measured window: the
 * ceiling's pgbench alone writes some 400,000 orders (and their order events), whose autovacuum,
 * analyze and checkpoint otherwise ran inside the drain and were charged to the pipeline
 * (bench/analysis.md, "The pipeline's young generation, and a quiet PostgreSQL"). The ceiling
 * itself is measured on a database with no such backlog of upkeep. Returns the seconds it took,
 * or undefined when the server refused (a DATABASE_URL without the right to CHECKPOINT).
 */
async function quiescePostgres(ctx: Ctx): Promise<number | undefined> {
  const t = performance.now();
  try {
    await ctx.pool.query('VACUUM (ANALYZE) orders, order_events, order_journal, activity_skus');
    await ctx.pool.query('CHECKPOINT');
  } catch (err) {
    log(`PostgreSQL not quiesced before the measurement: ${(err as Error).message}`);
    return undefined;
  }
  return (performance.now() - t) / 1000;
}

async function countOrders(ctx: Ctx, activityId: string): Promise<number> {
  const r = await ctx.pool.query<{ n: string }>(
    'SELECT count(*)::text AS n FROM orders WHERE activity_id = $1',
    [activityId],
  );
  return Number(r.rows[0]?.n ?? 0);
}

export async function pipelineAndDrain(
  ctx: Ctx,
  activityId: string,
  calls: number,
  deadline: number,
): Promise<PipelineResult> {
  const { core } = ctx;
  await prepareRedisRef(ctx, activityId);
  const kafka = core.kafka.createKafka(ctx.servers.env.KAFKA_BROKERS!.split(','), `bench-${ctx.runId}`);
  const admin = kafka.admin();
  await admin.connect();
  const topics = core.kafka.topicsFor(activityId);
  try {
    await core.kafka.ensureTopics(admin, topics, 4, 1);
    ctx.topics.add(topics.orders).add(topics.dlq);
  } finally {
    await admin.disconnect();
  }
  const keys = core.keys.activityKeys(activityId);
  const roleOpts = {
    distDir: ctx.cfg.distDir,
    luaDir: ctx.cfg.luaDir,
    logDir: ctx.logDir,
    env: ctx.servers.env,
    activityId,
    roleEnv: ctx.cfg.roleEnv,
  };
  const profDir = join(ctx.logDir, 'profiles');
  const prof = (name: string): string[] =>
    ctx.cfg.profileRoles
      ? ['--cpu-prof', `--cpu-prof-dir=${profDir}`, `--cpu-prof-name=${name}.cpuprofile`]
      : [];
  if (ctx.cfg.profileRoles) mkdirSync(profDir, { recursive: true });
  const roles: RoleProcess[] = [];
  let profWindow: { startUs: number; endUs: number } | undefined;
  let result: PipelineResult | undefined;
  try {
    const [relay, consumer] = await Promise.all([
      startRole('relay', { ...roleOpts, nodeArgs: prof('relay') }),
      startRole('consumer', { ...roleOpts, nodeArgs: prof('consumer') }),
    ]);
    roles.push(relay, consumer);

    await reserveBurst(ctx, activityId, 200, 0, 1, 10);
    const warm = await reservations(ctx, activityId);
    await waitFor('warm-up orders in PostgreSQL', 120_000, async () =>
      (await countOrders(ctx, activityId)) >= warm ? true : undefined,
    );
    log(`pipeline warm (${warm} orders through relay and consumer)`);

    const quiescedS = await quiescePostgres(ctx);
    const kPid = pidFrom([ctx.servers.env.FLASHSALE_STATE], 'kafka.pid');
    const cpu0 = {
      relay: procCpuS(relay.pid),
      consumer: procCpuS(consumer.pid),
      kafka: kPid === undefined ? undefined : procCpuS(kPid),
      redis: await redisCpuS(ctx),
    };
    const samples: Sample[] = [];
    const t0 = performance.now();
    const startUs = Number(process.hrtime.bigint() / 1000n);
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const [orders, halfMessages, unconfirmed] = await Promise.all([
          countOrders(ctx, activityId),
          ctx.redis.xlen(keys.outbox),
          ctx.redis.zcard(keys.ledger),
        ]);
        samples.push({
          t: (performance.now() - t0) / 1000,
          orders: orders - warm,
          halfMessages,
          unconfirmed,
        });
        await sleep(200);
      }
    })();

    await reserveBurst(ctx, activityId, calls, 200);
    const closeAt = performance.now();
    const n = (await reservations(ctx, activityId)) - warm;
    await core.cache.setGate(ctx.redis, activityId, 'closed');
    const createS = (closeAt - t0) / 1000;
    const [halfAtClose, ordersAtClose] = await Promise.all([
      ctx.redis.xlen(keys.outbox),
      countOrders(ctx, activityId),
    ]);
    log(
      `${n} reservations in ${createS.toFixed(1)} s; gate closed with ${halfAtClose} half messages and ` +
        `${n + warm - ordersAtClose} reservations without an order`,
    );
    const drained = await waitFor(
      'drain (zero half messages, zero gap)',
      Math.max(10_000, deadline - Date.now()),
      async () => {
        const [h, u] = await Promise.all([ctx.redis.xlen(keys.outbox), ctx.redis.zcard(keys.ledger)]);
        return h === 0 && u === 0 ? true : undefined;
      },
      50,
    ).then(
      () => true,
      (err: Error) => {
        log(`${err.message}: stopping the drain measurement at the benchmark's deadline`);
        return false;
      },
    );
    const drainS = (performance.now() - closeAt) / 1000;
    const perOrder = (a: number | undefined, b: number | undefined): number | undefined =>
      a === undefined || b === undefined || n === 0 ? undefined : ((b - a) * 1e6) / n;
    const cpuPerOrderUs = {
      relay: perOrder(cpu0.relay, procCpuS(relay.pid)),
      consumer: perOrder(cpu0.consumer, procCpuS(consumer.pid)),
      kafka: kPid === undefined ? undefined : perOrder(cpu0.kafka, procCpuS(kPid)),
      redis: perOrder(cpu0.redis, await redisCpuS(ctx)) ?? NaN,
    };
    profWindow = { startUs, endUs: Number(process.hrtime.bigint() / 1000n) };
    sampling = false;
    await sampler;
    const ordersInPg = (await countOrders(ctx, activityId)) - warm;
    samples.push({ t: (performance.now() - t0) / 1000, orders: ordersInPg, halfMessages: 0, unconfirmed: 0 });
    // A buyer refused by the database's buyer-slot key has its reservation released (the
    // consumer's compensation): not an order, not a gap. None is expected with distinct buyers.
    const released = Number((await ctx.redis.hget(keys.counters, 'released')) ?? 0);
    const at = (frac: number): Sample | undefined => samples.find((s) => s.orders >= frac * n);
    const a = at(0.1);
    const b = at(0.9);
    const pipelineRate = a && b && b.t > a.t ? (b.orders - a.orders) / (b.t - a.t) : NaN;
    const rateWindow = samples.filter((s) => a && b && s.t >= a.t && s.t <= b.t);
    const backlogged = rateWindow.length > 0 && rateWindow.every((s) => s.unconfirmed > 0);
    const rss = {
      relay: { idleMb: (relay.idleRssKb ?? 0) / 1024, peakMb: peakRssMb(relay) ?? NaN },
      consumer: { idleMb: (consumer.idleRssKb ?? 0) / 1024, peakMb: peakRssMb(consumer) ?? NaN },
    };
    log(
      `${drained ? 'drained' : 'NOT drained'} after ${drainS.toFixed(2)} s; pipeline ${Math.round(pipelineRate)} orders/s; ` +
        `${ordersInPg}/${n} orders in PostgreSQL`,
    );
    result = {
      n,
      drained,
      createS,
      createRate: n / createS,
      pipelineRate,
      backlogged,
      drainS,
      drainRate: drainS > 0 ? (n + warm - ordersAtClose) / drainS : NaN,
      cpuPerOrderUs,
      backlogAtClose: { halfMessages: halfAtClose, missingOrders: n + warm - ordersAtClose },
      ordersInPg,
      released,
      quiescedS,
      rss,
      samples,
    };
  } finally {
    await Promise.all(roles.map((r) => stopRole(r)));
  }
  if (ctx.cfg.profileRoles) {
    const summary = (name: string): ProfileSummary | undefined => {
      const file = join(profDir, `${name}.cpuprofile`);
      if (!existsSync(file)) return undefined;
      if (ctx.cfg.keepProfilesDir) {
        mkdirSync(ctx.cfg.keepProfilesDir, { recursive: true });
        copyFileSync(file, join(ctx.cfg.keepProfilesDir, `${name}.cpuprofile`));
      }
      return summarizeProfile(file, ctx.cfg.distDir, profWindow);
    };
    result.profiles = { relay: summary('relay'), consumer: summary('consumer') };
  }
  return result;
}

export interface BacklogResult {
  /** Reservations in the backlog when the pipeline resumed (the script's own count). */
  n: number;
  drained: boolean;
  /** Seconds the burst took with the pipeline paused (not part of the drain). */
  createS: number;
  /** Gate close + resume -> zero half messages and zero gap. */
  drainS: number;
  /** n / drainS: orders relayed through Kafka and written to PostgreSQL per second. */
  drainRate: number;
  /** Seconds until the stream was empty (everything relayed to Kafka). */
  relayedS: number;
  /** Seconds PostgreSQL's VACUUM and CHECKPOINT took before the resume (undefined: refused). */
  quiescedS?: number;
  ordersInPg: number;
  /** With PostgreSQL's (the postmaster and its backends) when its pid file was found. */
  cpuPerOrderUs: { relay?: number; consumer?: number; kafka?: number; redis: number; postgres?: number };
  rss: Record<'relay' | 'consumer', { idleMb: number; peakMb: number }>;
  samples: Sample[];
  profiles?: { relay?: ProfileSummary; consumer?: ProfileSummary };
}

/**
 * Drain of a backlog: what "drain of 100,000" means when the pipeline did not keep up with the
 * sale. Relay and consumer start and prove the path as in pipelineAndDrain(), then both processes
 * are paused (SIGSTOP) while N reservations are created, the gate closes, and both resume
 * (SIGCONT): the drain is the time from then until zero half messages and zero gap, so every one
 * of the N orders is relayed to Kafka and written to PostgreSQL inside it. While paused the
 * consumer sends no heartbeats and the relay holds its read entries, so for this run only the
 * group session and the relay's reclaim idle time are raised above the pause (recovery timeouts,
 * not throughput settings); otherwise the resume would start with a rebalance or a re-publication.
 */
export async function backlogDrain(
  ctx: Ctx,
  activityId: string,
  calls: number,
  deadline: number,
): Promise<BacklogResult> {
  const { core } = ctx;
  await prepareRedisRef(ctx, activityId);
  const kafka = core.kafka.createKafka(ctx.servers.env.KAFKA_BROKERS!.split(','), `bench-${ctx.runId}`);
  const admin = kafka.admin();
  await admin.connect();
  const topics = core.kafka.topicsFor(activityId);
  try {
    await core.kafka.ensureTopics(admin, topics, 4, 1);
    ctx.topics.add(topics.orders).add(topics.dlq);
  } finally {
    await admin.disconnect();
  }
  const keys = core.keys.activityKeys(activityId);
  const roleOpts = {
    distDir: ctx.cfg.distDir,
    luaDir: ctx.cfg.luaDir,
    logDir: ctx.logDir,
    env: ctx.servers.env,
    activityId,
    roleEnv: {
      CONSUMER_SESSION_TIMEOUT_MS: '300000',
      CONSUMER_REBALANCE_TIMEOUT_MS: '300000',
      RELAY_RECLAIM_IDLE_MS: '300000',
      ...ctx.cfg.roleEnv,
    },
  };
  const profDir = join(ctx.logDir, 'profiles');
  const prof = (name: string): string[] =>
    ctx.cfg.profileRoles
      ? ['--cpu-prof', `--cpu-prof-dir=${profDir}`, `--cpu-prof-name=${name}.cpuprofile`]
      : [];
  if (ctx.cfg.profileRoles) mkdirSync(profDir, { recursive: true });
  const roles: RoleProcess[] = [];
  let paused: RoleProcess[] = [];
  let profWindow: { startUs: number; endUs: number } | undefined;
  let result: BacklogResult | undefined;
  try {
    const [relay, consumer] = await Promise.all([
      startRole('relay', { ...roleOpts, label: 'relay-backlog', nodeArgs: prof('relay-backlog') }),
      startRole('consumer', { ...roleOpts, label: 'consumer-backlog', nodeArgs: prof('consumer-backlog') }),
    ]);
    roles.push(relay, consumer);
    await reserveBurst(ctx, activityId, 200, 0, 1, 10);
    const warm = await reservations(ctx, activityId);
    await waitFor('warm-up orders in PostgreSQL', 120_000, async () =>
      (await countOrders(ctx, activityId)) >= warm ? true : undefined,
    );

    for (const r of roles) process.kill(r.pid, 'SIGSTOP');
    paused = [...roles];
    const c0 = performance.now();
    await reserveBurst(ctx, activityId, calls, 200);
    const n = (await reservations(ctx, activityId)) - warm;
    await core.cache.setGate(ctx.redis, activityId, 'closed');
    const createS = (performance.now() - c0) / 1000;
    const backlog = await ctx.redis.xlen(keys.outbox);
    log(
      `backlog: ${n} reservations in ${createS.toFixed(1)} s with relay and consumer paused (${backlog} half messages)`,
    );

    const quiescedS = await quiescePostgres(ctx);
    const kPid = pidFrom([ctx.servers.env.FLASHSALE_STATE], 'kafka.pid');
    const pgPid = pidFrom([ctx.servers.env.FLASHSALE_STATE], 'postgres.pid');
    const cpu0 = {
      relay: procCpuS(relay.pid),
      consumer: procCpuS(consumer.pid),
      kafka: kPid === undefined ? undefined : procCpuS(kPid),
      redis: await redisCpuS(ctx),
      postgres: pgPid === undefined ? undefined : treeCpuS(pgPid),
    };
    const samples: Sample[] = [];
    const t0 = performance.now();
    const startUs = Number(process.hrtime.bigint() / 1000n);
    for (const r of roles) process.kill(r.pid, 'SIGCONT');
    paused = [];
    let relayedS = NaN;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const [orders, halfMessages, unconfirmed] = await Promise.all([
          countOrders(ctx, activityId),
          ctx.redis.xlen(keys.outbox),
          ctx.redis.zcard(keys.ledger),
        ]);
        samples.push({
          t: (performance.now() - t0) / 1000,
          orders: orders - warm,
          halfMessages,
          unconfirmed,
        });
        await sleep(200);
      }
    })();
    const drained = await waitFor(
      'backlog drain (zero half messages, zero gap)',
      Math.max(10_000, deadline - Date.now()),
      async () => {
        const [h, u] = await Promise.all([ctx.redis.xlen(keys.outbox), ctx.redis.zcard(keys.ledger)]);
        if (h === 0 && Number.isNaN(relayedS)) relayedS = (performance.now() - t0) / 1000;
        return h === 0 && u === 0 ? true : undefined;
      },
      20,
    ).then(
      () => true,
      (err: Error) => {
        log(`${err.message}: stopping the backlog drain measurement at the benchmark's deadline`);
        return false;
      },
    );
    const drainS = (performance.now() - t0) / 1000;
    const perOrder = (a: number | undefined, b: number | undefined): number | undefined =>
      a === undefined || b === undefined || n === 0 ? undefined : ((b - a) * 1e6) / n;
    const cpuPerOrderUs = {
      relay: perOrder(cpu0.relay, procCpuS(relay.pid)),
      consumer: perOrder(cpu0.consumer, procCpuS(consumer.pid)),
      kafka: kPid === undefined ? undefined : perOrder(cpu0.kafka, procCpuS(kPid)),
      redis: perOrder(cpu0.redis, await redisCpuS(ctx)) ?? NaN,
      postgres: pgPid === undefined ? undefined : perOrder(cpu0.postgres, treeCpuS(pgPid)),
    };
    profWindow = { startUs, endUs: Number(process.hrtime.bigint() / 1000n) };
    sampling = false;
    await sampler;
    const ordersInPg = (await countOrders(ctx, activityId)) - warm;
    samples.push({ t: drainS, orders: ordersInPg, halfMessages: 0, unconfirmed: 0 });
    log(
      `backlog ${drained ? 'drained' : 'NOT drained'} in ${drainS.toFixed(2)} s (${Math.round(n / drainS)} orders/s; ` +
        `stream empty after ${relayedS.toFixed(2)} s); ${ordersInPg}/${n} orders in PostgreSQL`,
    );
    result = {
      n,
      drained,
      createS,
      drainS,
      drainRate: drained && drainS > 0 ? n / drainS : NaN,
      relayedS,
      quiescedS,
      ordersInPg,
      cpuPerOrderUs,
      rss: {
        relay: { idleMb: (relay.idleRssKb ?? 0) / 1024, peakMb: peakRssMb(relay) ?? NaN },
        consumer: { idleMb: (consumer.idleRssKb ?? 0) / 1024, peakMb: peakRssMb(consumer) ?? NaN },
      },
      samples,
    };
  } finally {
    for (const r of paused) process.kill(r.pid, 'SIGCONT');
    await Promise.all(roles.map((r) => stopRole(r)));
  }
  if (ctx.cfg.profileRoles) {
    const summary = (name: string): ProfileSummary | undefined => {
      const file = join(profDir, `${name}.cpuprofile`);
      if (!existsSync(file)) return undefined;
      if (ctx.cfg.keepProfilesDir) {
        mkdirSync(ctx.cfg.keepProfilesDir, { recursive: true });
        copyFileSync(file, join(ctx.cfg.keepProfilesDir, `${name}.cpuprofile`));
      }
      return summarizeProfile(file, ctx.cfg.distDir, profWindow);
    };
    result.profiles = { relay: summary('relay-backlog'), consumer: summary('consumer-backlog') };
  }
  return result;
}
