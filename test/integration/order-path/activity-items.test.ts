// activity_items (core/db/activity-items-store.ts): what the consumer checks orders against. The
// newest generation wins whatever order the writes come in; `replace` mirrors the cache exactly.
import pg from 'pg';
import { readActivityItems, recordActivityItems } from '../../../core/db/activity-items-store.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

describe('activity items', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
  });

  afterAll(async () => {
    await sql.end();
    await db.drop();
  });

  const item = (skuId: string, price: string, limitPerUser = 1) => ({
    skuId,
    name: `名 ${skuId}`,
    price,
    limitPerUser,
  });
  const view = async (id: string) =>
    [...(await readActivityItems(sql, id)).values()]
      .map((i) => `${i.skuId} ${i.price} ${i.limitPerUser} g${i.generation}`)
      .sort();

  test('a repeat changes nothing; an older generation never rolls a newer one back', async () => {
    const id = uniqueId('items');
    await recordActivityItems(sql, id, 2, [item('a', '10'), item('b', '2.5', 3)]);
    await recordActivityItems(sql, id, 2, [item('a', '10'), item('b', '2.5', 3)]);
    await recordActivityItems(sql, id, 1, [item('a', '99.99')]);
    expect(await view(id)).toEqual(['a 10.00 1 g2', 'b 2.50 3 g2']);
    await recordActivityItems(sql, id, 3, [item('a', '11'), item('b', '2.5', 3), item('c', '0.01')]);
    expect(await view(id)).toEqual(['a 11.00 1 g3', 'b 2.50 3 g3', 'c 0.01 1 g3']);
    expect((await readActivityItems(sql, id)).get('a')?.name).toBe('名 a');
    expect(await view(uniqueId('none'))).toEqual([]);
  });

  test('replace mirrors what the cache holds after it refused a generation recorded first', async () => {
    const id = uniqueId('items');
    await recordActivityItems(sql, id, 1, [item('a', '10')]);
    await recordActivityItems(sql, id, 2, [item('a', '12'), item('new', '5')]);
    await recordActivityItems(sql, id, 1, [item('a', '10')], { replace: true });
    expect(await view(id)).toEqual(['a 10.00 1 g1']);
  });
});
