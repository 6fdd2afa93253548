// PostgreSQL refusing the consumer's writes for a reason of its own, not of the orders: its disk
// full (53100), a standby or a demoted primary the pool still reaches (25006, "cannot execute INSERT
// in a read-only transaction"), an I/O error (58030). Every order would fail alike, so the consumer
// must retry with backoff for as long as it lasts, like a connection lost, not dead-letter the sale's
// orders after CONSUMER_MAX_ATTEMPTS as if each were poison; once PostgreSQL writes again, every
// order lands once. The refusal is injected by a trigger on `orders` raising the SQLSTATE the test
// puts in a table (a real server raising a real error, as a full disk or a standby would).
import pg from 'pg';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { httpClient, setUpActivity, startRole, tokenFor, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import { total } from '../../fixtures/metrics-text.js';

const TIMEOUT_MS = 180_000;

const refusals = [
  ['53100', 'could not extend file "base/16384/16385": No space left on device'],
  ['25006', 'cannot execute INSERT in a read-only transaction'],
  ['58030', 'could not write to file "pg_wal/xlogtemp.123": Input/output error'],
] as const;

describe('the consumer while PostgreSQL refuses its writes', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let all: RoleProcess;
  const activityId = uniqueId('pgref');
  const http = httpClient(4);

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    await sql.query(`
      CREATE TABLE test_fault (code text NOT NULL, message text NOT NULL);
      CREATE FUNCTION test_refuse_orders() RETURNS trigger LANGUAGE plpgsql AS $$
      DECLARE f record;
      BEGIN
        SELECT code, message INTO f FROM test_fault LIMIT 1;
        IF FOUND THEN RAISE EXCEPTION '%', f.message USING ERRCODE = f.code; END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER test_refuse_orders BEFORE INSERT ON orders
        FOR EACH ROW EXECUTE FUNCTION test_refuse_orders();
    `);
    await setUpActivity(
      activityId,
      [{ skuId: 'duck', name: '北京烤鸭 礼盒装', price: '198.00', stock: 10, limitPerUser: 1 }],
      { databaseUrl: db.url },
    );
    all = await startRole('all', {
      activityId,
      databaseUrl: db.url,
      env: { CONSUMER_MAX_ATTEMPTS: '3', JOBS_GAUGE_CRON: '*/1 * * * * *' },
    });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await all?.stop();
    await http.close();
    await sql?.end();
    await db?.drop();
  }, TIMEOUT_MS);

  /** A metric of the role, summed over its series that carry `labels` (this activity's). */
  const metric = async (name: string, labels: Record<string, string> = {}): Promise<number> => {
    const r = await http.raw(`${all.metricsUrl}/metrics`, { method: 'GET' });
    return total(String(r.json.raw ?? ''), name, { activity: activityId, ...labels });
  };
  const ordersOf = async (buyer: string): Promise<number> =>
    (await sql.query('SELECT 1 FROM orders WHERE user_id = $1', [buyer])).rowCount ?? 0;

  test(
    'each refusal is retried until PostgreSQL writes again: no order dead-lettered, each order once',
    async () => {
      for (const [code, message] of refusals) {
        await sql.query('INSERT INTO test_fault (code, message) VALUES ($1, $2)', [code, message]);
        const buyer = `buyer-${code}`;
        const before = await metric('flashsale_consumer_retries_total');
        const ok = await http.post(
          `${all.url}/v1/activities/${activityId}/orders`,
          { skuId: 'duck', quantity: 1, requestId: `r-${code}` },
          await tokenFor(buyer),
        );
        expect(ok.status).toBe(202);
        // More failed attempts than CONSUMER_MAX_ATTEMPTS, or a dead letter: either settles it.
        await waitFor(
          `the consumer's attempts at ${buyer}'s order (${code})`,
          async () =>
            (await metric('flashsale_consumer_retries_total')) - before > 3 ||
            (await metric('flashsale_dlq_messages_total')) > 0,
          60_000,
          250,
        );
        expect({ code, deadLetters: await metric('flashsale_dlq_messages_total') }).toEqual({
          code,
          deadLetters: 0,
        });
        expect(await ordersOf(buyer)).toBe(0);

        await sql.query('DELETE FROM test_fault');
        await waitFor(
          `${buyer}'s order after PostgreSQL writes again`,
          async () => (await ordersOf(buyer)) === 1,
        );
      }
      expect(await metric('flashsale_consumer_retries_total', { reason: 'poison' })).toBe(0);
      expect(await metric('flashsale_dlq_messages_total')).toBe(0);
      const orders = await sql.query<{ n: string }>(
        'SELECT count(*) AS n FROM orders WHERE activity_id = $1',
        [activityId],
      );
      expect(Number(orders.rows[0]!.n)).toBe(refusals.length);
    },
    TIMEOUT_MS,
  );
});
