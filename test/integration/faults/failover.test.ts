// Fault window 12: the Redis primary is SIGKILLed mid-sale under load, Sentinel promotes the
// replica, the roles reconnect through Sentinel (core/redis.ts), and the killed node comes back as
// a replica (as its pod would). With RESERVE_ACK=replica the api answers 202 only for
// reservations the replica has (core/durable-ack.ts), so: 0 oversold, every 202 maps to exactly one
// order, nothing acknowledged is lost, and the invariant checker finds Redis and PostgreSQL agreeing.
// Heavy (its own primary, replica and three Sentinels from test/env/start-redis-sentinel.sh): it
// runs under `make faults` (FAULT_HEAVY=1) only.
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { readStock } from '../../../core/activity-cache.js';
import { parseSentinels } from '../../../core/redis.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import { recordRun } from '../../faults/harness/results.js';
import { Sale, buyers, prepareActivity, recoverAndCheck, redisOf, sleep } from '../../faults/harness/sale.js';
import type { Servers } from '../../faults/harness/sale.js';
import { startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';
import { waitFor } from '../../../dev/roles.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

const run = promisify(execFile);
const heavy = process.env.FAULT_HEAVY === '1';
const STOCK = 60;
const BUYERS = 150;

async function redisCli(port: string, ...args: string[]): Promise<string> {
  return (await run('redis-cli', ['-p', port, ...args])).stdout.trim();
}

(heavy ? describe : describe.skip)('window 12: Redis primary SIGKILLed mid-sale, Sentinel failover', () => {
  let priv: PrivateServers;
  let db: FreshDatabase;
  let servers: Servers;
  let sale: Sale | undefined;

  beforeAll(async () => {
    priv = await startPrivateServers(['redis-sentinel']);
    db = await freshDatabase();
    servers = {
      databaseUrl: db.url,
      redisUrl: `redis://127.0.0.1:${priv.env.REDIS_SENTINEL_PRIMARY_PORT!}`,
      kafkaBrokers: testEnv().kafkaBrokers,
      sentinel: {
        sentinels: parseSentinels(priv.env.REDIS_SENTINELS!.split(',')),
        sentinelMaster: priv.env.REDIS_SENTINEL_MASTER!,
      },
    };
  }, 180_000);

  afterAll(async () => {
    await sale?.stop();
    await db?.drop();
    if (priv) await stopPrivateServers(priv);
  }, 180_000);

  test('0 oversold, every 202 is exactly one order, nothing acknowledged lost (RESERVE_ACK=replica)', async () => {
    const t0 = Date.now();
    const e = priv.env;
    const activityId = uniqueId('f-failover');
    await prepareActivity(servers, activityId, [
      { skuId: 'rice', name: '五常大米 稻花香 5kg', price: '89.90', stock: STOCK, limitPerUser: 1 },
    ]);
    sale = new Sale({ servers, activityId, env: { RESERVE_ACK: 'replica', RESERVE_ACK_TIMEOUT_MS: '500' } });
    const s = sale;
    await s.start();
    const ids = Array.from({ length: BUYERS }, (_, i) => `${activityId}-b${i}`);
    const load = buyers(s, activityId, ids, { skuId: 'rice', concurrency: 6, maxAttempts: 400 });

    // Mid-sale: once a fifth of the stock is reserved, the primary dies without a word.
    const watcher = redisOf(servers, { maxRetriesPerRequest: 3 });
    try {
      await waitFor('a fifth of the stock reserved', async () => {
        const st = await readStock(watcher, activityId);
        return st.reserved >= STOCK / 5;
      });
    } finally {
      watcher.disconnect();
    }
    const oldPort = e.REDIS_SENTINEL_PRIMARY_PORT!;
    const pidFile = join(priv.state, 'redis-sentinel-primary.pid');
    process.kill(Number(readFileSync(pidFile, 'utf8').trim()), 'SIGKILL');
    const sentinelPort = String(servers.sentinel!.sentinels[0]!.port);
    await waitFor(
      'Sentinel to promote the replica',
      async () =>
        (
          await redisCli(sentinelPort, 'sentinel', 'get-master-addr-by-name', e.REDIS_SENTINEL_MASTER!)
        ).endsWith(e.REDIS_SENTINEL_REPLICA_PORT!),
      60_000,
      100,
    );
    await sleep(1000);
    // The killed node restarts (as its pod would) and Sentinel makes it a replica of the new primary.
    await run('redis-server', [e.REDIS_SENTINEL_PRIMARY_CONF!]);
    await waitFor(
      'the old primary to rejoin as a replica',
      async () => /^role:slave/m.test(await redisCli(oldPort, 'info', 'replication')),
      60_000,
      200,
    );

    const answers = await load;
    const rec = await recoverAndCheck(servers, activityId, 180_000);
    await s.stop();
    sale = undefined;

    const accepted = answers.filter((a) => a.status === 202);
    const undecided = answers.filter((a) => a.status === 0 || a.status >= 500);
    const sql = new pg.Pool({ connectionString: db.url, max: 1 });
    const v = [...rec.violations];
    let figures: Record<string, number | string> = {};
    try {
      const perRsv = await sql.query<{ reservation_id: string; n: string; live: string }>(
        `SELECT reservation_id, count(*)::text AS n, count(*) FILTER (WHERE status <> 'CLOSED')::text AS live
           FROM orders WHERE activity_id = $1 GROUP BY reservation_id`,
        [activityId],
      );
      const orders = new Map(perRsv.rows.map((r) => [r.reservation_id, r]));
      const lost = accepted.filter((a) => orders.get(a.reservationId!)?.live !== '1');
      if (lost.length > 0) {
        v.push({
          rule: 'missing-order',
          detail: `${lost.length} 202(s) without exactly one live order: ${lost
            .slice(0, 5)
            .map((a) => a.reservationId)
            .join(', ')}`,
        });
      }
      const live = await sql.query<{ q: string; prevented: string }>(
        `SELECT coalesce(sum(quantity) FILTER (WHERE status <> 'CLOSED'), 0)::text AS q,
                count(*) FILTER (WHERE close_reason IN ('OVERSELL_PREVENTED', 'BUYER_LIMIT_EXCEEDED'))::text AS prevented
           FROM orders WHERE activity_id = $1`,
        [activityId],
      );
      const sold = Number(live.rows[0]!.q);
      if (sold > STOCK)
        v.push({ rule: 'stock-conservation', detail: `${sold} live units of a stock of ${STOCK}` });
      if (undecided.length > 0) {
        v.push({
          rule: 'missing-order',
          detail: `${undecided.length} buyer(s) never got a definitive answer`,
        });
      }
      figures = {
        '202': accepted.length,
        'live units': sold,
        stock: STOCK,
        'guard closed': Number(live.rows[0]!.prevented),
        'answered 503 at least once': answers.filter((a) => a.attempts > 1).length,
      };
    } finally {
      await sql.end();
    }
    const text = formatViolations(v);
    console.log(`window 12 (Redis failover) figures: ${JSON.stringify(figures)}`);
    recordRun({
      scenario: 'window 12 (Redis failover)',
      outcome: text === '' ? 'pass' : 'fail',
      ms: Date.now() - t0,
      figures,
      ...(text ? { detail: text } : {}),
    });
    expect(text).toBe('');
    expect(accepted.length).toBe(STOCK); // oversubscribed: the whole stock, once
  });
});
