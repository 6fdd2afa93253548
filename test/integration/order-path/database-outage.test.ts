// A buyer's poll while PostgreSQL ends the api's connection (a restart, a failover, an operator's
// pg_terminate_backend): the query in flight fails with 57P01 "terminating connection due to
// administrator command". That is a dependency outage a retry gets past, like a Redis that does
// not answer: 503 UNAVAILABLE with Retry-After (core/errors.ts dependencyOutage), not a
// 500 INTERNAL; the next poll is answered as before. The query is held in flight by a lock the
// test takes on the orders table, so the termination meets it mid-query.
import pg from 'pg';
import { request } from 'undici';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { setUpActivity, startRole, tokenFor, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

const TIMEOUT_MS = 120_000;

describe('the api while PostgreSQL ends its connections', () => {
  const activityId = uniqueId('pgout');
  let db: FreshDatabase;
  let admin: pg.Client;
  let api: RoleProcess | undefined;

  beforeAll(async () => {
    db = await freshDatabase();
    admin = new pg.Client({ connectionString: db.url });
    await admin.connect();
    await setUpActivity(
      activityId,
      [{ skuId: 'tea', name: '西湖龙井 明前特级 250g', price: '388.80', stock: 10, limitPerUser: 1 }],
      { databaseUrl: db.url },
    );
    api = await startRole('api', { activityId, databaseUrl: db.url });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.stop();
    await admin?.end();
    await db?.drop();
  }, TIMEOUT_MS);

  const poll = async (token: string, reservationId: string) => {
    const r = await request(`${api!.url}/v1/activities/${activityId}/orders/${reservationId}`, {
      headers: { authorization: `Bearer ${token}` },
    });
    return {
      status: r.statusCode,
      retryAfter: r.headers['retry-after'],
      json: (await r.body.json()) as Record<string, unknown>,
    };
  };

  test(
    'a poll whose query PostgreSQL terminates is 503 UNAVAILABLE with Retry-After; the next is answered',
    async () => {
      const token = await tokenFor('ann');
      const submitted = await request(`${api!.url}/v1/activities/${activityId}/orders`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ skuId: 'tea', quantity: 1, requestId: 'r1' }),
      });
      expect(submitted.statusCode).toBe(202);
      const { reservationId } = (await submitted.body.json()) as { reservationId: string };
      // No consumer runs: PostgreSQL has no order, the reservation is QUEUED in Redis.
      expect(await poll(token, reservationId)).toMatchObject({ status: 200, json: { status: 'QUEUED' } });

      await admin.query('BEGIN');
      let answer: Awaited<ReturnType<typeof poll>>;
      try {
        await admin.query('LOCK TABLE orders IN ACCESS EXCLUSIVE MODE');
        const pending = poll(token, reservationId);
        // The api's order lookup, waiting on the lock: end its connection mid-query.
        const waiting = await waitFor(
          "the api's order lookup waiting on the lock",
          async () => {
            const r = await admin.query<{ pid: number }>(
              `SELECT pid FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'`,
            );
            return r.rows[0]?.pid;
          },
          20_000,
          50,
        );
        await admin.query('SELECT pg_terminate_backend($1)', [waiting]);
        answer = await pending;
      } finally {
        await admin.query('ROLLBACK');
      }
      expect(answer.status).toBe(503);
      expect(answer.json).toMatchObject({ code: 'UNAVAILABLE', status: 503 });
      expect(answer.retryAfter).toBe('1');

      // The pool drops the ended connection: the buyer's next poll is answered.
      expect(await poll(token, reservationId)).toMatchObject({ status: 200, json: { status: 'QUEUED' } });
    },
    TIMEOUT_MS,
  );
});
