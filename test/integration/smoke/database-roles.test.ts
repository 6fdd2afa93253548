// The runtime's database account is data-only: the migrations (run by the schema owner) create
// the role flashsale_runtime and grant it SELECT/INSERT/UPDATE/DELETE on every table, including
// tables of later migrations; a login user that is a member of it can run the order path and the
// operator's stores but cannot change the schema (docs/install.md, "Database accounts").
import pg from 'pg';
import { createPool } from '../../../core/db/pool.js';
import { claimActivityId, readClaim, releaseUnusedClaim } from '../../../core/db/claims-store.js';
import { readCatalog, upsertCatalogItems } from '../../../core/db/catalog-store.js';
import { freshDatabase, testEnv, uniqueId, type FreshDatabase } from '../../../dev/servers.js';

const TIMEOUT_MS = 120_000;

describe('database accounts', () => {
  let db: FreshDatabase;
  let owner: pg.Pool;
  let runtime: pg.Pool;
  const user = uniqueId('app').replace(/-/g, '_');

  beforeAll(async () => {
    db = await freshDatabase();
    // createPool ignores errors of idle clients (a backend ended by DROP DATABASE … FORCE at teardown).
    owner = createPool(db.url, 1);
    await owner.query(`CREATE ROLE ${user} LOGIN PASSWORD 'app' IN ROLE flashsale_runtime`);
    const url = new URL(db.url);
    url.username = user;
    url.password = 'app';
    runtime = createPool(url.toString(), 1);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await runtime?.end();
    await owner?.end();
    await db?.drop();
    // Roles belong to the server, not to the dropped database.
    const admin = new pg.Client({ connectionString: testEnv().databaseUrl });
    await admin.connect();
    await admin.query(`DROP ROLE IF EXISTS ${user}`);
    await admin.end();
  }, TIMEOUT_MS);

  it(
    'reads and writes data through the stores',
    async () => {
      expect((await runtime.query<{ u: string }>('SELECT current_user AS u')).rows[0]?.u).toBe(user);
      await upsertCatalogItems(runtime, [
        { namespace: 'shop', catalog: 'c', skuId: 'a', name: '茶', price: '1.50', stock: 2, limitPerUser: 1 },
      ]);
      expect(await readCatalog(runtime, 'shop', 'c')).toEqual([
        { skuId: 'a', name: '茶', price: '1.50', stock: 2, limitPerUser: 1 },
      ]);
      const claimant = { uid: 'u-1', namespace: 'shop', name: 'spring' };
      expect(await claimActivityId(runtime, 'shop.spring-1', claimant)).toMatchObject({ ownerUid: 'u-1' });
      expect(await readClaim(runtime, 'shop.spring-1')).toMatchObject({ ownerName: 'spring' });
      await runtime.query('DELETE FROM catalog_items WHERE namespace = $1', ['shop']);
      // Identity columns need no sequence grant beyond the migration's.
      const inserted = await runtime.query<{ id: string }>(
        `INSERT INTO order_journal (activity_id, reservation_id, event) VALUES ('a', 'r', 'TEST') RETURNING id`,
      );
      expect(inserted.rowCount).toBe(1);
    },
    TIMEOUT_MS,
  );

  it(
    'cannot change the schema or the migration bookkeeping',
    async () => {
      const refused = async (sql: string): Promise<string> =>
        runtime.query(sql).then(
          () => 'allowed',
          (err: unknown) => (err as { code?: string }).code ?? String(err),
        );
      // 42501 insufficient_privilege: no DDL on the schema, no owner rights on the tables.
      expect(await refused('CREATE TABLE intruder (id int)')).toBe('42501');
      expect(await refused('DROP TABLE orders')).toBe('42501');
      expect(await refused('ALTER TABLE orders ADD COLUMN x int')).toBe('42501');
      expect(await refused('TRUNCATE activity_claims')).toBe('42501');
      expect(await refused('CREATE INDEX i ON orders (user_id)')).toBe('42501');
      expect(await refused(`INSERT INTO schema_migrations (version, name) VALUES (999, 'x')`)).toBe('42501');
      expect(await refused('DELETE FROM schema_migrations')).toBe('42501');
    },
    TIMEOUT_MS,
  );

  it(
    "gets data rights on tables of later migrations (the owner's default privileges)",
    async () => {
      await owner.query('CREATE TABLE later_table (id int PRIMARY KEY)');
      await runtime.query('INSERT INTO later_table VALUES (1)');
      expect((await runtime.query('SELECT id FROM later_table')).rows).toEqual([{ id: 1 }]);
    },
    TIMEOUT_MS,
  );

  it(
    'activity id claims: the first claim wins, topic-name twins collide, only the owner releases',
    async () => {
      const a = { uid: 'uid-a', namespace: 'shop', name: 'a' };
      const b = { uid: 'uid-b', namespace: 'rival', name: 'b' };
      expect(await claimActivityId(runtime, 'sale.x', a)).toMatchObject({ ownerUid: 'uid-a' });
      // Concurrent and repeated claims: whoever comes later gets the first claim back.
      const again = await Promise.all([
        claimActivityId(runtime, 'sale.x', b),
        claimActivityId(runtime, 'sale.x', a),
      ]);
      expect(again.map((c) => c.ownerUid)).toEqual(['uid-a', 'uid-a']);
      // 'sale_x' is the same Kafka topic name as 'sale.x' (metrics): refused, naming the holder.
      expect(await claimActivityId(runtime, 'sale_x', b)).toMatchObject({
        activityId: 'sale.x',
        ownerUid: 'uid-a',
      });
      expect(await readClaim(runtime, 'sale_x')).toBeUndefined();
      await releaseUnusedClaim(runtime, 'sale.x', 'uid-b');
      expect(await readClaim(runtime, 'sale.x')).toMatchObject({ ownerUid: 'uid-a' });
      await releaseUnusedClaim(runtime, 'sale.x', 'uid-a');
      expect(await claimActivityId(runtime, 'sale_x', b)).toMatchObject({
        activityId: 'sale_x',
        ownerUid: 'uid-b',
      });
    },
    TIMEOUT_MS,
  );
});
