// A bucketed SKU added to a live sale by a later load (a spec edit adding an item): the relay and
// the consumer run as their own processes and remembered the layout of the first load. Every
// reservation of the new SKU still becomes one order, and each is confirmed in the ledger of the
// bucket it lives in (core/buckets.ts bucketLayout re-reads the layout when the meta's `gen`
// moved), so nothing is left looking unconfirmed for the drain and the gap job.
import { Redis } from 'ioredis';
import pg from 'pg';
import { countUnconfirmed, loadActivity, readOutbox } from '../../../core/activity-cache.js';
import { recordActivityItems } from '../../../core/db/activity-items-store.js';
import { reserve } from '../../../core/reservations.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { setUpActivity, startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess, TestActivity } from '../../../dev/roles.js';

describe('a bucketed SKU added to a live sale', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let redis: Redis;
  let activity: TestActivity;
  const roles: RoleProcess[] = [];
  const activityId = uniqueId('addbkt');

  const orders = async (): Promise<number> =>
    Number(
      (await sql.query('SELECT count(*) FROM orders WHERE activity_id = $1', [activityId])).rows[0].count,
    );
  const buy = (userId: string, skuId: string) =>
    reserve(redis, {
      activityId,
      userId,
      skuId,
      quantity: 1,
      requestId: `r-${userId}`,
      traceId: `t-${userId}`,
    });

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl);
    activity = await setUpActivity(
      activityId,
      [{ skuId: 'tea', name: 'tea', price: '9.00', stock: 5, limitPerUser: 1 }],
      { databaseUrl: db.url },
    );
    for (const role of ['relay', 'consumer'])
      roles.push(await startRole(role, { activityId, databaseUrl: db.url }));
  });

  afterAll(async () => {
    await Promise.all(roles.map((r) => r.stop()));
    await sql?.end();
    redis?.disconnect();
    await db?.drop();
  });

  test('its reservations become orders and are confirmed in their buckets', async () => {
    // The consumer (and its jobs) learn the first layout: one plain SKU.
    await buy('u0', 'tea');
    await waitFor('the first order', async () => (await orders()) === 1, 60_000);

    // Generation 2 adds a SKU in 4 buckets, PostgreSQL first as the operator does.
    const items = [
      ...activity.definition.items,
      { skuId: 'hot', name: 'hot', price: '19.00', stock: 8, limitPerUser: 1, buckets: 4 },
    ];
    await recordActivityItems(sql, activityId, 2, items);
    await loadActivity(redis, { ...activity.definition, generation: 2, items });

    for (let i = 1; i <= 6; i += 1) await buy(`u${i}`, 'hot');
    await waitFor('every order in PostgreSQL', async () => (await orders()) === 7, 60_000);
    await waitFor(
      'every reservation confirmed in its ledger',
      async () => (await countUnconfirmed(redis, activityId, Date.now() + 1)) === 0,
      30_000,
    );
    expect((await readOutbox(redis, activityId)).halfMessages).toBe(0);
  });
});
