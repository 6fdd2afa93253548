/**
 * The `capacity` phase: CPU time per operation of each stage of the order path, for the sizing
 * model of docs/capacity.md (bench/lib/capacity-model.ts). CPU time per operation transfers across
 * machines far better than a rate on this shared 2-core machine does.
 *
 * 1. Relay and consumer (jobs off: the consumer alone) start; a small batch proves the path.
 * 2. Both are SIGSTOPped. N reservations are made with the registry's reserve() (core/reservations.ts,
 *    ids derived from buyer and requestId as the consumer checks): half from 50 connections one call
 *    at a time each, half from one connection with 50 calls in flight, as an api process sends them
 *    (its client options: no auto-pipelining): Redis CPU per reserve call.
 * 3. The relay alone is continued until the outbox stream is empty: relay, Redis and Kafka broker
 *    CPU per message.
 * 4. The consumer alone is continued until the unconfirmed ledger is empty (every reservation an
 *    order): consumer, PostgreSQL, Redis and broker CPU per order.
 * Redis memory (INFO used_memory) is read before 2, after 2 (what N reservations hold while their
 * orders wait, as during a Kafka outage) and after 4 (what stays until the activity's cleanup).
 * The CPU figures come from /proc (role processes, the broker, the postmaster and its backends)
 * and INFO cpu (Redis). The broker and PostgreSQL are found through their pid files in the
 * benchmark's state dir or FLASHSALE_STATE (test/env/env-up.sh); otherwise they are reported as
 * not measured. Polling uses Redis (XLEN, ZCARD), never PostgreSQL, so that PostgreSQL's CPU is
 * the orders'.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { parseRedisMemory } from '../../core/redis.js';
import { benchItem, openActivity, redisCpuS } from './context.js';
import type { Ctx } from './context.js';
import { renderCapacityBlock, replaceCapacityBlock } from './capacity-model.js';
import type { CapacityFigures } from './capacity-model.js';
import { reservations } from './redis-ref.js';
import { startRole, stopRole } from './runtime.js';
import type { RoleProcess } from './runtime.js';
import { log, machineLoad, pidFrom, procCpuS, runCmd, treeCpuS, waitFor } from './util.js';

function cpuPressureSomeUs(): number | undefined {
  try {
    const m = /some avg10=[\d.]+ avg60=[\d.]+ avg300=[\d.]+ total=(\d+)/.exec(
      readFileSync('/proc/pressure/cpu', 'utf8'),
    );
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Redis's used_memory once the connections the phase closed are gone (their buffers would count):
 * read after a short pause, the smallest of three reads.
 */
async function redisUsedMemory(redis: Redis): Promise<number> {
  const reads: number[] = [];
  for (let i = 0; i < 3; i += 1) {
    await new Promise((r) => setTimeout(r, 200));
    reads.push(parseRedisMemory(await redis.info('memory')).usedBytes);
  }
  return Math.min(...reads);
}

interface Sample {
  at: number;
  proc: number | undefined;
  redis: number;
  kafka: number | undefined;
  postgres: number | undefined;
}

