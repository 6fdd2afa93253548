// The demo's summary: the sale's figures and the checks of docs/demo.md, each a query against
// PostgreSQL and Redis (and what the payment provider's stand-in saw).
import type { Redis } from 'ioredis';
import { countOrders } from '../../core/db/orders-store.js';
import type { Pool } from '../../core/db/pool.js';
import { readStockRows, readWriteBack } from '../../core/db/stock-store.js';
import { activityKeys } from '../../core/keys.js';
import type { FlashSaleActivity, ItemSpec } from '../../operator/api/v1alpha1/types.js';
import type { FakeProvider } from '../../dev/fake-provider.js';
import { scanKeys } from '../../dev/operator-harness.js';
import type { Tally } from './buyers.js';
import { secondsSinceStart } from './display.js';
import type { PaymentTally } from './payments.js';

interface Check {
  name: string;
  ok: boolean;
  detail: string;
}

export interface Outcome {
  fsa: FlashSaleActivity | undefined;
  activityId: string;
  items: ItemSpec[];
  tally: Tally;
  payments: PaymentTally;
  /** What the payment provider's refund endpoint saw. */
  provider: FakeProvider;
  /** One line per process: where it served /metrics. */
  metrics: string[];
}

/** Prints the summary and its checks; true when every check passed. */
export async function summary(redis: Redis, pg: Pool, o: Outcome): Promise<boolean> {
  const { fsa, activityId, items, tally, payments, provider, metrics } = o;
  const k = activityKeys(activityId);
  const [orders, rows, wb, keys, perSku, overLimit, slots, missing] = await Promise.all([
    countOrders(pg, activityId),
    readStockRows(pg, activityId),
    readWriteBack(pg, activityId),
    scanKeys(redis, k.scanPattern),
    pg.query<{ sku: string; q: string }>(
      `SELECT sku_id AS sku, coalesce(sum(quantity), 0)::text AS q FROM orders
        WHERE activity_id = $1 AND status <> 'CLOSED' GROUP BY sku_id`,
      [activityId],
    ),
    pg.query<{ n: string }>(
      `SELECT count(*)::text AS n FROM (
         SELECT o.user_id, o.sku_id, sum(o.quantity) AS q, max(l.lim) AS lim
           FROM orders o JOIN unnest($2::text[], $3::int[]) AS l(sku, lim) ON l.sku = o.sku_id
          WHERE o.activity_id = $1 AND o.status <> 'CLOSED' GROUP BY o.user_id, o.sku_id) t
        WHERE q > lim`,
      [activityId, items.map((i) => i.skuId), items.map((i) => i.limitPerUser ?? 1)],
    ),
    pg.query<{ n: string }>(
      `SELECT count(*)::text AS n FROM (SELECT 1 FROM orders WHERE activity_id = $1 AND status <> 'CLOSED'
        GROUP BY user_id, sku_id, slot HAVING count(*) > 1) t`,
      [activityId],
    ),
    pg.query<{ n: string }>(
      `SELECT count(*)::text AS n FROM unnest($2::text[]) AS r(id)
        WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.activity_id = $1 AND o.reservation_id = r.id)`,
      [activityId, [...tally.accepted.keys()]],
    ),
  ]);
  const resultsTtl = keys.includes(k.results) ? await redis.ttl(k.results) : -2;
  const resultsKept = keys.includes(k.results) ? await redis.hlen(k.results) : 0;
  const sold = new Map(perSku.rows.map((r) => [r.sku, Number(r.q)]));
  const initial = rows.reduce((n, r) => n + r.initial, 0);
  const remaining = rows.reduce((n, r) => n + r.remaining, 0);
  const phase = fsa?.status?.phase;
  const settlement = fsa?.status?.settlement;
  const [payRows, returned] = await Promise.all([
    pg.query<{ state: string; n: string }>(
      `SELECT state, count(*)::text AS n FROM payments WHERE activity_id = $1 GROUP BY state`,
      [activityId],
    ),
    pg.query<{ via: string; q: string }>(
      `SELECT stock_return_via AS via, coalesce(sum(quantity), 0)::text AS q FROM orders
        WHERE activity_id = $1 AND status = 'CLOSED' AND stock_return_via IS NOT NULL GROUP BY 1`,
      [activityId],
    ),
  ]);
  const payState = new Map(payRows.rows.map((r) => [r.state, Number(r.n)]));
  const returnedVia = new Map(returned.rows.map((r) => [r.via, Number(r.q)]));
  const checks: Check[] = [
    {
      name: 'lifecycle settled',
      // Completed needs every payment applied or refunded: the duplicate trade's money went back
      // through the provider (the refund worker of the after-sale role, docs/after-sale.md).
      ok: phase === 'Completed',
      detail:
        `phase ${phase ?? 'none'}` +
        (settlement
          ? `, unsettled ${settlement.unsettled ?? 0} (refund pending ${settlement.refundPending ?? 0})`
          : '') +
        (fsa?.status?.drain?.timedOut ? ` (${fsa.status.drain.leftover ?? 'drain timed out'})` : ''),
    },
    {
      name: 'orders settled',
      ok: orders.byStatus.UNPAID === 0 && (settlement?.closedUnsettled ?? 0) === 0,
      detail:
        `UNPAID ${orders.byStatus.UNPAID}, PAID ${orders.byStatus.PAID}, CLOSED ${orders.byStatus.CLOSED} ` +
        `(units returned: ${returnedVia.get('redis') ?? 0} to Redis during the sale, ${returnedVia.get('postgres') ?? 0} to PostgreSQL after it)`,
    },
    {
      name: 'payments decided',
      ok:
        payments.duplicate?.outcome === 'REFUND_PENDING' &&
        (payments.late?.outcome === 'PAID' || payments.late?.outcome === 'REFUND_PENDING') &&
        (payState.get('APPLIED') ?? 0) === orders.byStatus.PAID,
      detail:
        `${payments.paidNotified + (payments.late ? 1 : 0)} paid, ${payState.get('APPLIED') ?? 0} applied; ` +
        `duplicate trade → ${payments.duplicate?.outcome ?? 'not sent'}; ` +
        `late notification of an in-time payment → ${payments.late?.outcome ?? 'not sent'}` +
        (payments.late?.outcome === 'PAID' ? ' (unit taken back from PostgreSQL)' : ''),
    },
    {
      name: 'refunds once',
      // Every payment that could not be kept went back through the provider, exactly once each.
      ok:
        (payState.get('REFUNDED') ?? 0) > 0 &&
        (payState.get('REFUND_PENDING') ?? 0) + (payState.get('REFUNDING') ?? 0) === 0 &&
        provider.executed.size === payState.get('REFUNDED'),
      detail:
        `${payState.get('REFUNDED') ?? 0} payment(s) refunded, ` +
        `${provider.executed.size ?? 0} refund(s) executed by the provider ` +
        `(${[...provider.calls.values()].reduce((n, c) => n + c, 0)} call(s))`,
    },
    {
      name: 'stock written back',
      // remaining grows after the write-back by the units of orders closed unpaid (returned to
      // PostgreSQL) and shrinks by late in-time payments (taken back).
      ok: wb !== undefined && rows.length === items.length && wb.initialTotal === initial,
      detail: wb
        ? `activity_writebacks remaining ${wb.remainingTotal}, orders ${wb.ordersTotal}; activity_stock now ` +
          rows.map((r) => `${r.skuId} ${r.remaining}/${r.initial}`).join(', ')
        : 'no activity_writebacks row',
    },
    {
      name: 'no oversell',
      ok: rows.every((r) => (sold.get(r.skuId) ?? 0) <= r.initial && r.remaining >= 0),
      detail: rows.map((r) => `${r.skuId} ordered ${sold.get(r.skuId) ?? 0} <= ${r.initial}`).join(', '),
    },
    {
      name: 'stock conserved',
      ok: rows.every((r) => (sold.get(r.skuId) ?? 0) + r.remaining === r.initial),
      detail: `ordered ${orders.quantity} + remaining ${remaining} = initial ${initial}`,
    },
    {
      name: 'no duplicate',
      ok:
        Number(overLimit.rows[0]?.n) === 0 &&
        Number(slots.rows[0]?.n) === 0 &&
        tally.doubleClickMismatch === 0,
      detail:
        `buyers over their limit ${overLimit.rows[0]?.n}, duplicate buyer slots ${slots.rows[0]?.n}, ` +
        `double clicks answered with a new reservation ${tally.doubleClickMismatch}`,
    },
    {
      name: 'no lost order',
      ok: Number(missing.rows[0]?.n) === 0 && orders.orders === tally.accepted.size,
      detail:
        `${tally.accepted.size} reservations accepted (202), ${orders.orders} orders in PostgreSQL, ` +
        `${missing.rows[0]?.n} accepted without an order`,
    },
    {
      name: 'keys cleaned',
      ok: keys.length === (resultsKept > 0 ? 1 : 0) && (resultsKept === 0 || resultsTtl > 0),
      detail:
        `${keys.length} key(s) left under ${k.scanPattern}` +
        (resultsKept > 0 ? `: ${k.results} (${resultsKept} results, TTL ${resultsTtl}s)` : ''),
    },
  ];
  const lines = [
    '',
    `Summary of activity ${activityId}`,
    `  sold             ${orders.quantity} of ${initial} units (${remaining} left in PostgreSQL, returned units included)`,
    `  orders           ${orders.orders} in PostgreSQL (${Object.entries(orders.byStatus)
      .filter(([, n]) => n > 0)
      .map(([s, n]) => `${s} ${n}`)
      .join(', ')})`,
    `  buyers           ${tally.sent} requests: ${[...tally.total.entries()].map(([l, n]) => `${l} ${n}`).join(', ')}`,
    `  payments         paid ${orders.byStatus.PAID}, closed unpaid ${orders.byStatus.CLOSED}, ` +
      // Money owed back: waiting for the refund worker, or with its refund in flight at the provider.
      `refund pending ${(payState.get('REFUND_PENDING') ?? 0) + (payState.get('REFUNDING') ?? 0)}, ` +
      `refunded ${payState.get('REFUNDED') ?? 0} ` +
      `(notifications: ${[...payments.outcomes.entries()].map(([o, n]) => `${o} ${n}`).join(', ') || '-'})`,
    `  metrics          ${metrics.join('\n                   ')}`,
    '  checks (queries against PostgreSQL and Redis):',
    ...checks.map((c) => `    ${c.ok ? 'ok  ' : 'FAIL'}  ${c.name.padEnd(20)} ${c.detail}`),
  ];
  const ok = checks.every((c) => c.ok);
  lines.push('', `DEMO ${ok ? 'PASSED' : 'FAILED'} in ${secondsSinceStart().toFixed(1)}s`);
  process.stdout.write(`${lines.join('\n')}\n`);
  return ok;
}
