/**
 * PostgreSQL references, driven by pgbench against the project's own schema (the `orders` table
 * with all its indexes, and `activity_stock`):
 *
 * - the database-only approach of seed 004 (docs/sources): in one transaction, a conditional UPDATE of one hot
 *   stock row (`remaining >= 1`) and the order insert, at the same concurrency as the api load;
 * - the consumer's ceiling: one 500-row `INSERT ... ON CONFLICT DO NOTHING` per transaction.
 */
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Ctx } from './context.js';
import { log, mustRun, percentile } from './util.js';

export interface PgbenchResult {
  tps: number;
  transactions: number;
  failed: number;
  p50Ms: number | undefined;
  p99Ms: number | undefined;
}

const sqlText = (s: string): string => `'${s.replace(/'/g, "''")}'`;

async function pgbench(
  ctx: Ctx,
  name: string,
  script: string,
  clients: number,
  seconds: number,
  logLatencies: boolean,
): Promise<PgbenchResult> {
  const file = join(ctx.logDir, `${name}.sql`);
  writeFileSync(file, script);
  const prefix = join(ctx.logDir, `pgbench-${name}`);
  const args = [
    '-n',
    '-M',
    'prepared',
    '-c',
    String(clients),
    '-j',
    String(Math.min(2, clients)),
    '-T',
    String(seconds),
    '-f',
    file,
    ...(logLatencies ? ['-l', `--log-prefix=${prefix}`] : []),
    ctx.servers.env.DATABASE_URL!,
  ];
  const r = await mustRun(join(ctx.servers.pgBin, 'pgbench'), args, {
    cwd: ctx.logDir,
    timeoutMs: (seconds + 120) * 1000,
  });
  const tps = Number(/tps = ([\d.]+) \(without initial connection time\)/.exec(r.stdout)?.[1] ?? NaN);
  const transactions = Number(/actually processed: (\d+)/.exec(r.stdout)?.[1] ?? NaN);
  const failed = Number(/number of failed transactions: (\d+)/.exec(r.stdout)?.[1] ?? 0);
  let p50Ms: number | undefined;
  let p99Ms: number | undefined;
  if (logLatencies) {
    // Per-transaction log lines: client_id transaction_no time_us script_no epoch epoch_us
    const lat: number[] = [];
    const base = `pgbench-${name}.`;
    for (const f of readdirSync(ctx.logDir).filter((x) => x.startsWith(base))) {
      for (const line of readFileSync(join(ctx.logDir, f), 'utf8').split('\n')) {
        const us = Number(line.split(' ')[2]);
        if (Number.isFinite(us) && line) lat.push(us / 1000);
      }
    }
    lat.sort((a, b) => a - b);
    p50Ms = percentile(lat, 50);
    p99Ms = percentile(lat, 99);
  }
  return { tps, transactions, failed, p50Ms, p99Ms };
}

/** Source 004's database-only reservation: hot-row conditional UPDATE + order insert. */
export async function dbOnly(ctx: Ctx, activityId: string, clients: number, seconds: number) {
  const a = sqlText(activityId);
  await ctx.pool.query(
    `INSERT INTO activity_stock (activity_id, sku_id, initial_stock, remaining)
     VALUES ($1, 'hot', 1000000000, 1000000000) ON CONFLICT DO NOTHING`,
    [activityId],
  );
  const script = `\\set b random(1, 1000000000000)
BEGIN;
UPDATE activity_stock SET remaining = remaining - 1, updated_at = now()
 WHERE activity_id = ${a} AND sku_id = 'hot' AND remaining >= 1;
INSERT INTO orders (reservation_id, activity_id, user_id, sku_id, slot, quantity, unit_price, amount,
                    item_name, status, trace_id, reserved_at, expires_at)
VALUES ('d' || :client_id || '-' || :b, ${a}, 'u' || :client_id || '-' || :b, 'hot', 1, 1, 19.99, 19.99,
        'Bench item hot', 'UNPAID', 't', now(), now() + interval '15 minutes');
COMMIT;
`;
  const r = await pgbench(ctx, 'db-only', script, clients, seconds, true);
  log(`pgbench database-only -c ${clients}: ${r.tps.toFixed(0)} tx/s, p50 ${r.p50Ms} ms, p99 ${r.p99Ms} ms`);
  return r;
}

export const CEILING_ROWS = 500;

/** The consumer's write ceiling: 500-row INSERT ... ON CONFLICT DO NOTHING into `orders`. */
export async function insertCeiling(ctx: Ctx, activityId: string, clients: number, seconds: number) {
  const a = sqlText(activityId);
  const script = `\\set b random(1, 1000000000000)
INSERT INTO orders (reservation_id, activity_id, user_id, sku_id, slot, quantity, unit_price, amount,
                    item_name, status, trace_id, reserved_at, expires_at)
SELECT 'c' || :b || '-' || g, ${a}, 'u' || :b || '-' || g, 'hot', 1, 1, 19.99, 19.99,
       'Bench item hot', 'UNPAID', 't', now(), now() + interval '15 minutes'
  FROM generate_series(1, ${CEILING_ROWS}) AS g
ON CONFLICT DO NOTHING;
`;
  const r = await pgbench(ctx, `ceiling-c${clients}`, script, clients, seconds, false);
  const rowsPerS = r.tps * CEILING_ROWS;
  log(`pgbench ${CEILING_ROWS}-row insert -c ${clients}: ${Math.round(rowsPerS)} rows/s`);
  return { ...r, rowsPerS };
}

export async function pgSettings(ctx: Ctx): Promise<Record<string, string>> {
  const names = ['server_version', 'synchronous_commit', 'fsync', 'shared_buffers', 'wal_level'];
  const res = await ctx.pool.query<{ name: string; setting: string }>(
    `SELECT name, current_setting(name) AS setting FROM pg_settings WHERE name = ANY($1)`,
    [names],
  );
  return Object.fromEntries(res.rows.map((r) => [r.name, r.setting]));
}
