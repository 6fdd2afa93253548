// docs/local-sale.md, run as written: every ```sh block of the page, in order, in one bash shell
// from the repository's root (set -euo pipefail), with its variables pointed at names and ports of
// this test. `make env-up` then finds the test servers in DATABASE_URL, REDIS_URL, KAFKA_BROKERS
// and KUBECONFIG and starts none (and `make env-down` stops none); everything else is the page's.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { countOrders } from '../../../core/db/orders-store.js';
import { createPool } from '../../../core/db/pool.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { ROOT, freePort } from '../../../dev/roles.js';

const TIMEOUT_MS = 480_000;

function shellBlocks(markdown: string): string[] {
  return [...markdown.matchAll(/^```sh\n([\s\S]*?)^```$/gm)].map((m) => m[1] ?? '');
}

describe('docs/local-sale.md', () => {
  let db: FreshDatabase;
  let work = '';

  beforeAll(async () => {
    db = await freshDatabase();
    work = mkdtempSync(path.join(tmpdir(), 'flashsale-local-sale-'));
  }, TIMEOUT_MS);

  afterAll(async () => {
    // A step that failed may have left the page's background processes running.
    for (const f of ['runtime.pid', 'operator.pid']) {
      const file = path.join(work, f);
      if (!existsSync(file)) continue;
      try {
        process.kill(Number(readFileSync(file, 'utf8').trim()), 'SIGKILL');
      } catch {
        // already gone
      }
    }
    await db?.drop();
    // A failure has already shown the ends of the logs kept there.
    if (work) rmSync(work, { recursive: true, force: true });
  }, TIMEOUT_MS);

  it(
    'runs step by step: the sale opens, two of three buyers get an order, and everything stops',
    async () => {
      const blocks = shellBlocks(readFileSync(path.join(ROOT, 'docs', 'local-sale.md'), 'utf8'));
      expect(blocks.length).toBeGreaterThanOrEqual(10);
      const activity = uniqueId('local');
      const env: NodeJS.ProcessEnv = {
        ...process.env,
        ENV_DIR: path.join(work, 'env'),
        NS: uniqueId('sale'),
        OPERATOR_NS: uniqueId('sale-op'),
        ACTIVITY: activity,
        API_PORT: String(await freePort()),
        OPERATOR_PORT: String(await freePort()),
        WORK: work,
        DATABASE_URL: db.url,
      };
      delete env.NODE_OPTIONS; // jest's --experimental-vm-modules is none of the page's business
      const proc = spawn('bash', ['-c', `set -euo pipefail\n${blocks.join('\n')}`], {
        cwd: ROOT,
        env,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      proc.stdout.on('data', (b: Buffer) => (out += b.toString('utf8')));
      proc.stderr.on('data', (b: Buffer) => (out += b.toString('utf8')));
      const code = await new Promise<number | null>((resolve) => proc.once('exit', (c) => resolve(c)));
      if (code !== 0) {
        const log = (f: string): string =>
          existsSync(path.join(work, f)) ? readFileSync(path.join(work, f), 'utf8').slice(-3000) : '';
        throw new Error(
          `the page failed (${code}):\n${out}\n--- operator.log\n${log('operator.log')}\n--- runtime.log\n${log('runtime.log')}`,
        );
      }

      // What the page says the reader sees.
      const answers = readFileSync(path.join(work, 'answers'), 'utf8').trim().split('\n');
      expect(answers.map((l) => l.split(' ')[1]).sort()).toEqual(['202', '202', '409']);
      expect(out).toMatch(/kwok-node-0\s+Ready/);
      expect(out).toContain('flashsaleactivity.flashsale.io/double11-2030 created (server dry run)');
      expect(out).toMatch(new RegExp(`${activity}\\s+Active\\s`));
      // Both unpaid orders closed at their deadline during the sale: their units came back.
      expect(out).toMatch(/"released":2,"remaining":2/);
      expect(out).toMatch(/"orders":2,"remaining":2/);
      expect(out.match(/\|\s*tea\s*\|\s*CLOSED/g)).toHaveLength(2);
      const pg = createPool(db.url, 1);
      // Two orders, both closed: no live unit left.
      expect(await countOrders(pg, activity)).toMatchObject({
        orders: 2,
        quantity: 0,
        byStatus: { CLOSED: 2 },
      });
      await pg.end();
      // make env-down removed the page's state dir (and stopped none of the test's servers).
      expect(existsSync(path.join(work, 'env'))).toBe(false);
    },
    TIMEOUT_MS,
  );
});
