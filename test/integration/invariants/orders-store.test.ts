// The consumer's insert (core/db/orders-store.ts insertOrders) on the real PostgreSQL: the unique
// keys are the truth (reservation id; the live buyer slot), and the amount is rebuilt in SQL from
// the activity's unit price and the quantity, never taken from a message. Named by mutants in
// test/faults/mutants/.
import pg from 'pg';
import { insertOrders, ORDER_TRANSITIONS, transitionOrder } from '../../../core/db/orders-store.js';
import type { OrderStatus, OrderTransition } from '../../../core/db/orders-store.js';
import type { OrderMessage } from '../../../core/model.js';
import { orderMessage } from '../../fixtures/order-message.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

const TIMEOUT_MS = 60_000;

describe('orders-store insertOrders (real PostgreSQL)', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
  }, TIMEOUT_MS);
  afterAll(async () => {
    await sql.end();
    await db.drop();
  }, TIMEOUT_MS);

  const message = (activityId: string, rid: string, o: Partial<OrderMessage> = {}): OrderMessage =>
    orderMessage(activityId, 'u', {
      reservationId: rid,
      skuId: 's',
      unitPrice: '19.90',
      itemName: '五常大米',
      reservedAt: 1_700_000_000_000,
      traceId: 't',
      requestId: rid,
      ...o,
    });

  test(
    'the payment deadline is the reservation plus the timeout, and at least half the timeout after an order written late',
    async () => {
      const a = uniqueId('os-late');
      const now = Date.now();
      await insertOrders(
        sql,
        [
          message(a, `${a}-on-time`, { userId: 'u1', reservedAt: now - 1_000 }),
          // Written an hour after its reservation (a consumer outage, a replayed dead letter).
          message(a, `${a}-late`, { userId: 'u2', reservedAt: now - 3_600_000 }),
        ],
        900,
      );
      const rows = await sql.query<{ reservation_id: string; reserved: number; expires: number }>(
        `SELECT reservation_id, extract(epoch FROM reserved_at) * 1000 AS reserved,
                extract(epoch FROM expires_at) * 1000 AS expires
           FROM orders WHERE activity_id = $1 ORDER BY reservation_id`,
        [a],
      );
      const [late, onTime] = rows.rows.map((r) => ({
        ...r,
        reserved: Number(r.reserved),
        expires: Number(r.expires),
      }));
      expect(onTime!.expires - onTime!.reserved).toBe(900_000);
      expect(late!.expires).toBeGreaterThanOrEqual(now + 450_000 - 5_000);
      expect(late!.expires).toBeLessThanOrEqual(Date.now() + 450_000 + 5_000);
    },
    TIMEOUT_MS,
  );

  test(
    'the amount is unit price x quantity, computed in SQL, for one and for several units',
    async () => {
      const a = uniqueId('os');
      const out = await insertOrders(
        sql,
        [
          message(a, `${a}-1`, { quantity: 1, userId: 'u1' }),
          message(a, `${a}-2`, { quantity: 2, userId: 'u2' }),
          message(a, `${a}-3`, { quantity: 3, userId: 'u3', unitPrice: '0.35' }),
        ],
        900,
      );
      expect(out.inserted.size).toBe(3);
      const rows = await sql.query<{ reservation_id: string; amount: string; quantity: number }>(
        'SELECT reservation_id, amount::text, quantity FROM orders WHERE activity_id = $1 ORDER BY reservation_id',
        [a],
      );
      expect(rows.rows.map((r) => [r.quantity, r.amount])).toEqual([
        [1, '19.90'],
        [2, '39.80'],
        [3, '1.05'],
      ]);
    },
    TIMEOUT_MS,
  );

  test(
    'the unique keys decide: a redelivery inserts nothing, a second live order on a buyer slot is refused, a closed order frees it',
    async () => {
      const a = uniqueId('os');
      const first = await insertOrders(sql, [message(a, `${a}-1`)], 900);
      expect([...first.inserted.keys()]).toEqual([`${a}-1`]);
      const again = await insertOrders(sql, [message(a, `${a}-1`)], 900);
      expect([again.inserted.size, [...again.existing.keys()], again.rejected]).toEqual([0, [`${a}-1`], []]);
      // Another reservation on the same buyer slot while the first order is live: refused.
      const dup = await insertOrders(sql, [message(a, `${a}-2`)], 900);
      expect([dup.inserted.size, dup.existing.size, dup.rejected]).toEqual([0, 0, [`${a}-2`]]);
      // Slot 2 of the same buyer, and slot 1 of another buyer, are separate keys.
      const other = await insertOrders(
        sql,
        [message(a, `${a}-3`, { slot: 2 }), message(a, `${a}-4`, { userId: 'v' })],
        900,
      );
      expect(other.inserted.size).toBe(2);
      // Once the first order is CLOSED its slot is free again (the released unit may be bought again).
      const closed = await transitionOrder(sql, first.inserted.get(`${a}-1`)!, 'CLOSE', 'TEST');
      expect(closed.applied).toBe(true);
      const reuse = await insertOrders(sql, [message(a, `${a}-5`)], 900);
      expect([...reuse.inserted.keys()]).toEqual([`${a}-5`]);
      const n = await sql.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM orders WHERE activity_id = $1 AND status <> 'CLOSED'`,
        [a],
      );
      expect(n.rows[0]!.n).toBe(3);
    },
    TIMEOUT_MS,
  );

  test(
    'an order changes status only from the status its transition expects; any other status is reported, never overwritten',
    async () => {
      const a = uniqueId('os');
      const statuses: OrderStatus[] = ['UNPAID', 'PAID', 'CLOSED', 'REFUNDING', 'REFUNDED'];
      // One order per (transition, status found), put into that status directly.
      const cases = (Object.keys(ORDER_TRANSITIONS) as OrderTransition[]).flatMap((t) =>
        statuses.map((found) => ({ t, found, rid: `${a}-${t}-${found}` })),
      );
      const out = await insertOrders(
        sql,
        cases.map((c, i) => message(a, c.rid, { userId: `u${i}` })),
        900,
      );
      for (const c of cases) {
        await sql.query('UPDATE orders SET status = $2 WHERE reservation_id = $1', [c.rid, c.found]);
      }
      for (const c of cases) {
        const r = await transitionOrder(sql, out.inserted.get(c.rid)!, c.t, 'TEST');
        const expected = ORDER_TRANSITIONS[c.t];
        const now = await sql.query<{ status: string }>(
          'SELECT status FROM orders WHERE reservation_id = $1',
          [c.rid],
        );
        if (c.found === expected.from) {
          expect([c.t, c.found, r.applied, now.rows[0]!.status]).toEqual([c.t, c.found, true, expected.to]);
        } else {
          expect([c.t, c.found, r.applied, r.applied ? undefined : r.current, now.rows[0]!.status]).toEqual([
            c.t,
            c.found,
            false,
            c.found,
            c.found,
          ]);
        }
      }
    },
    TIMEOUT_MS,
  );
});