export async function capacity(ctx: Ctx): Promise<CapacityFigures> {
  const n = Math.max(2_000, Math.round(Number(process.env.BENCH_CAPACITY_N ?? '20000')));
  const activityId = `bcap-${ctx.runId}`;
  const load0 = machineLoad();
  const psi0 = cpuPressureSomeUs();
  const t0 = performance.now();
  const stateDirs = [ctx.cfg.stateDir, process.env.FLASHSALE_STATE];
  const kafkaPid = pidFrom(stateDirs, 'kafka.pid');
  const pgPid = pidFrom(stateDirs, 'postgres.pid');
  log(
    `capacity: ${n} reservations; broker pid ${kafkaPid ?? 'not found'}, postmaster pid ${pgPid ?? 'not found'}`,
  );

  await openActivity(ctx, activityId, [benchItem('s1', 1_000_000_000)]);
  // The bench process calls the scripts itself (core/scripts.ts finds them here).
  process.env.FLASHSALE_LUA_DIR ??= ctx.cfg.luaDir;
  const { core } = ctx;
  let next = 0;
  /** `count` reservations by `workers` concurrent loops over the clients given (round robin). */
  const reserveMany = async (clients: Redis[], count: number, workers = 50): Promise<number> => {
    const cpu0 = await redisCpuS(ctx);
    const end = next + count;
    await Promise.all(
      Array.from({ length: workers }, async (_, w) => {
        const client = clients[w % clients.length]!;
        for (let i = next++; i < end; i = next++) {
          const r = await core.reservations.reserve(client, {
            activityId,
            userId: `cap-${ctx.runId}-${i}`,
            skuId: 's1',
            quantity: 1,
            requestId: `q${i}`,
            traceId: `t${i}`,
          });
          if (r.kind !== 'reserved') throw new Error(`capacity: reservation ${i} was ${r.kind}`);
        }
      }),
    );
    next = end;
    return (((await redisCpuS(ctx)) - cpu0) * 1e6) / count;
  };
  const admin = core.kafka
    .createKafka(ctx.servers.env.KAFKA_BROKERS!.split(','), `bench-cap-${ctx.runId}`)
    .admin();
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
  const roles: RoleProcess[] = [];
  const sample = async (pid: number | undefined): Promise<Sample> => ({
    at: performance.now(),
    proc: pid === undefined ? undefined : procCpuS(pid),
    redis: await redisCpuS(ctx),
    kafka: kafkaPid === undefined ? undefined : procCpuS(kafkaPid),
    postgres: pgPid === undefined ? undefined : treeCpuS(pgPid),
  });
  const per = (a: number | undefined, b: number | undefined): number | undefined =>
    a === undefined || b === undefined ? undefined : ((b - a) * 1e6) / n;
  try {
    const [relay, consumer] = await Promise.all([
      startRole('relay', { ...roleOpts, label: 'relay-capacity' }),
      // The consumer alone: scheduled jobs and the order-event relay run in their own role.
      startRole('consumer', {
        ...roleOpts,
        label: 'consumer-capacity',
        extraEnv: { JOBS_IN_CONSUMER: 'false' },
      }),
    ]);
    roles.push(relay, consumer);
    await reserveMany([ctx.redis], 200, 10);
    await waitFor('capacity warm-up drained', 120_000, async () =>
      (await ctx.redis.zcard(keys.ledger)) === 0 ? true : undefined,
    );
    const warm = await reservations(ctx, activityId);
    process.kill(relay.pid, 'SIGSTOP');
    process.kill(consumer.pid, 'SIGSTOP');
    const mem0 = await redisUsedMemory(ctx.redis);

    // 2. Redis alone.
    const half = Math.floor(n / 2);
    const url = ctx.servers.env.REDIS_URL!;
    const single = Array.from({ length: 50 }, () => new Redis(url, { maxRetriesPerRequest: 3 }));
    let unpipedUs: number;
    try {
      unpipedUs = await reserveMany(single, half);
    } finally {
      for (const c of single) c.disconnect();
    }
    // One connection with the api's client options (runtime/main.ts: no auto-pipelining).
    const apiLike = new Redis(url, { maxRetriesPerRequest: 3 });
    let pipedUs: number;
    try {
      pipedUs = await reserveMany([apiLike], n - half);
    } finally {
      apiLike.disconnect();
    }
    const made = (await reservations(ctx, activityId)) - warm;
    if (made !== n) throw new Error(`capacity: ${made} of ${n} reserve calls reserved`);
    const memWaiting = await redisUsedMemory(ctx.redis);
    log(
      `capacity: reserve ${unpipedUs.toFixed(1)} µs one call at a time, ${pipedUs.toFixed(1)} µs 50 in flight on one connection`,
    );

    // 3. The relay alone.
    const r0 = await sample(relay.pid);
    process.kill(relay.pid, 'SIGCONT');
    await waitFor('capacity: outbox stream empty', 300_000, async () =>
      (await ctx.redis.xlen(keys.outbox)) === 0 ? true : undefined,
    );
    const r1 = await sample(relay.pid);

    // 4. The consumer alone.
    const c0 = await sample(consumer.pid);
    process.kill(consumer.pid, 'SIGCONT');
    await waitFor(
      'capacity: every reservation an order',
      300_000,
      async () => ((await ctx.redis.zcard(keys.ledger)) === 0 ? true : undefined),
      50,
    );
    const c1 = await sample(consumer.pid);
    const orders = Number(
      (
        await ctx.pool.query<{ n: string }>('SELECT count(*)::text AS n FROM orders WHERE activity_id = $1', [
          activityId,
        ])
      ).rows[0]?.n ?? 0,
    );
    if (orders !== warm + n) throw new Error(`capacity: ${orders} orders for ${warm + n} reservations`);
    const memKept = await redisUsedMemory(ctx.redis);

    const psi1 = cpuPressureSomeUs();
    const secs = (performance.now() - t0) / 1000;
    const load1 = machineLoad();
    const redisVersion = /redis_version:(\S+)/.exec(await ctx.redis.info('server'))?.[1] ?? '?';
    const pgVersion =
      (await ctx.pool.query<{ v: string }>("SELECT current_setting('server_version') AS v")).rows[0]?.v ??
      '?';
    const commit = (
      await runCmd('git', ['rev-parse', '--short', 'HEAD'], { cwd: ctx.cfg.repo })
    ).stdout.trim();
    const figures: CapacityFigures = {
      meta: {
        date: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
        commit,
        machine: `${cpus().length} cores (${cpus()[0]?.model.trim() ?? '?'}), ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.versions.node}`,
        servers: `Redis ${redisVersion}, PostgreSQL ${pgVersion.split(' ')[0]}, Kafka with one broker (log.flush.interval.messages=1 in the test environment), 4 partitions, all on loopback.`,
        load: `Load average ${load0.load1.toFixed(1)} at the start, ${load1.load1.toFixed(1)} at the end${
          psi0 !== undefined && psi1 !== undefined
            ? `; some task waited for a CPU during ${Math.round((100 * (psi1 - psi0)) / (secs * 1e6))} % of the phase (PSI)`
            : ''
        }.`,
      },
      n,
      redisReserveUs: unpipedUs,
      redisReservePipelinedUs: pipedUs,
      redisRelayUs: per(r0.redis, r1.redis)!,
      redisConsumerUs: per(c0.redis, c1.redis)!,
      relayUs: per(r0.proc, r1.proc) ?? NaN,
      consumerUs: per(c0.proc, c1.proc) ?? NaN,
      postgresUs: per(c0.postgres, c1.postgres),
      kafkaProduceUs: per(r0.kafka, r1.kafka),
      kafkaConsumeUs: per(c0.kafka, c1.kafka),
      relayRate: (n * 1000) / (r1.at - r0.at),
      consumerRate: (n * 1000) / (c1.at - c0.at),
      redisBytesWaiting: (memWaiting - mem0) / n,
      redisBytesKept: (memKept - mem0) / n,
    };
    log(`capacity: ${JSON.stringify(figures)}`);
    return figures;
  } finally {
    for (const r of roles) {
      try {
        process.kill(r.pid, 'SIGCONT');
      } catch {
        // already gone
      }
    }
    await Promise.all(roles.map((r) => stopRole(r)));
  }
}

/** Writes the measured block into the capacity page (BENCH_CAPACITY_OUT, default docs/capacity.md). */
export function writeCapacityPage(ctx: Ctx, f: CapacityFigures): string {
  const file = process.env.BENCH_CAPACITY_OUT ?? join(ctx.cfg.repo, 'docs', 'capacity.md');
  writeFileSync(file, replaceCapacityBlock(readFileSync(file, 'utf8'), renderCapacityBlock(f)));
  log(`wrote the measured block of ${file}`);
  return file;
}
