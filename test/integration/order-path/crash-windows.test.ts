// Failure windows 1-5 of docs/faults.md at this level: a role is killed with SIGKILL at a precise
// line (FLASHSALE_CRASH_POINT) while orders flow, restarted, and every reservation still becomes
// exactly one order.
import { Redis } from 'ioredis';
import pg from 'pg';
import { readOutbox, readStock } from '../../../core/activity-cache.js';
import type { CrashPoint } from '../../../core/crash.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { httpClient, pool, setUpActivity, startRole, tokenFor, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

const BUYERS = 40;

const windows: { window: number; role: 'api' | 'relay' | 'consumer'; point: CrashPoint; what: string }[] = [
  {
    window: 1,
    role: 'api',
    point: 'api-after-reserve',
    what: 'api dies after the Lua script, before answering',
  },
  {
    window: 2,
    role: 'relay',
    point: 'relay-after-kafka-ack',
    what: 'relay dies after Kafka acked, before trimming',
  },
  {
    window: 3,
    role: 'consumer',
    point: 'consumer-after-db-commit',
    what: 'consumer dies after the DB commit, before the offset commit',
  },
  {
    window: 4,
    role: 'consumer',
    point: 'consumer-before-db-commit',
    what: 'consumer dies before the DB commit',
  },
  {
    window: 5,
    role: 'consumer',
    point: 'consumer-before-results',
    what: 'result update lost after the DB commit',
  },
];

describe('crash windows on the order path', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let redis: Redis;
  const http = httpClient(16);
  const running: RoleProcess[] = [];

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl);
  });

  afterAll(async () => {
    await Promise.all(running.map((r) => r.stop()));
    await http.close();
    await sql.end();
    redis.disconnect();
    await db.drop();
  });

  test.each(windows)('window $window: $what', async ({ role, point }) => {
    const activityId = uniqueId(`w-${role}`);
    await setUpActivity(
      activityId,
      [{ skuId: 'rice', name: '五常大米 稻花香 5kg', price: '89.90', stock: 100, limitPerUser: 1 }],
      { databaseUrl: db.url },
    );
    const crashEnv = { FLASHSALE_CRASH_POINT: point, FLASHSALE_CRASH_AFTER: '2' };
    // A stable relay name: a restarted relay picks up its own pending entries at once.
    const common = { activityId, databaseUrl: db.url };
    const procs: Record<string, RoleProcess> = {};
    for (const r of ['api', 'relay', 'consumer'] as const) {
      procs[r] = await startRole(r, {
        ...common,
        env: {
          RELAY_CONSUMER_NAME: 'relay-0',
          CONSUMER_BATCH_SIZE: '5',
          RELAY_BATCH_SIZE: '5',
          ...(r === role ? crashEnv : {}),
        },
      });
      running.push(procs[r]!);
    }

    const buyers = Array.from({ length: BUYERS }, (_, i) => `${activityId}-b${i}`);
    const tokens = new Map<string, string>();
    for (const b of buyers) tokens.set(b, await tokenFor(b));
    const submitAll = async (
      api: RoleProcess,
    ): Promise<{ buyer: string; status: number; reservationId?: string }[]> =>
      pool(
        4,
        buyers.map((b) => async () => {
          try {
            const r = await http.post(
              `${api.url}/v1/activities/${activityId}/orders`,
              { skuId: 'rice', quantity: 1, requestId: `req-${b}` },
              tokens.get(b),
            );
            return { buyer: b, status: r.status, reservationId: r.json.reservationId as string | undefined };
          } catch {
            return { buyer: b, status: 0 }; // the connection died with the process
          }
        }),
      );

    let answers = await submitAll(procs.api!);
    const victim = procs[role]!;
    await waitFor(`${role} to die at ${point}`, async () => victim.proc.signalCode === 'SIGKILL', 60_000);
    const restarted = await startRole(role, { ...common, env: { RELAY_CONSUMER_NAME: 'relay-0' } });
    running.push(restarted);
    if (role === 'api') {
      // Buyers retry with the same requestId: the reservation made before the crash is replayed.
      const retried = await submitAll(restarted);
      expect(retried.every((a) => a.status === 202)).toBe(true);
      answers = retried;
    }

    const accepted = answers.filter((a) => a.status === 202);
    expect(accepted).toHaveLength(BUYERS);
    const stock = await readStock(redis, activityId);
    expect(stock.reservations).toBe(BUYERS);
    expect(stock.remaining).toBe(100 - BUYERS);

    await waitFor(
      'every reservation is an order',
      async () => {
        const n = await sql.query('SELECT count(*)::int AS n FROM orders WHERE activity_id = $1', [
          activityId,
        ]);
        return n.rows[0].n === BUYERS;
      },
      90_000,
      300,
    );
    const rows = await sql.query<{ reservation_id: string }>(
      'SELECT reservation_id FROM orders WHERE activity_id = $1',
      [activityId],
    );
    expect(new Set(rows.rows.map((r) => r.reservation_id))).toEqual(
      new Set(accepted.map((a) => a.reservationId)),
    );
    // Exactly one creation event per order: none duplicated by a redelivery, and none lost to the
    // crash (the journal row commits with its order, so zero is as wrong as two).
    const events = await sql.query<{ reservation_id: string; n: number }>(
      `SELECT o.reservation_id, count(j.id)::int AS n FROM orders o
         LEFT JOIN order_journal j ON j.reservation_id = o.reservation_id AND j.event = 'ORDER_CREATED'
        WHERE o.activity_id = $1 GROUP BY o.reservation_id HAVING count(j.id) <> 1`,
      [activityId],
    );
    expect(events.rows).toEqual([]);
    const stray = await sql.query(
      `SELECT j.reservation_id FROM order_journal j LEFT JOIN orders o ON o.reservation_id = j.reservation_id
        WHERE j.activity_id = $1 AND j.event = 'ORDER_CREATED' AND o.id IS NULL`,
      [activityId],
    );
    expect(stray.rows).toEqual([]);
    await waitFor(
      'outbox drained',
      async () => (await readOutbox(redis, activityId)).halfMessages === 0,
      60_000,
    );

    // Every buyer sees the order (window 5: from PostgreSQL when the Redis result was lost).
    for (const a of accepted.slice(0, 10)) {
      const r = await http.get(
        `${restarted.role === 'api' ? restarted.url : procs.api!.url}/v1/activities/${activityId}/orders/${a.reservationId}`,
        tokens.get(a.buyer),
      );
      expect(r.json.status).toBe('UNPAID');
    }
    for (const p of [...Object.values(procs), restarted]) await p.stop();
  });
});
