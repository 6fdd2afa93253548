// A role's /readyz reports what it can do: the consumer answers 200 only as a member of its Kafka
// consumer group (while it joins: 503 with `"consumer": "joining"`), with the state of each part in
// `checks` (runtime/roles/process.ts).
import { request } from 'undici';
import { startRole, setUpActivity } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

async function readyz(p: RoleProcess): Promise<{ status: number; body: Record<string, unknown> }> {
  const r = await request(`${p.url}/readyz`);
  return { status: r.statusCode, body: (await r.body.json()) as Record<string, unknown> };
}

describe('/readyz of the runtime roles', () => {
  let db: FreshDatabase;
  const running: RoleProcess[] = [];

  beforeAll(async () => {
    db = await freshDatabase();
  });

  afterAll(async () => {
    await Promise.all(running.map((p) => p.stop()));
    await db?.drop();
  });

  it('the consumer is ready as a group member, with every part reported', async () => {
    const a = await setUpActivity(uniqueId('ready'), [
      { skuId: 's1', name: '测试', price: '1.00', stock: 1, limitPerUser: 1 },
    ]);
    const consumer = await startRole('consumer', { activityId: a.id, databaseUrl: db.url });
    running.push(consumer);
    expect(await readyz(consumer)).toEqual({
      status: 200,
      body: { status: 'ready', checks: { redis: 'ok', postgres: 'ok', consumer: 'consuming' } },
    });
  });
});
