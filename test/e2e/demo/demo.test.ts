// `make demo` in a small, fast configuration on the test servers (given through DATABASE_URL,
// REDIS_URL, KAFKA_BROKERS and KUBECONFIG, so the demo starts none of its own): it completes,
// its summary's checks pass and agree with PostgreSQL, and nothing it started is left listening,
// also when it is interrupted.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { countOrders } from '../../../core/db/orders-store.js';
import { createPool } from '../../../core/db/pool.js';
import { readStockRows } from '../../../core/db/stock-store.js';
import { freshDatabase, testEnv } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { ROOT, waitFor } from '../../../dev/roles.js';

const TIMEOUT_MS = 420_000;

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  out: string;
}

function runDemo(
  databaseUrl: string,
  env: Record<string, string>,
  onOutput?: (out: string, kill: (s: NodeJS.Signals) => void) => void,
): Promise<Run> {
  const t = testEnv();
  const proc = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'scripts', 'demo', 'main.ts')], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      DATABASE_URL: databaseUrl,
      REDIS_URL: t.redisUrl,
      KAFKA_BROKERS: t.kafkaBrokers.join(','),
      KUBECONFIG: t.kubeconfig,
      DEMO_PLAIN: '1',
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const keep = (b: Buffer): void => {
    out += b.toString('utf8');
    onOutput?.(out, (s) => proc.kill(s));
  };
  proc.stdout.on('data', keep);
  proc.stderr.on('data', keep);
  return new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal, out })));
}

/** Every http://127.0.0.1:PORT the demo printed. */
function urlsIn(out: string): string[] {
  return [...new Set([...out.matchAll(/http:\/\/127\.0\.0\.1:\d+/g)].map((m) => m[0]))];
}

async function listening(url: string): Promise<boolean> {
  try {
    await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2000) });
    return true;
  } catch {
    return false;
  }
}

const SMALL = {
  DEMO_BUYERS: '150',
  DEMO_STOCK: '40',
  DEMO_WARMUP_IN: '2',
  DEMO_START_IN: '6',
  DEMO_DURATION: '6',
  DEMO_DRAIN_TIMEOUT: '15',
  DEMO_CONCURRENCY: '16',
  // Prometheus too (its URL is printed, so the check below also sees it stopped at the end).
  DEMO_PROMETHEUS: '1',
};

describe('make demo (small configuration)', () => {
  let db: FreshDatabase;

  beforeAll(async () => {
    db = await freshDatabase();
  }, TIMEOUT_MS);

  afterAll(async () => {
    await db?.drop();
  }, TIMEOUT_MS);

  it(
    'runs a whole sale, prints a summary whose checks pass, and leaves nothing running',
    async () => {
      const run = await runDemo(db.url, SMALL);
      const context = run.out.slice(-6000);
      expect({ code: run.code, context }).toEqual({ code: 0, context });
      expect(run.out).toContain('DEMO PASSED');
      for (const check of [
        'lifecycle settled',
        'orders settled',
        'payments decided',
        'refunds once',
        'stock written back',
        'no oversell',
        'stock conserved',
        'no duplicate',
        'no lost order',
        'keys cleaned',
      ]) {
        expect(run.out).toMatch(new RegExp(`\\n\\s+ok\\s+${check}`));
      }
      // Progress lines (plain, not a terminal) show the phases; short ones may fall between two updates.
      // Settling, then Completed once the refund of the duplicate trade is done (the refund worker).
      for (const phase of ['Active', 'Settling']) expect(run.out).toContain(`phase         ${phase}`);
      expect(run.out).toMatch(/phase \w+ → Completed/);
      expect(run.out).toMatch(/payments {9}paid \d+, closed unpaid \d+, refund pending 0, refunded [1-9]/);
      expect(run.out).toMatch(/half messages \d+/);
      expect(run.out).toMatch(/order gap \(>30s\) \d+/);

      // The summary agrees with PostgreSQL: more buyers than stock, so everything sold once.
      const activityId = /Summary of activity (\S+)/.exec(run.out)?.[1] ?? '';
      expect(activityId).not.toBe('');
      const pg = createPool(db.url, 1);
      try {
        const rows = await readStockRows(pg, activityId);
        const initial = rows.reduce((n, r) => n + r.initial, 0);
        expect(initial).toBe(40);
        const orders = await countOrders(pg, activityId);
        expect(orders.quantity + rows.reduce((n, r) => n + r.remaining, 0)).toBe(initial);
        expect(run.out).toContain(`sold             ${orders.quantity} of ${initial} units`);
        expect(run.out).toContain(`orders           ${orders.orders} in PostgreSQL`);
      } finally {
        await pg.end();
      }

      // Operator and roles served metrics during the run and are gone now.
      const urls = urlsIn(run.out);
      expect(run.out).toMatch(/api\s+http:\/\/127\.0\.0\.1:\d+\/metrics \(200,/);
      // Prometheus scraped the operator and the three roles.
      expect(run.out).toMatch(/prometheus http:\/\/127\.0\.0\.1:\d+\/graph \(5 targets up\)/);
      expect(urls.length).toBeGreaterThanOrEqual(4);
      for (const url of urls) expect(await listening(url)).toBe(false);
    },
    TIMEOUT_MS,
  );

  it(
    'stops everything it started when interrupted (Ctrl-C)',
    async () => {
      let sent = false;
      const run = await runDemo(db.url, { ...SMALL, DEMO_START_IN: '30' }, (out, kill) => {
        if (!sent && out.includes('applied FlashSaleActivity')) {
          sent = true;
          kill('SIGINT');
        }
      });
      expect(sent).toBe(true);
      expect({ code: run.code, tail: run.out.slice(-3000) }).toMatchObject({ code: 130 });
      const urls = urlsIn(run.out);
      expect(urls.length).toBeGreaterThanOrEqual(4);
      await waitFor('nothing listening', async () => {
        for (const url of urls) if (await listening(url)) return false;
        return true;
      });
    },
    TIMEOUT_MS,
  );
});
