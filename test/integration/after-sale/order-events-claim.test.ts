// The order-event relay's claim (core/db/order-events-store.ts claimPublishableEvents) right after
// a burst, on the real PostgreSQL: the statistics still say that every event is published (the
// last ANALYZE ran before the burst), and another activity's unpublished events sit ahead of this
// activity's in id order. The claim must take the oldest event of each order of its own activity
// and read only the head of its own queue: PostgreSQL's index counters show what it read. Before
// migration 9 and the two-step claim, it walked the other activity's backlog on every claim and,
// with such statistics, the whole backlog once per candidate event.
import pg from 'pg';
import { claimPublishableEvents, markEventsPublished } from '../../../core/db/order-events-store.js';
import { inTransaction } from '../../../core/db/pool.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { waitFor } from '../../../dev/roles.js';

describe('claiming order events after a burst', () => {
  let db: FreshDatabase;
  let pool: pg.Pool;
  const mine = uniqueId('claim');
  const other = uniqueId('claim-other');
  const OTHER_BACKLOG = 20_000;

  const insertOrders = async (activityId: string, prefix: string, n: number): Promise<void> => {
    await pool.query(
      `INSERT INTO orders (reservation_id, activity_id, user_id, sku_id, slot, quantity, unit_price, amount,
                           item_name, status, trace_id, reserved_at, expires_at)
       SELECT $2 || g, $1, $2 || g, 'hot', 1, 1, 19.99, 19.99, 'x', 'UNPAID', 't', now(), now() + interval '15 minutes'
         FROM generate_series(1, $3::int) AS g`,
      [activityId, prefix, n],
    );
  };

  /** Index entries read so far from each index of order_events (flushed by the claiming backends). */
  const tuplesRead = async (): Promise<Map<string, number>> => {
    const c = await pool.connect();
    try {
      await c.query('SELECT pg_stat_clear_snapshot()');
      const r = await c.query<{ index: string; read: string }>(
        `SELECT indexrelname AS index, idx_tup_read::text AS read FROM pg_stat_user_indexes
          WHERE relname = 'order_events'`,
      );
      return new Map(r.rows.map((row) => [row.index, Number(row.read)]));
    } finally {
      c.release();
    }
  };

  beforeAll(async () => {
    db = await freshDatabase();
    pool = new pg.Pool({ connectionString: db.url, max: 3 });
    // The other activity's events, published, then analyzed: the statistics of a quiet moment.
    await insertOrders(other, 'o', OTHER_BACKLOG);
    await pool.query(`UPDATE order_events SET published_at = now()`);
    await pool.query('VACUUM ANALYZE order_events');
    // The burst: the other activity's events are pending again (its relay is down), with smaller
    // ids than this activity's, and this activity's orders arrive, some already paid (a second
    // event each), none analyzed since.
    await pool.query(`UPDATE order_events SET published_at = NULL`);
    await insertOrders(mine, 'm', 300);
    await pool.query(
      `UPDATE orders SET status = 'PAID', paid_at = now()
        WHERE activity_id = $1 AND reservation_id IN ('m1', 'm2', 'm3')`,
      [mine],
    );
  }, 120_000);

  afterAll(async () => {
    await pool?.end();
    await db?.drop();
  });

  test("takes each order's oldest event of its own activity and reads only the head of its queue", async () => {
    const before = await tuplesRead();
    const claimed = await inTransaction(pool, async (c) => {
      const events = await claimPublishableEvents(c, mine, 100);
      await c.query('SELECT pg_stat_force_next_flush()');
      return events;
    });

    const expected = await pool.query<{ id: string; order_id: string; seq: number }>(
      `SELECT e.id, e.order_id::text AS order_id, e.seq FROM order_events e
        WHERE e.activity_id = $1 AND e.seq = 1 ORDER BY e.id LIMIT 100`,
      [mine],
    );
    expect(claimed.map((e) => [e.id, e.orderId, e.seq])).toEqual(
      expected.rows.map((r) => [r.id, r.order_id, r.seq]),
    );
    expect(new Set(claimed.map((e) => e.activityId))).toEqual(new Set([mine]));
    expect(JSON.parse(claimed[0]!.payload)).toMatchObject({
      type: 'ORDER_CREATED',
      activityId: mine,
      seq: 1,
    });

    const read = await waitFor('the claim in the index counters', async () => {
      const now = await tuplesRead();
      const total = [...now].reduce((sum, [index, n]) => sum + n - (before.get(index) ?? 0), 0);
      return total > 0 ? now : undefined;
    });
    const delta = [...read].map(([index, n]) => [index, n - (before.get(index) ?? 0)] as const);
    // The head of this activity's queue (four batches) and the claimed rows by primary key: far
    // fewer entries than the other activity's backlog, which it never walks.
    const total = delta.reduce((sum, [, n]) => sum + n, 0);
    expect(total).toBeLessThanOrEqual(2_000);
    expect(Object.fromEntries(delta)['order_events_unpublished'] ?? 0).toBe(0);
  });

  test('a paid order waits for its created event; an event published by another relay is not claimed again', async () => {
    // Publish the first batch as a relay would; the next claim goes on from there.
    const first = await inTransaction(pool, (c) => claimPublishableEvents(c, mine, 300));
    expect(first.every((e) => e.seq === 1)).toBe(true);
    await inTransaction(pool, (c) =>
      markEventsPublished(
        c,
        first.slice(0, 3).map((e) => e.id),
      ),
    );
    // The three paid orders' created events are published: their PAID events (seq 2) are next.
    const next = await inTransaction(pool, (c) => claimPublishableEvents(c, mine, 1_000));
    const claimedIds = new Set(next.map((e) => e.id));
    for (const e of first.slice(0, 3)) expect(claimedIds.has(e.id)).toBe(false);
    expect(next.filter((e) => e.seq === 2)).toHaveLength(3);
    expect(next).toHaveLength(300);
  });
});
