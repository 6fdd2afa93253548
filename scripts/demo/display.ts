// What the demo prints: log lines, and the progress block (redrawn in place on a terminal, one
// plain line per update otherwise or with DEMO_PLAIN=1). Every figure is read from the API
// server, Redis or PostgreSQL.
import type { Redis } from 'ioredis';
import { countUnconfirmed, readOutbox, readStock } from '../../core/activity-cache.js';
import { countOrders } from '../../core/db/orders-store.js';
import type { Pool } from '../../core/db/pool.js';
import { getActivity } from '../../dev/operator-harness.js';
import type { Admin } from '../../dev/operator-harness.js';
import type { Tally } from './buyers.js';

const TTY = process.stdout.isTTY === true && process.env.DEMO_PLAIN !== '1';
const t0 = Date.now();
let drawnLines = 0;

/** Seconds since the demo started. */
export const secondsSinceStart = (): number => (Date.now() - t0) / 1000;
const elapsed = (): string => `${secondsSinceStart().toFixed(1).padStart(5)}s`;

export function say(line: string): void {
  clearLive();
  process.stdout.write(`[demo ${elapsed()}] ${line}\n`);
}

export function clearLive(): void {
  if (TTY && drawnLines > 0) {
    process.stdout.write(`\x1b[${drawnLines}A\x1b[0J`);
    drawnLines = 0;
  }
}

function drawLive(lines: string[]): void {
  if (TTY) {
    clearLive();
    // Cut to the terminal's width: a wrapped line would break the cursor-up count of the redraw.
    const width = Math.max(20, (process.stdout.columns || 120) - 1);
    process.stdout.write(`${lines.map((l) => l.slice(0, width)).join('\n')}\n`);
    drawnLines = lines.length;
  } else {
    process.stdout.write(`[demo ${elapsed()}] ${lines.map((l) => l.trim()).join(' | ')}\n`);
  }
}

/** An order unconfirmed for longer than this counts in the order gap (as the operator's status). */
const GAP_THRESHOLD_MS = 30_000;

export interface Watched {
  admin: Admin;
  redis: Redis;
  pg: Pool;
  namespace: string;
  name: string;
  activityId: string;
  startMs: number;
  endMs: number;
}

/** Draws one progress update and returns the activity's phase. */
export async function progress(w: Watched, tally: Tally): Promise<string | undefined> {
  const { activityId } = w;
  const [fsa, stock, outbox, orders, unconfirmed, gap] = await Promise.all([
    getActivity(w.admin, w.namespace, w.name),
    readStock(w.redis, activityId),
    readOutbox(w.redis, activityId),
    countOrders(w.pg, activityId),
    countUnconfirmed(w.redis, activityId, Date.now() + 1),
    countUnconfirmed(w.redis, activityId, Date.now() - GAP_THRESHOLD_MS),
  ]);
  const phase = fsa?.status?.phase ?? '(none yet)';
  const now = Date.now();
  const clock =
    now < w.startMs
      ? `opens in ${((w.startMs - now) / 1000).toFixed(0)}s`
      : now < w.endMs
        ? `closes in ${((w.endMs - now) / 1000).toFixed(0)}s`
        : `closed ${((now - w.endMs) / 1000).toFixed(0)}s ago`;
  const last = tally.perSecond.get(Math.floor(now / 1000) - 1) ?? new Map<string, number>();
  const rate = [...last.entries()].map(([l, n]) => `${l} ${n}`).join(', ') || '-';
  const totals = [...tally.total.entries()].map(([l, n]) => `${l} ${n}`).join(', ') || '-';
  const stockLine =
    stock.skus.length > 0
      ? `${stock.remaining}/${stock.initial} (${stock.skus.map((s) => `${s.skuId} ${s.remaining}`).join(', ')})`
      : `${fsa?.status?.stock?.remaining ?? '-'}/${fsa?.status?.stock?.initial ?? '-'} (cache cleaned; status)`;
  drawLive([
    `  phase         ${phase}  (${clock})`,
    `  stock left    ${stockLine}`,
    `  reservations  last second: ${rate}`,
    `                total: ${totals}`,
    `  half messages ${outbox.halfMessages}   orders in PostgreSQL ${orders.orders} (${orders.quantity} units)`,
    `  unconfirmed   ${unconfirmed}   order gap (>${GAP_THRESHOLD_MS / 1000}s) ${gap}` +
      `   status gap ${fsa?.status?.backlog?.orderGap ?? '-'}`,
  ]);
  return fsa?.status?.phase;
}
