/**
 * The physical limit of the deduction path on one shard: `redis-benchmark` running the very
 * reserve script the api runs (the registry's expanded Lua, by EVALSHA) on the same Redis.
 *
 * Every call must be a fresh reservation, not a replay or a limit refusal: redis-benchmark's
 * `-r` replaces each `__rand_int__` with its own random 12-digit number per call, so the buyer
 * key, the reservation key, the reservation id, the buyer id and the requestId all vary (two
 * placeholders per id: `-r` stops at 2^31, and 10^5 draws from that would collide a few times). All keys
 * are built by the key builder and carry the activity's hash tag (one cluster slot). The success
 * ratio (reservations counted by the script / calls) proves the calls reserved.
 */
import { benchItem, openActivity, redisCpuS } from './context.js';
import type { Ctx } from './context.js';
import { log, mustRun } from './util.js';

export interface RedisRefResult {
  rps: number;
  p50Ms: number;
  p99Ms: number;
  calls: number;
  reservedRatio: number;
  /** Redis CPU time per call in microseconds (INFO cpu delta / calls). */
  redisCpuUs: number;
}

/** Two placeholders side by side: 24 random digits, so ids of 100,000s of calls never collide. */
const RAND = '__rand_int____rand_int__';

export async function prepareRedisRef(ctx: Ctx, activityId: string): Promise<string[]> {
  await openActivity(ctx, activityId, [benchItem('s1', 1_000_000_000)]);
  const script = ctx.core.scripts.loadScripts(ctx.cfg.luaDir).get('reserve');
  if (!script) throw new Error('the registry has no reserve script');
  const sha = (await ctx.redis.script('LOAD', script.lua)) as string;
  if (sha !== script.sha1) throw new Error(`SCRIPT LOAD returned ${sha}, registry says ${script.sha1}`);
  const k = ctx.core.keys.activityKeys(activityId);
  const keys = [
    k.meta,
    k.sku('s1'),
    k.buyer(`u${RAND}`),
    k.reservation(`r${RAND}`),
    k.outbox,
    k.ledger,
    k.counters,
    k.none,
  ];
  // ARGV as reserve() passes them: rid, buyer, sku, qty, requestId, traceId, order code, activity.
  const argv = [`r${RAND}`, `u${RAND}`, 's1', '1', `q${RAND}`, `t${RAND}`, '', activityId];
  if (script.numberOfKeys === 9) {
    // reserve-9.lua counts the buyer's rate-limit window as the api's call does (the default
    // per-buyer limit, core/traffic-policy.ts), so the reference does the api's Redis work.
    const { requests, perSeconds } = ctx.core.policy.DEFAULT_TRAFFIC_POLICY.shaping.perBuyer;
    keys.push(k.rateLimitKey('buyer', `u${RAND}`));
    argv.push(String(requests), String(perSeconds));
  }
  if (script.numberOfKeys !== keys.length) throw new Error(`reserve takes ${script.numberOfKeys} keys`);
  return ['EVALSHA', sha, String(keys.length), ...keys, ...argv];
}

export async function reservations(ctx: Ctx, activityId: string): Promise<number> {
  const v = await ctx.redis.hget(ctx.core.keys.activityKeys(activityId).counters, 'reservations');
  return Number(v ?? 0);
}

