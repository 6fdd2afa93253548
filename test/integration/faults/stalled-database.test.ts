// PostgreSQL's primary stops answering mid-sale and a new one takes the traffic (a failover behind
// the database Service): the roles' open connections hang, with no error and no close, while new
// connections work. A black-hole proxy (test/faults/harness/blackhole-proxy.ts) in front of the
// suite's PostgreSQL does exactly that to every connection open at the time. Expected: the
// consumer gives up on its hung connections (pg's client-side query timeout), writes the later
// orders through new ones, and every 202 is exactly one order; before, it waited on them forever.
import pg from 'pg';
import { startBlackholeProxy } from '../../faults/harness/blackhole-proxy.js';
import type { BlackholeProxy } from '../../faults/harness/blackhole-proxy.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import type { Violation } from '../../faults/harness/invariants.js';
import { recordRun } from '../../faults/harness/results.js';
import { Sale, buyers, prepareActivity, recoverAndCheck } from '../../faults/harness/sale.js';
import type { BuyerAnswer, Servers } from '../../faults/harness/sale.js';
import { waitFor } from '../../../dev/roles.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { STATEMENT_TIMEOUT_MS } from '../../../core/db/pool.js';

/** The query timeout, a batch retried once more on another hung connection, and the relay's pace. */
const ORDERS_AFTER_STALL_DEADLINE_MS = 3 * STATEMENT_TIMEOUT_MS + 30_000;

describe('a PostgreSQL primary that stops answering, its traffic moved to a new one', () => {
  let db: FreshDatabase;
  let proxy: BlackholeProxy;
  let servers: Servers;
  let sale: Sale | undefined;

  beforeAll(async () => {
    db = await freshDatabase();
    const url = new URL(db.url);
    proxy = await startBlackholeProxy({ host: url.hostname, port: Number(url.port) });
    url.hostname = '127.0.0.1';
    url.port = String(proxy.port);
    const env = testEnv();
    servers = { databaseUrl: url.toString(), redisUrl: env.redisUrl, kafkaBrokers: env.kafkaBrokers };
  }, 60_000);

  afterAll(async () => {
    await sale?.stop();
    await proxy?.close();
    await db?.drop();
  }, 60_000);

  test('the consumer leaves its hung connections; every 202 is exactly one order', async () => {
    const t0 = Date.now();
    const activityId = uniqueId('f-pgstall');
    const STOCK = 30;
    await prepareActivity(servers, activityId, [
      { skuId: 'rice', name: '五常大米 5kg', price: '89.90', stock: STOCK, limitPerUser: 1 },
    ]);
    sale = new Sale({ servers, activityId });
    await sale.start();
    const sql = new pg.Pool({ connectionString: db.url, max: 1 });
    const v: Violation[] = [];
    let figures: Record<string, number> = {};
    try {
      const orders = async (): Promise<Map<string, number>> =>
        new Map(
          (
            await sql.query<{ reservation_id: string; n: number }>(
              `SELECT reservation_id, count(*)::int AS n FROM orders WHERE activity_id = $1 GROUP BY reservation_id`,
              [activityId],
            )
          ).rows.map((r) => [r.reservation_id, r.n]),
        );
      const wave = (n: number, size: number): Promise<BuyerAnswer[]> =>
        buyers(
          sale!,
          activityId,
          Array.from({ length: size }, (_, k) => `${activityId}-w${n}-${k}`),
          { skuId: 'rice', concurrency: 4 },
        );
      const ordered = (answers: BuyerAnswer[], what: string, timeoutMs: number): Promise<unknown> =>
        waitFor(
          what,
          async () => {
            const have = await orders();
            return answers.filter((a) => a.status === 202).every((a) => have.has(a.reservationId!));
          },
          timeoutMs,
          250,
        );

      const first = await wave(1, 10);
      await ordered(first, 'the first wave in PostgreSQL', 60_000);
      const hung = proxy.blackhole();
      const stalledAt = Date.now();
      // The consumer (and its jobs) held connections: those now hang.
      expect(hung).toBeGreaterThan(0);
      const second = await wave(2, 10);
      expect(second.filter((a) => a.status === 202)).toHaveLength(10);
      await ordered(
        second,
        'the second wave in PostgreSQL through new connections',
        ORDERS_AFTER_STALL_DEADLINE_MS,
      );
      const orderedAfter = Date.now() - stalledAt;
      const last = await wave(3, 30);
      const rec = await recoverAndCheck(servers, activityId, 120_000);
      v.push(...rec.violations);
      const have = await orders();
      const accepted = [...first, ...second, ...last].filter((a) => a.status === 202);
      figures = {
        'connections hung': hung,
        'stall to second wave ordered s': Math.round(orderedAfter / 100) / 10,
        '202': accepted.length,
        orders: [...have.values()].reduce((a, b) => a + b, 0),
      };
      expect(accepted).toHaveLength(STOCK);
      expect(accepted.filter((a) => have.get(a.reservationId!) !== 1)).toEqual([]);
      expect(have.size).toBe(STOCK);
    } finally {
      await sql.end();
      await sale.stop();
      sale = undefined;
      const text = formatViolations(v);
      console.log(`stalled database figures: ${JSON.stringify(figures)}`);
      recordRun({
        scenario: 'stalled database (PostgreSQL failover, hung connections)',
        outcome: text === '' && Object.keys(figures).length > 0 ? 'pass' : 'fail',
        ms: Date.now() - t0,
        figures,
        ...(text ? { detail: text } : {}),
      });
      expect(text).toBe('');
    }
  }, 300_000);
});
