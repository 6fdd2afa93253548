/**
 * What durability costs (phase `durability`, docs/install.md "Recommended configuration"), each
 * pair measured in the same run, alternating, on the same servers:
 *
 * 1. The PostgreSQL stock guard (core/stock-guard.ts): the consumer's insert transaction (orders +
 *    journal, one transaction per batch, several clients on one hot SKU as the consumer's
 *    partitions do) with the guard and without it. With: the SKU's `activity_skus` row exists, so
 *    the sold triggers of migration 7 update and lock it, and `enforce` reads the sums. Without:
 *    the same transaction on an activity with no `activity_skus` row and no `enforce` (the triggers
 *    still fire and find no row). Rows per second over the same time.
 * 2. Redis WAIT (core/durable-ack.ts): the api's submit rate and p99 with RESERVE_ACK=local and
 *    with RESERVE_ACK=replica, against a real replica of the benchmark's Redis started here
 *    (redis-server --replicaof on loopback, stopped at the end of the phase).
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { recordActivitySkus } from '../../core/db/activity-skus-store.js';
import { appendJournal } from '../../core/db/journal-store.js';
import { insertOrders } from '../../core/db/orders-store.js';
import { createLogger } from '../../core/logger.js';
import { createMetrics } from '../../core/metrics.js';
import type { OrderMessage } from '../../core/model.js';
import { StockGuard } from '../../core/stock-guard.js';
import { ephemeralRedisArgs } from '../../dev/ephemeral-redis.js';
import { benchItem, openActivity } from './context.js';
import type { Ctx } from './context.js';
import { Buyers, describe, orderLoad } from './http-load.js';
import type { LoadResult } from './http-load.js';
import { startRole, stopRole } from './runtime.js';
import { freePort, log, mustRun, runCmd, sleep, waitFor } from './util.js';

export interface GuardRun {
  guarded: boolean;
  rows: number;
  seconds: number;
  rowsPerS: number;
}

export interface WaitRun {
  ack: 'local' | 'replica';
  load: LoadResult;
}

export interface DurabilityResult {
  guard?: { clients: number; batch: number; runs: GuardRun[]; withGuard: number; withoutGuard: number };
  wait?: { runs: WaitRun[]; local: Summary; replica: Summary; replicaLagNote: string };
}

export interface Summary {
  rps: number;
  okRps: number;
  p99Ms: number;
  p50Ms: number;
}

const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

async function insertRun(
  ctx: Ctx,
  pool: pg.Pool,
  activityId: string,
  guarded: boolean,
  clients: number,
  batch: number,
  seconds: number,
  seq: { n: number },
): Promise<GuardRun> {
  const guard = guarded
    ? new StockGuard({
        activityId,
        pool,
        redis: ctx.redis,
        logger: createLogger('bench-guard', 'silent'),
        metrics: createMetrics('bench'),
        paymentTimeoutSeconds: 900,
      })
    : undefined;
  const deadline = performance.now() + seconds * 1000;
  let rows = 0;
  const t0 = performance.now();
  const client = async (): Promise<void> => {
    while (performance.now() < deadline) {
      const orders: OrderMessage[] = Array.from({ length: batch }, () => {
        const i = (seq.n += 1);
        return {
          reservationId: `g${ctx.runId}-${i}`,
          activityId,
          userId: `gu${ctx.runId}-${i}`,
          skuId: 'hot',
          quantity: 1,
          slot: 1,
          unitPrice: '19.99',
          itemName: 'Bench item hot',
          reservedAt: Date.now(),
          traceId: '',
          requestId: `q${i}`,
        };
      });
      await guard?.prepare(orders);
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        const outcome = await insertOrders(c, orders, 900);
        await appendJournal(
          c,
          [...outcome.inserted].map(([rid, orderId]) => ({
            activityId,
            reservationId: rid,
            orderId,
            event: 'ORDER_CREATED',
            toStatus: 'UNPAID',
            traceId: '',
          })),
        );
        if (guard) await guard.enforce(c, orders, outcome.inserted);
        await c.query('COMMIT');
        rows += outcome.inserted.size;
      } catch (err) {
        await c.query('ROLLBACK').catch(() => undefined);
        throw err;
      } finally {
        c.release();
      }
    }
  };
  await Promise.all(Array.from({ length: clients }, client));
  const s = (performance.now() - t0) / 1000;
  return { guarded, rows, seconds: s, rowsPerS: rows / s };
}

async function guardCost(ctx: Ctx): Promise<NonNullable<DurabilityResult['guard']>> {
  const clients = 4;
  const batch = 50;
  const seconds = Math.min(ctx.cfg.durationS, 5);
  const withId = `bguard-${ctx.runId}`;
  const withoutId = `bnoguard-${ctx.runId}`;
  const item = benchItem('hot', 1_000_000_000);
  // Only the guarded activity has its activity_skus row (what the operator writes before loading).
  await recordActivitySkus(ctx.pool, withId, [item], 'spec');
  const pool = new pg.Pool({ connectionString: ctx.servers.env.DATABASE_URL!, max: clients + 1 });
  const seq = { n: 0 };
  const runs: GuardRun[] = [];
  try {
    for (const guarded of [false, true, false, true, false, true]) {
      const r = await insertRun(
        ctx,
        pool,
        guarded ? withId : withoutId,
        guarded,
        clients,
        batch,
        seconds,
        seq,
      );
      log(`guard ${guarded ? 'on ' : 'off'}: ${Math.round(r.rowsPerS)} rows/s (${r.rows} rows)`);
      runs.push(r);
    }
  } finally {
    await pool.end();
    await ctx.pool.query('DELETE FROM activity_skus WHERE activity_id = $1', [withId]).catch(() => undefined);
  }
  return {
    clients,
    batch,
    runs,
    withGuard: mean(runs.filter((r) => r.guarded).map((r) => r.rowsPerS)),
    withoutGuard: mean(runs.filter((r) => !r.guarded).map((r) => r.rowsPerS)),
  };
}

function summary(rs: LoadResult[]): Summary {
  return {
    rps: mean(rs.map((r) => r.rps)),
    okRps: mean(rs.map((r) => r.okRps)),
    p99Ms: mean(rs.map((r) => r.p99Ms)),
    p50Ms: mean(rs.map((r) => r.p50Ms)),
  };
}

async function waitCost(ctx: Ctx): Promise<NonNullable<DurabilityResult['wait']>> {
  const primaryPort = new URL(ctx.servers.env.REDIS_URL!).port;
  const port = await freePort();
  const dir = join(ctx.logDir, 'replica');
  mkdirSync(dir, { recursive: true });
  const pidFile = join(dir, 'redis.pid');
  await mustRun('redis-server', [
    ...ephemeralRedisArgs(port, dir, primaryPort),
    '--daemonize',
    'yes',
    '--pidfile',
    pidFile,
    '--logfile',
    join(dir, 'redis.log'),
  ]);
  const runs: WaitRun[] = [];
  try {
    await waitFor('the bench replica in sync', 60_000, async () => {
      const r = await runCmd('redis-cli', ['-p', String(port), 'info', 'replication']);
      return /master_link_status:up/.test(r.stdout) ? true : undefined;
    });
    const activityId = `bwait-${ctx.runId}`;
    await openActivity(ctx, activityId, [benchItem('hot', 1_000_000_000)]);
    const secs = ctx.cfg.durationS;
    // Tokens beyond the presigned ones are signed on demand (Buyers.take).
    const buyers = new Buyers(ctx.secret, `w${ctx.runId}-`, 50_000);
    for (const ack of ['local', 'replica', 'local', 'replica', 'local', 'replica'] as const) {
      const api = await startRole('api', {
        distDir: ctx.cfg.distDir,
        luaDir: ctx.cfg.luaDir,
        logDir: ctx.logDir,
        env: ctx.servers.env,
        activityId,
        label: `api-ack-${ack}-${runs.length}`,
        roleEnv: ctx.cfg.roleEnv,
        extraEnv: {
          JWT_HS256_SECRET: ctx.secret,
          JWT_MAX_TOKEN_AGE_SECONDS: '21600',
          RESERVE_ACK: ack,
          RESERVE_ACK_REPLICAS: '1',
        },
      });
      try {
        const base = `http://127.0.0.1:${api.port}`;
        const conns = ctx.cfg.connections;
        await orderLoad({
          baseUrl: base,
          activityId,
          skuId: 'hot',
          buyers,
          seconds: ctx.cfg.warmupS,
          connections: conns,
        });
        const load = await orderLoad({
          baseUrl: base,
          activityId,
          skuId: 'hot',
          buyers,
          seconds: secs,
          connections: conns,
        });
        log(`RESERVE_ACK=${ack}: ${describe(load)}`);
        runs.push({ ack, load });
      } finally {
        await stopRole(api);
      }
    }
  } finally {
    await runCmd('redis-cli', ['-p', String(port), 'shutdown', 'nosave']).catch(() => undefined);
    await sleep(200);
  }
  return {
    runs,
    local: summary(runs.filter((r) => r.ack === 'local').map((r) => r.load)),
    replica: summary(runs.filter((r) => r.ack === 'replica').map((r) => r.load)),
    replicaLagNote: 'one replica on the same machine (loopback), RESERVE_ACK_REPLICAS=1',
  };
}

export async function durability(ctx: Ctx): Promise<DurabilityResult> {
  const out: DurabilityResult = {};
  out.guard = await guardCost(ctx);
  out.wait = await waitCost(ctx);
  return out;
}

const f0 = (x: number): string => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');
const pct = (a: number, b: number): string =>
  Number.isFinite(a) && Number.isFinite(b) && b > 0 ? `${(((a - b) / b) * 100).toFixed(1)} %` : 'n/a';

/** The report's section (bench/lib/report.ts appends it). */
export function renderDurability(d: DurabilityResult | undefined): string[] {
  if (!d) return [];
  const L: string[] = ['', '## Cost of durability (phase `durability`, bench/lib/durability.ts)', ''];
  if (d.guard) {
    const g = d.guard;
    L.push(
      `**PostgreSQL stock guard.** The consumer's insert transaction (${g.batch} orders + journal per ` +
        `transaction, ${g.clients} clients on one hot SKU), alternating without and with the guard, same run:`,
      '',
      '| Guard | rows/s (mean) | runs |',
      '|---|---:|---|',
      `| off (no activity_skus row, no enforce) | ${f0(g.withoutGuard)} | ${g.runs
        .filter((r) => !r.guarded)
        .map((r) => f0(r.rowsPerS))
        .join(', ')} |`,
      `| on (sold triggers + row lock + enforce) | ${f0(g.withGuard)} | ${g.runs
        .filter((r) => r.guarded)
        .map((r) => f0(r.rowsPerS))
        .join(', ')} |`,
      `| change | ${pct(g.withGuard, g.withoutGuard)} | |`,
      '',
    );
  }
  if (d.wait) {
    const w = d.wait;
    L.push(
      `**Redis WAIT.** The api's submit path, RESERVE_ACK=local vs RESERVE_ACK=replica (${w.replicaLagNote}), alternating, same run:`,
      '',
      '| RESERVE_ACK | req/s | 2xx/s | p50 ms | p99 ms |',
      '|---|---:|---:|---:|---:|',
      `| local | ${f0(w.local.rps)} | ${f0(w.local.okRps)} | ${w.local.p50Ms.toFixed(1)} | ${w.local.p99Ms.toFixed(1)} |`,
      `| replica | ${f0(w.replica.rps)} | ${f0(w.replica.okRps)} | ${w.replica.p50Ms.toFixed(1)} | ${w.replica.p99Ms.toFixed(1)} |`,
      `| change | ${pct(w.replica.rps, w.local.rps)} | ${pct(w.replica.okRps, w.local.okRps)} | | ${pct(w.replica.p99Ms, w.local.p99Ms)} |`,
      '',
    );
  }
  return L;
}
