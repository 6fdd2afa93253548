// Smoke: transactions through pg on a fresh database cloned from a migrated template.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import pg from 'pg';
import { migrate } from '../../../core/db/migrate.js';
import { createPool, inTransaction, isTransientDbError } from '../../../core/db/pool.js';
import { migrations } from '../../../core/db/migrations.js';
import { freshDatabase, testEnv, uniqueId, type FreshDatabase } from '../../../dev/servers.js';
import { ROOT } from '../../../dev/roles.js';

const SMOKE_TEMPLATE = 'flashsale_smoke_template';

/** A stand-in migration runner, so this smoke test does not depend on the project's schema. */
async function smokeMigrate(url: string): Promise<string[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rowCount } = await client.query(
      "SELECT 1 FROM information_schema.tables WHERE table_name = 'smoke_orders'",
    );
    if (rowCount) return [];
    await client.query('CREATE TABLE smoke_orders (id text PRIMARY KEY, qty int NOT NULL CHECK (qty > 0))');
    return ['0001_smoke_orders'];
  } finally {
    await client.end();
  }
}

// jest's per-project testTimeout is ignored by jest 29: each hook and test sets its own.
const TIMEOUT_MS = 120_000;

describe('postgres smoke', () => {
  let db: FreshDatabase;
  let pool: pg.Pool;

  beforeAll(async () => {
    db = await freshDatabase({ template: SMOKE_TEMPLATE, migrate: smokeMigrate });
    pool = new pg.Pool({ connectionString: db.url, max: 4 });
  }, TIMEOUT_MS);
  afterAll(async () => {
    await pool.end();
    await db.drop();
  }, TIMEOUT_MS);

  it(
    'gives each caller its own database cloned from the migrated template, also when racing',
    async () => {
      const clones = await Promise.all(
        [1, 2, 3].map(() => freshDatabase({ template: SMOKE_TEMPLATE, migrate: smokeMigrate })),
      );
      try {
        expect(new Set([db.name, ...clones.map((c) => c.name)]).size).toBe(4);
        for (const clone of clones) {
          expect(clone.name).toMatch(/^[a-z0-9_]+$/);
          await expect(smokeMigrate(clone.url)).resolves.toEqual([]); // the table came from the template
        }
      } finally {
        await Promise.all(clones.map((c) => c.drop()));
      }
      const admin = new pg.Client({ connectionString: testEnv().databaseUrl });
      await admin.connect();
      const left = await admin.query('SELECT datname FROM pg_database WHERE datname = ANY($1)', [
        clones.map((c) => c.name),
      ]);
      await admin.end();
      expect(left.rows).toEqual([]);
    },
    TIMEOUT_MS,
  );

  it(
    'a pooled connection the server ends while it is checked out fails its query, not the process',
    () => {
      const r = spawnSync(
        process.execPath,
        ['--import', 'tsx', join(ROOT, 'test', 'fixtures', 'pg-server-ends-connection.ts'), db.url],
        { cwd: ROOT, encoding: 'utf8', timeout: 60_000 },
      );
      expect({ status: r.status, stderr: r.status === 0 ? '' : r.stderr }).toEqual({ status: 0, stderr: '' });
      const out = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { answer: string; next: number };
      expect(out.answer).toMatch(
        /^(refused|transaction failed): .*(terminat|connection error|not queryable)/,
      );
      // pg's messages that isTransientDbError reads as an outage (answered 503, retried).
      expect(isTransientDbError(new Error(out.answer))).toBe(true);
      expect(out.next).toBe(1);
    },
    TIMEOUT_MS,
  );

  it(
    'makes committed rows visible to other sessions only after COMMIT, and discards rolled-back ones',
    async () => {
      const committed = uniqueId('order');
      const rolledBack = uniqueId('order');
      const tx = await pool.connect();
      try {
        await tx.query('BEGIN');
        await tx.query('INSERT INTO smoke_orders (id, qty) VALUES ($1, 2)', [committed]);
        const before = await pool.query('SELECT id FROM smoke_orders WHERE id = $1', [committed]);
        expect(before.rowCount).toBe(0); // not visible to another session yet
        await tx.query('COMMIT');

        await tx.query('BEGIN');
        await tx.query('INSERT INTO smoke_orders (id, qty) VALUES ($1, 1)', [rolledBack]);
        await tx.query('ROLLBACK');
      } finally {
        tx.release();
      }
      const rows = await pool.query('SELECT id, qty FROM smoke_orders WHERE id = ANY($1)', [
        [committed, rolledBack],
      ]);
      expect(rows.rows).toEqual([{ id: committed, qty: 2 }]);
    },
    TIMEOUT_MS,
  );

  it(
    'rolls back the whole transaction when a statement violates a constraint',
    async () => {
      const id = uniqueId('order');
      const tx = await pool.connect();
      try {
        await tx.query('BEGIN');
        await tx.query('INSERT INTO smoke_orders (id, qty) VALUES ($1, 1)', [id]);
        await expect(
          tx.query('INSERT INTO smoke_orders (id, qty) VALUES ($1, 0)', [`${id}-b`]),
        ).rejects.toThrow(/check constraint/);
        await tx.query('ROLLBACK');
      } finally {
        tx.release();
      }
      const rows = await pool.query('SELECT 1 FROM smoke_orders WHERE id = $1', [id]);
      expect(rows.rowCount).toBe(0);
    },
    TIMEOUT_MS,
  );

  it(
    'drops a connection whose query outlived query_timeout, so the next transaction gets a working one',
    async () => {
      // One connection: the second transaction gets whatever the first one left in the pool.
      const timed = createPool(db.url, 1, 'smoke-query-timeout', { queryTimeoutMs: 300 });
      const id = uniqueId('order');
      try {
        await expect(
          inTransaction(timed, async (c) => {
            await c.query('INSERT INTO smoke_orders (id, qty) VALUES ($1, 1)', [id]);
            await c.query('SELECT pg_sleep(3)'); // a server that does not answer, as the client sees it
          }),
        ).rejects.toThrow('Query read timeout');
        // Had the connection gone back to the pool, its BEGIN would wait behind the sleep and time out.
        await expect(
          inTransaction(timed, async (c) => (await c.query('SELECT 1 AS one')).rows),
        ).resolves.toEqual([{ one: 1 }]);
        const rows = await pool.query('SELECT 1 FROM smoke_orders WHERE id = $1', [id]);
        expect(rows.rowCount).toBe(0); // the first transaction's row went with its connection
      } finally {
        await timed.end();
      }
    },
    TIMEOUT_MS,
  );

  it(
    'clones the template migrated by core/db/migrate.ts',
    async () => {
      const project = await freshDatabase();
      try {
        await expect(migrate(project.url)).resolves.toEqual([]); // nothing left to apply on the clone
        const client = new pg.Client({ connectionString: project.url });
        await client.connect();
        try {
          const { rows } = await client.query<{ version: number }>(
            'SELECT version FROM schema_migrations ORDER BY version',
          );
          expect(migrations.length).toBeGreaterThan(0);
          expect(rows.map((r) => r.version)).toEqual(migrations.map((m) => m.version).sort((a, b) => a - b));
        } finally {
          await client.end();
        }
      } finally {
        await project.drop();
      }
    },
    TIMEOUT_MS,
  );
});
