// The api's process-local sold-out flag (runtime/api/sold-out.ts) answers SOLD_OUT without the
// script only for a SKU with nothing left: a buyer who asks for more units than are left is
// refused, and the units left are still sold to the next buyers. Real api process and Redis.
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { httpClient, setUpActivity, startRole, tokenFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

describe('sold-out flag', () => {
  let db: FreshDatabase;
  let api: RoleProcess;
  const activityId = uniqueId('flag');
  const http = httpClient(8);

  beforeAll(async () => {
    db = await freshDatabase();
    await setUpActivity(
      activityId,
      [
        { skuId: 'pair', name: 'pair', price: '10.00', stock: 2, limitPerUser: 3 },
        // Two buckets of one unit each: a SOLD_OUT there comes from reserve() after the refill.
        { skuId: 'hot', name: 'hot', price: '10.00', stock: 2, limitPerUser: 3, buckets: 2 },
      ],
      { databaseUrl: db.url },
    );
    // A flag that would outlast the whole test if it were set.
    api = await startRole('api', { activityId, databaseUrl: db.url, env: { SOLD_OUT_RECHECK_MS: '600000' } });
  });

  afterAll(async () => {
    await api?.stop();
    await http.close();
    await db?.drop();
  });

  const submit = async (buyer: string, skuId: string, quantity: number) => {
    const r = await http.post(
      `${api.url}/v1/activities/${activityId}/orders`,
      { skuId, quantity, requestId: `${buyer}-${skuId}-${quantity}` },
      await tokenFor(buyer),
    );
    return [r.status, r.json.code ?? r.json.status];
  };

  test.each(['pair', 'hot'])(
    '%s: asking for more than is left does not turn the next buyers away; selling the last unit does',
    async (sku) => {
      expect(await submit(`greedy-${sku}`, sku, 3)).toEqual([409, 'SOLD_OUT']);
      expect(await submit(`greedy-${sku}`, sku, 3)).toEqual([409, 'SOLD_OUT']);
      expect(await submit(`first-${sku}`, sku, 1)).toEqual([202, 'QUEUED']);
      expect(await submit(`second-${sku}`, sku, 1)).toEqual([202, 'QUEUED']);
      expect(await submit(`third-${sku}`, sku, 1)).toEqual([409, 'SOLD_OUT']);
      // Now the flag answers: a replay of a reservation still gets it back.
      expect(await submit(`third-${sku}`, sku, 1)).toEqual([409, 'SOLD_OUT']);
      expect(await submit(`first-${sku}`, sku, 1)).toEqual([202, 'QUEUED']);
    },
  );
});
