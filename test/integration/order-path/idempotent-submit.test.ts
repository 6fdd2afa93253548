// One buyer, one requestId, ten concurrent submissions -> one reservation, one order.
import pg from 'pg';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { httpClient, setUpActivity, startRole, tokenFor, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

describe('idempotent submission', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let all: RoleProcess;
  const activityId = uniqueId('idem');
  const http = httpClient(16);

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    await setUpActivity(
      activityId,
      [{ skuId: 'tea', name: '西湖龙井 明前特级 250g', price: '388.80', stock: 10, limitPerUser: 2 }],
      { databaseUrl: db.url },
    );
    all = await startRole('all', { activityId, databaseUrl: db.url });
  });

  afterAll(async () => {
    await all.stop();
    await http.close();
    await sql.end();
    await db.drop();
  });

  test('ten concurrent submissions share one reservation id and make one order', async () => {
    const token = await tokenFor('alice');
    const url = `${all.url}/v1/activities/${activityId}/orders`;
    const answers = await Promise.all(
      Array.from({ length: 10 }, () =>
        http.post(url, { skuId: 'tea', quantity: 2, requestId: 'one-click' }, token),
      ),
    );
    expect(answers.map((a) => a.status)).toEqual(Array(10).fill(202));
    const ids = new Set(answers.map((a) => a.json.reservationId));
    expect(ids.size).toBe(1);
    expect(answers.filter((a) => a.json.replayed === false)).toHaveLength(1);

    const rid = [...ids][0] as string;
    const result = await waitFor('order created', async () => {
      const r = await http.get(`${url}/${rid}`, token);
      return r.json.status === 'UNPAID' ? r.json : undefined;
    });
    const rows = await sql.query('SELECT id::text, quantity, amount::text FROM orders WHERE user_id = $1', [
      'alice',
    ]);
    expect(rows.rows).toEqual([{ id: result.orderId, quantity: 2, amount: '777.60' }]);

    // The same requestId with a different body is a conflict, not a second order.
    const conflict = await http.post(url, { skuId: 'tea', quantity: 1, requestId: 'one-click' }, token);
    expect([conflict.status, conflict.json.code]).toEqual([409, 'IDEMPOTENCY_CONFLICT']);
    // Another buyer cannot read alice's reservation.
    const other = await http.get(`${url}/${rid}`, await tokenFor('mallory'));
    expect([other.status, other.json.code]).toEqual([404, 'UNKNOWN_RESERVATION']);
  });
});
