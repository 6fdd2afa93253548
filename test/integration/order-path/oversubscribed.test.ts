// An oversubscribed sale through the real api, relay and consumer processes.
import { Redis } from 'ioredis';
import pg from 'pg';
import { readOutbox, readStock } from '../../../core/activity-cache.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { httpClient, pool, setUpActivity, startRole, tokenFor, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

const STOCK = 2_000;
const BUYERS = 20_000;
const REPEATS = 5_000;

describe('oversubscribed sale', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let redis: Redis;
  const roles: RoleProcess[] = [];
  const activityId = uniqueId('over');
  const http = httpClient(128);

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl);
    await setUpActivity(
      activityId,
      [
        {
          skuId: 'phone',
          name: '华为 Mate 70 Pro 12GB+512GB 雅川青',
          price: '6499.00',
          stock: STOCK,
          limitPerUser: 1,
        },
      ],
      { databaseUrl: db.url },
    );
    for (const role of ['api', 'relay', 'consumer']) {
      roles.push(await startRole(role, { activityId, databaseUrl: db.url }));
    }
  });

  afterAll(async () => {
    await Promise.all(roles.map((r) => r.stop()));
    await http.close();
    await sql.end();
    redis.disconnect();
    await db.drop();
  });

  test('sells exactly the stock, each 202 becomes one order, every refusal has the right code', async () => {
    const api = roles[0]!;
    const url = `${api.url}/v1/activities/${activityId}/orders`;
    const buyers = Array.from({ length: BUYERS }, (_, i) => `buyer-${i}`);
    const tokens = new Map<string, string>();
    for (const b of buyers) tokens.set(b, await tokenFor(b));

    type Answer = { buyer: string; requestId: string; status: number; code?: string; reservationId?: string };
    const submit = async (buyer: string, requestId: string): Promise<Answer> => {
      const r = await http.post(url, { skuId: 'phone', quantity: 1, requestId }, tokens.get(buyer));
      return {
        buyer,
        requestId,
        status: r.status,
        code: r.json.code as string | undefined,
        reservationId: r.json.reservationId as string | undefined,
      };
    };

    const first = await pool(
      256,
      buyers.map((b) => () => submit(b, `req-${b}`)),
    );
    // Repeats: half replay the same requestId, half try again with a new one.
    const repeats = await pool(
      256,
      Array.from({ length: REPEATS }, (_, i) => {
        const b = buyers[(i * 7919) % BUYERS]!;
        return () => submit(b, i % 2 === 0 ? `req-${b}` : `again-${b}-${i}`);
      }),
    );

    const accepted = first.filter((a) => a.status === 202);
    expect(accepted).toHaveLength(STOCK);
    const refused = first.filter((a) => a.status !== 202);
    expect(new Set(refused.map((a) => `${a.status} ${a.code}`))).toEqual(new Set(['409 SOLD_OUT']));

    const winners = new Map(accepted.map((a) => [a.buyer, a.reservationId!]));
    const replayedWinners: Answer[] = [];
    for (const r of repeats) {
      if (r.requestId.startsWith('req-')) {
        if (winners.has(r.buyer)) {
          // A replay returns the original reservation as a 202 replay, also once the process-local
          // sold-out flag answers everyone else without the script.
          expect([r.status, r.reservationId]).toEqual([202, winners.get(r.buyer)]);
          replayedWinners.push(r);
        } else {
          expect([r.status, r.code]).toEqual([409, 'SOLD_OUT']);
        }
      } else {
        expect(r.status).toBe(409);
        expect(winners.has(r.buyer) ? ['LIMIT_REACHED', 'SOLD_OUT'] : ['SOLD_OUT']).toContain(r.code);
      }
    }

    // The pipeline drains: every accepted reservation becomes exactly one order.
    await waitFor(
      'all orders in PostgreSQL',
      async () => Number((await sql.query('SELECT count(*) FROM orders')).rows[0].count) === STOCK,
      120_000,
      500,
    );
    const orders = await sql.query<{
      reservation_id: string;
      user_id: string;
      item_name: string;
      amount: string;
    }>('SELECT reservation_id, user_id, item_name, amount::text FROM orders');
    expect(new Set(orders.rows.map((o) => o.reservation_id))).toEqual(new Set(winners.values()));
    const perUser = await sql.query('SELECT user_id FROM orders GROUP BY user_id HAVING count(*) > 1');
    expect(perUser.rowCount).toBe(0);
    expect(new Set(orders.rows.map((o) => o.item_name))).toEqual(
      new Set(['华为 Mate 70 Pro 12GB+512GB 雅川青']),
    );
    expect(new Set(orders.rows.map((o) => o.amount))).toEqual(new Set(['6499.00']));

    const stock = await readStock(redis, activityId);
    expect(stock.remaining).toBe(0);
    expect(stock.initial).toBe(stock.remaining + stock.reserved - stock.released);
    await waitFor('outbox drained', async () => (await readOutbox(redis, activityId)).halfMessages === 0);

    // Buyers see their order, by reservation id or by the requestId they sent.
    for (const a of accepted.slice(0, 20)) {
      const r = await http.get(`${url}/${a.reservationId}`, tokens.get(a.buyer));
      expect([r.status, r.json.status]).toEqual([200, 'UNPAID']);
    }
    for (const a of replayedWinners.slice(0, 20)) {
      const r = await http.get(`${url}?requestId=${a.requestId}`, tokens.get(a.buyer));
      expect([r.status, r.json.status, r.json.reservationId]).toEqual([200, 'UNPAID', winners.get(a.buyer)]);
    }
  }, 300_000);
});