/** One redis-benchmark run of the reserve command; `calls` reservations are attempted. */
export async function runReserveBenchmark(
  ctx: Ctx,
  activityId: string,
  command: string[],
  clients: number,
  pipeline: number,
  calls: number,
): Promise<RedisRefResult> {
  const s = ctx.servers;
  const auth = s.redisPassword ? ['-a', s.redisPassword, '--no-auth-warning'] : [];
  const before = await reservations(ctx, activityId);
  const cpu0 = await redisCpuS(ctx);
  const r = await mustRun(
    'redis-benchmark',
    [
      '-h',
      s.redisHost,
      '-p',
      String(s.redisPort),
      ...auth,
      '-c',
      String(clients),
      '-P',
      String(pipeline),
      '-n',
      String(calls),
      '-r',
      '2000000000',
      '--csv',
      ...command,
    ],
    { timeoutMs: 300_000 },
  );
  const after = await reservations(ctx, activityId);
  const cpu1 = await redisCpuS(ctx);
  // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms",...
  const line = r.stdout
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('"EVALSHA'))
    .at(-1);
  if (!line) throw new Error(`unexpected redis-benchmark output: ${r.stdout.slice(-500)}`);
  const cols = [...line.matchAll(/"([^"]*)"/g)].map((m) => m[1]!);
  const [rps, , , p50, , p99] = cols.slice(1).map(Number);
  return {
    rps: rps!,
    p50Ms: p50!,
    p99Ms: p99!,
    calls,
    reservedRatio: (after - before) / calls,
    redisCpuUs: ((cpu1 - cpu0) * 1e6) / calls,
  };
}

/**
 * A short probe sizes the measured run to about `seconds` (redis-benchmark counts calls, not
 * time); the probe also warms the script cache and the connection set.
 */
export async function redisRef(
  ctx: Ctx,
  activityId: string,
  command: string[],
  clients: number,
  pipeline: number,
  seconds: number,
): Promise<RedisRefResult> {
  const probe = await runReserveBenchmark(
    ctx,
    activityId,
    command,
    clients,
    pipeline,
    pipeline > 1 ? 20_000 : 5_000,
  );
  const calls = Math.max(10_000, Math.min(3_000_000, Math.round(probe.rps * seconds)));
  const r = await runReserveBenchmark(ctx, activityId, command, clients, pipeline, calls);
  log(
    `redis-benchmark EVALSHA reserve -c ${clients} -P ${pipeline}: ${Math.round(r.rps)} ops/s, ` +
      `p50 ${r.p50Ms} ms, p99 ${r.p99Ms} ms, reserved ${(r.reservedRatio * 100).toFixed(1)}% of ${calls}, ` +
      `Redis CPU ${r.redisCpuUs.toFixed(0)} µs/call`,
  );
  return r;
}

/**
 * A burst of `calls` fresh reservations on the reserve script, sent from this process in
 * pipelines of `depth` × `inFlight` calls: the consumer refuses a reservation id that is not
 * derived from its buyer and requestId (core/reservations.ts reservationIdFor), which
 * redis-benchmark's random ids are not, so the pipeline run creates its reservations here. Every
 * id is distinct (`first` onwards).
 */
export async function reserveBurst(
  ctx: Ctx,
  activityId: string,
  calls: number,
  first = 0,
  depth = 16,
  inFlight = 50,
): Promise<void> {
  const script = ctx.core.scripts.loadScripts(ctx.cfg.luaDir).get('reserve');
  if (!script) throw new Error('the registry has no reserve script');
  await ctx.redis.script('LOAD', script.lua);
  const k = ctx.core.keys.activityKeys(activityId);
  const rid = ctx.core.reservations.reservationIdFor;
  let next = first;
  const end = first + calls;
  const worker = async (): Promise<void> => {
    while (next < end) {
      const p = ctx.redis.pipeline();
      for (let j = 0; j < depth && next < end; j += 1, next += 1) {
        const user = `u${next}`;
        const requestId = `q${next}`;
        const id = rid(activityId, user, requestId);
        // reserve-9.lua takes the rate-limit counter too: not counted here (a window of 0).
        const counted = script.numberOfKeys === 9;
        p.evalsha(
          script.sha1,
          counted ? 9 : 8,
          k.meta,
          k.sku('s1'),
          k.buyer(user),
          k.reservation(id),
          k.outbox,
          k.ledger,
          k.counters,
          k.none,
          ...(counted ? [k.none] : []),
          id,
          user,
          's1',
          '1',
          requestId,
          `t${next}`,
          '',
          activityId,
          ...(counted ? ['0', '0'] : []),
        );
      }
      const replies = (await p.exec()) ?? [];
      const failed = replies.find(([err]) => err);
      if (failed) throw failed[0]!;
    }
  };
  await Promise.all(Array.from({ length: inFlight }, worker));
}
