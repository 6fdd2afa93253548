// `make demo`: one whole flash sale on this machine, visible as it runs (docs/demo.md).
//
// Starts PostgreSQL, Redis, Kafka and a Kubernetes API server (test/env/env-up.sh) unless
// DATABASE_URL, REDIS_URL, KAFKA_BROKERS and KUBECONFIG are all given, installs the CRD and the
// operator's RBAC, runs the operator and the runtime roles (api, relay, consumer) as local
// processes, applies examples/activity.yaml with its times a few seconds ahead, drives simulated
// buyers through the real HTTP API and ends with a summary whose checks are queries against
// PostgreSQL and Redis. Exits 1 when an invariant fails. Stops everything it started, also on
// Ctrl-C.
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { countUnconfirmed, readOutbox, readStock } from '../core/activity-cache.js';
import { migrate } from '../core/db/migrate.js';
import { countOrders } from '../core/db/orders-store.js';
import { createPool } from '../core/db/pool.js';
import type { Pool } from '../core/db/pool.js';
import { readStockRows, readWriteBack } from '../core/db/stock-store.js';
import { createKafka, ensureTopics, topicsFor } from '../core/kafka.js';
import { activityKeys } from '../core/keys.js';
import type { FlashSaleActivity, ItemSpec, Schedule } from '../operator/api/v1alpha1/types.js';
import {
  admin,
  createActivity,
  getActivity,
  installCrd,
  prepareNamespace,
  readYaml,
  scanKeys,
  startOperator,
} from '../test/e2e/operator/harness.js';
import type { Admin, OperatorProcess } from '../test/e2e/operator/harness.js';
import { uniqueId } from '../test/helpers/env.js';
import { signNotification } from '../runtime/payments/hmac-provider.js';
import { startFakeProvider } from '../test/helpers/fake-provider.js';
import type { FakeProvider } from '../test/helpers/fake-provider.js';
import { ROOT, httpClient, startRole, tokenFor, waitFor } from '../test/helpers/runtime.js';
import type { RoleProcess } from '../test/helpers/runtime.js';

// ---------------------------------------------------------------------------------------------
// Knobs: DEMO_* environment variables, or the same as flags (--buyers 5000, --stock=800, ...).
// ---------------------------------------------------------------------------------------------

const KNOBS = {
  buyers: ['DEMO_BUYERS', 3000, 'simulated buyers (one purchase attempt each)'],
  stock: ['DEMO_STOCK', 600, 'total units, split over the example SKUs in their proportions'],
  warmup: ['DEMO_WARMUP_IN', 5, 'seconds from applying the activity to warm-up'],
  start: ['DEMO_START_IN', 15, 'seconds from applying the activity to the sale opening'],
  duration: ['DEMO_DURATION', 30, 'seconds the sale stays open'],
  concurrency: ['DEMO_CONCURRENCY', 64, 'buyer requests in flight at most'],
  doubleclick: ['DEMO_DOUBLE_CLICK_PERCENT', 10, '% of buyers who send the same request twice'],
  starttimeout: ['DEMO_START_TIMEOUT', 300, 'seconds allowed for the operator and roles to start'],
  drain: ['DEMO_DRAIN_TIMEOUT', 20, 'seconds the operator waits for the backlog at the end'],
  paywindow: ['DEMO_PAYMENT_WINDOW', 30, 'seconds a buyer has to pay (spec.payment.timeout, >= 10)'],
  paypercent: ['DEMO_PAY_PERCENT', 60, '% of orders paid with a signed notification'],
  interval: ['DEMO_INTERVAL', 1, 'seconds between two progress updates'],
  prometheus: ['DEMO_PROMETHEUS', 0, '1: run Prometheus scraping the operator and roles, print its URL'],
} as const;
type Knob = keyof typeof KNOBS;

function readKnobs(argv: string[]): Record<Knob, number> {
  const flags = new Map<string, string>();
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i] ?? '';
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
    if (!m) throw new Error(`unexpected argument ${arg} (see docs/demo.md)`);
    const name = (m[1] ?? '').replace(/-/g, '');
    if (name === 'help') {
      process.stdout.write('Usage: scripts/demo.sh [--knob value ...]\n');
      for (const [k, [envName, def, text]] of Object.entries(KNOBS))
        process.stdout.write(
          `  --${k.padEnd(12)} ${envName.padEnd(26)} ${String(def).padStart(5)}  ${text}\n`,
        );
      process.exit(0);
    }
    flags.set(name, m[2] ?? argv[++i] ?? '');
  }
  const out = {} as Record<Knob, number>;
  for (const [k, [envName, def]] of Object.entries(KNOBS) as [Knob, (typeof KNOBS)[Knob]][]) {
    const raw = flags.get(k) ?? process.env[envName];
    const v = raw === undefined || raw === '' ? def : Number(raw);
    if (!Number.isFinite(v) || v < 0) throw new Error(`${envName}/--${k}: not a non-negative number: ${raw}`);
    out[k] = v;
  }
  if (out.start <= out.warmup) throw new Error('DEMO_START_IN must be after DEMO_WARMUP_IN');
  if (out.duration < 1 || out.buyers < 1 || out.stock < 1 || out.concurrency < 1)
    throw new Error('DEMO_DURATION, DEMO_BUYERS, DEMO_STOCK and DEMO_CONCURRENCY must be at least 1');
  return out;
}

// ---------------------------------------------------------------------------------------------
// Output: a redrawn block on a terminal, plain lines otherwise.
// ---------------------------------------------------------------------------------------------

const TTY = process.stdout.isTTY === true && process.env.DEMO_PLAIN !== '1';
const t0 = Date.now();
const elapsed = (): string => `${((Date.now() - t0) / 1000).toFixed(1).padStart(5)}s`;
let drawnLines = 0;

function say(line: string): void {
  clearLive();
  process.stdout.write(`[demo ${elapsed()}] ${line}\n`);
}

function clearLive(): void {
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

// ---------------------------------------------------------------------------------------------
// Everything started here, stopped in reverse order whatever happens.
// ---------------------------------------------------------------------------------------------

const SERVER_VARS = ['DATABASE_URL', 'REDIS_URL', 'KAFKA_BROKERS', 'KUBECONFIG'] as const;
const ENV_DIR = join(ROOT, 'test', 'env');
let ownedState: string | undefined;
let envUp: ChildProcess | undefined;
const roles: RoleProcess[] = [];
/** The payment provider stand-in (refunds), for the summary's refund check. */
let payProvider: FakeProvider | undefined;
let operator: OperatorProcess | undefined;
const closers: (() => Promise<void> | void)[] = [];
let stopping = false;

function stopServersSync(): void {
  if (envUp?.pid !== undefined && envUp.exitCode === null) {
    try {
      process.kill(-envUp.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  if (ownedState && existsSync(ownedState)) {
    spawnSync('bash', [join(ENV_DIR, 'env-down.sh'), ownedState], { stdio: 'ignore', timeout: 90_000 });
  }
  ownedState = undefined;
}

async function stopAll(): Promise<void> {
  if (stopping) return;
  stopping = true;
  clearLive();
  const withTimeout = async (p: Promise<unknown>, ms: number): Promise<void> => {
    await Promise.race([p.catch(() => undefined), new Promise((r) => setTimeout(r, ms))]);
  };
  for (const c of closers.reverse()) await withTimeout(Promise.resolve().then(c), 5_000);
  await withTimeout(Promise.all(roles.map((r) => r.stop())), 25_000);
  await Promise.all(roles.map((r) => r.kill()));
  if (operator) {
    const op = operator;
    await withTimeout(op.kill('SIGTERM'), 15_000);
    await op.kill('SIGKILL');
  }
  if (ownedState) say(`stopping the servers in ${ownedState}`);
  stopServersSync();
}

for (const [signal, code] of [
  ['SIGINT', 130],
  ['SIGTERM', 143],
  ['SIGHUP', 129],
] as const) {
  process.on(signal, () => {
    if (stopping) return;
    say(`${signal}: stopping everything the demo started`);
    void stopAll().finally(() => process.exit(code));
  });
}
process.on('exit', () => stopServersSync());

async function startServers(stateDir: string): Promise<void> {
  const missing = SERVER_VARS.filter((n) => !process.env[n]);
  if (missing.length === 0) {
    say('using the servers given by DATABASE_URL, REDIS_URL, KAFKA_BROKERS and KUBECONFIG');
    return;
  }
  ownedState = stateDir;
  spawnSync('bash', [join(ENV_DIR, 'env-down.sh'), stateDir], { stdio: 'ignore' }); // a leftover
  say(`starting PostgreSQL, Redis, Kafka and kube-apiserver in ${stateDir} (missing: ${missing.join(', ')})`);
  const child = spawn('bash', [join(ENV_DIR, 'env-up.sh'), stateDir], {
    detached: true,
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  envUp = child;
  let err = '';
  child.stderr?.on('data', (b: Buffer) => {
    err += b.toString('utf8');
    for (const l of b.toString('utf8').split('\n')) if (l.trim()) say(`  ${l.trim()}`);
  });
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  envUp = undefined;
  if (code !== 0) throw new Error(`test/env/env-up.sh failed (${String(code)}):\n${err.slice(-2000)}`);
  const vars = JSON.parse(readFileSync(join(stateDir, 'env.json'), 'utf8')) as Record<string, unknown>;
  for (const [k, v] of Object.entries(vars)) if (typeof v === 'string') process.env[k] = v;
}

// ---------------------------------------------------------------------------------------------
// The activity: examples/activity.yaml with its times moved a few seconds ahead.
// ---------------------------------------------------------------------------------------------

/** The example's stock per SKU scaled to `total` units (largest remainder, at least 1 each). */
function scaleItems(items: ItemSpec[], total: number): ItemSpec[] {
  const exampleTotal = items.reduce((n, i) => n + i.stock, 0);
  const exact = items.map((i) => (i.stock * total) / exampleTotal);
  const stock = exact.map((x) => Math.max(1, Math.floor(x)));
  const byRemainder = exact.map((x, i) => ({ i, r: x - Math.floor(x) })).sort((x, y) => y.r - x.r);
  for (let short = total - stock.reduce((n, x) => n + x, 0), j = 0; short > 0; short -= 1, j += 1) {
    const i = byRemainder[j % byRemainder.length]?.i ?? 0;
    stock[i] = (stock[i] ?? 0) + 1;
  }
  return items.map((item, i) => ({ ...item, stock: stock[i] ?? 1 }));
}

function demoActivity(namespace: string, k: Record<Knob, number>, now: number): FlashSaleActivity {
  const example = readYaml<FlashSaleActivity>('examples/activity.yaml');
  const at = (s: number): string => new Date(now + s * 1000).toISOString();
  const schedule: Schedule = {
    warmUpAt: at(k.warmup),
    startAt: at(k.start),
    endAt: at(k.start + k.duration),
  };
  return {
    ...example,
    metadata: { ...example.metadata, namespace },
    spec: {
      ...example.spec,
      schedule,
      items: scaleItems(example.spec.items ?? [], k.stock),
      drain: { timeout: `${k.drain}s` },
      payment: { timeout: `${Math.max(10, k.paywindow)}s` },
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Payments: the provider's signed notifications (docs/after-sale.md), sent to the after-sale role.
// ---------------------------------------------------------------------------------------------

const PAY_SECRET = 'demo-payment-provider-secret-0123456789';
const PAY_APP = 'demo-app';
const PAY_MERCHANT = 'demo-merchant';

interface PaymentTally {
  /** notification outcome -> count. */
  outcomes: Map<string, number>;
  /** The order paid in time whose notification is held back until the timeout closed it. */
  late: { orderId: string; paidAt: Date; outcome?: string } | undefined;
  /** The order paid twice (two trade numbers). */
  duplicate: { orderId: string; outcome?: string } | undefined;
  seen: Set<string>;
  paidNotified: number;
}

async function notifyPayment(
  url: string,
  orderId: string,
  tradeNo: string,
  amount: string,
  paidAt: Date,
): Promise<string> {
  const body = JSON.stringify({
    app_id: PAY_APP,
    merchant_id: PAY_MERCHANT,
    out_trade_no: orderId,
    trade_no: tradeNo,
    total_amount: amount,
    trade_status: 'TRADE_SUCCESS',
    gmt_payment: paidAt.toISOString(),
  });
  for (let attempt = 1; ; attempt += 1) {
    const r = await fetch(`${url}/v1/payments/hmac/notifications`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-fs-signature': signNotification(PAY_SECRET, body, Math.floor(Date.now() / 1000)),
      },
      body,
    });
    const json = (await r.json().catch(() => ({}))) as { outcome?: string; code?: string };
    // Like a provider: retry what was not acknowledged (5xx), a bounded number of times.
    if (r.status < 500 || attempt >= 5) return json.outcome ?? json.code ?? `http ${r.status}`;
    await new Promise((res) => setTimeout(res, 300 * attempt));
  }
}

/**
 * One round of the simulated payment provider: new UNPAID orders are paid (a share of them, at
 * once) except the first, whose payment is made now but notified only once the timeout closed
 * its order and the stock was written back (late but in time); the first paid order is paid a
 * second time with another trade number (a duplicate trade).
 */
async function payRound(
  pg: Pool,
  url: string,
  activityId: string,
  k: Record<Knob, number>,
  p: PaymentTally,
  random: () => number,
  phase: string | undefined,
): Promise<void> {
  const count = (outcome: string): void => void p.outcomes.set(outcome, (p.outcomes.get(outcome) ?? 0) + 1);
  const fresh = await pg.query<{ id: string; amount: string }>(
    `SELECT id, amount::text AS amount FROM orders WHERE activity_id = $1 AND status = 'UNPAID' ORDER BY id`,
    [activityId],
  );
  for (const o of fresh.rows) {
    if (p.seen.has(o.id)) continue;
    p.seen.add(o.id);
    if (!p.late) {
      p.late = { orderId: o.id, paidAt: new Date() };
      continue;
    }
    if (random() * 100 >= k.paypercent) continue;
    count(await notifyPayment(url, o.id, `T-${o.id}`, o.amount, new Date()));
    p.paidNotified += 1;
    if (!p.duplicate) {
      p.duplicate = { orderId: o.id };
      p.duplicate.outcome = await notifyPayment(url, o.id, `T-${o.id}-again`, o.amount, new Date());
      count(p.duplicate.outcome);
    }
  }
  const late = p.late;
  if (late && !late.outcome && (phase === 'Settling' || phase === 'Completed')) {
    const row = await pg.query<{ status: string; amount: string }>(
      `SELECT status, amount::text AS amount FROM orders WHERE id = $1`,
      [late.orderId],
    );
    if (row.rows[0]?.status === 'CLOSED') {
      late.outcome = await notifyPayment(
        url,
        late.orderId,
        `T-${late.orderId}-late`,
        row.rows[0].amount,
        late.paidAt,
      );
      count(late.outcome);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Buyers.
// ---------------------------------------------------------------------------------------------

interface Tally {
  /** result label -> count, per second since the sale opened and in total. */
  perSecond: Map<number, Map<string, number>>;
  total: Map<string, number>;
  /** reservation id -> buyer, of every 202. */
  accepted: Map<string, string>;
  /** repeated requests answered with another reservation id than the first one's 202. */
  doubleClickMismatch: number;
  sent: number;
}

function count(t: Tally, label: string): void {
  const sec = Math.floor(Date.now() / 1000);
  const bucket = t.perSecond.get(sec) ?? new Map<string, number>();
  bucket.set(label, (bucket.get(label) ?? 0) + 1);
  t.perSecond.set(sec, bucket);
  t.total.set(label, (t.total.get(label) ?? 0) + 1);
}

/** Deterministic pseudo-random numbers (mulberry32) so that two runs send the same crowd. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function runBuyers(
  apiUrl: string,
  activityId: string,
  items: ItemSpec[],
  startMs: number,
  endMs: number,
  k: Record<Knob, number>,
  tally: Tally,
  cancelled: () => boolean,
): Promise<void> {
  const random = rng(20301111);
  const url = `${apiUrl}/v1/activities/${activityId}/orders`;
  const window = Math.max(1000, Math.min(endMs - startMs - 2000, 20_000));
  // 5% eager buyers a second early (the gate is still shut), 70% in the first 3 s, the rest spread.
  const plan = Array.from({ length: k.buyers }, (_, i) => {
    const r = random();
    const at =
      r < 0.05
        ? startMs - 1000 - random() * 1000
        : r < 0.75
          ? startMs + random() * 3000
          : startMs + random() * window;
    const item = items[Math.floor(random() * items.length)] ?? items[0]!;
    const quantity = (item.limitPerUser ?? 1) >= 2 && random() < 0.3 ? 2 : 1;
    return {
      user: `buyer-${i}`,
      at,
      skuId: item.skuId,
      quantity,
      doubleClick: random() * 100 < k.doubleclick,
    };
  }).sort((x, y) => x.at - y.at);
  const http = httpClient(k.concurrency);
  closers.push(() => http.close());
  let next = 0;
  const worker = async (): Promise<void> => {
    for (;;) {
      if (cancelled()) return;
      const b = plan[next++];
      if (!b) return;
      const wait = b.at - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      const token = await tokenFor(b.user);
      const body = { skuId: b.skuId, quantity: b.quantity, requestId: `${b.user}-1` };
      const clicks = b.doubleClick ? 2 : 1;
      let first: string | undefined;
      for (let c = 0; c < clicks; c += 1) {
        tally.sent += 1;
        try {
          const r = await http.post(url, body, token);
          if (r.status === 202) {
            const id = String(r.json.reservationId ?? '');
            count(tally, c === 0 ? 'accepted' : 'accepted (repeat)');
            if (c === 0) first = id;
            else if (first !== undefined && id !== first) tally.doubleClickMismatch += 1;
            tally.accepted.set(id, b.user);
          } else {
            count(tally, typeof r.json.code === 'string' ? r.json.code.toLowerCase() : `http ${r.status}`);
          }
        } catch {
          count(tally, 'network error');
        }
      }
    }
  };
  await Promise.all(Array.from({ length: k.concurrency }, worker));
}

// ---------------------------------------------------------------------------------------------
// Progress and summary: every figure shown is read from the API server, Redis or PostgreSQL.
// ---------------------------------------------------------------------------------------------

const GAP_THRESHOLD_MS = 30_000;

async function progress(
  a: Admin,
  redis: Redis,
  pg: Pool,
  namespace: string,
  name: string,
  activityId: string,
  tally: Tally,
  startMs: number,
  endMs: number,
): Promise<string | undefined> {
  const [fsa, stock, outbox, orders, unconfirmed, gap] = await Promise.all([
    getActivity(a, namespace, name),
    readStock(redis, activityId),
    readOutbox(redis, activityId),
    countOrders(pg, activityId),
    countUnconfirmed(redis, activityId, Date.now() + 1),
    countUnconfirmed(redis, activityId, Date.now() - GAP_THRESHOLD_MS),
  ]);
  const phase = fsa?.status?.phase ?? '(none yet)';
  const now = Date.now();
  const clock =
    now < startMs
      ? `opens in ${((startMs - now) / 1000).toFixed(0)}s`
      : now < endMs
        ? `closes in ${((endMs - now) / 1000).toFixed(0)}s`
        : `closed ${((now - endMs) / 1000).toFixed(0)}s ago`;
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

interface Check {
  name: string;
  ok: boolean;
  detail: string;
}

async function summary(
  redis: Redis,
  pg: Pool,
  fsa: FlashSaleActivity | undefined,
  activityId: string,
  items: ItemSpec[],
  tally: Tally,
  metrics: string[],
  payments: PaymentTally,
): Promise<boolean> {
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
        payProvider?.executed.size === payState.get('REFUNDED'),
      detail:
        `${payState.get('REFUNDED') ?? 0} payment(s) refunded, ` +
        `${payProvider?.executed.size ?? 0} refund(s) executed by the provider ` +
        `(${[...(payProvider?.calls.values() ?? [])].reduce((n, c) => n + c, 0)} call(s))`,
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
  lines.push('', `DEMO ${ok ? 'PASSED' : 'FAILED'} in ${((Date.now() - t0) / 1000).toFixed(1)}s`);
  process.stdout.write(`${lines.join('\n')}\n`);
  return ok;
}

/**
 * DEMO_PROMETHEUS=1: Prometheus (Debian's package, test/env/start-prometheus.sh) scraping the
 * operator and the roles every second, as in test/e2e/prometheus/; stopped with the demo.
 * Returns its URL.
 */
function startPrometheus(namespace: string, targets: { pod: string; port: number }[]): string {
  const state = `/tmp/flashsale-demo-prometheus-${process.pid}`;
  const started = spawnSync('bash', [join(ENV_DIR, 'start-prometheus.sh'), state], { encoding: 'utf8' });
  closers.push(() => {
    spawnSync('bash', [join(ENV_DIR, 'env-down.sh'), state], { stdio: 'ignore', timeout: 30_000 });
  });
  if (started.status !== 0) throw new Error(`start-prometheus.sh failed: ${started.stderr}`);
  const vars = Object.fromEntries(
    readFileSync(join(state, 'prometheus.env'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  ) as Record<string, string>;
  writeFileSync(
    join(vars.PROMETHEUS_TARGETS_DIR ?? '', 'demo.json'),
    JSON.stringify(
      targets.map((t) => ({ targets: [`127.0.0.1:${t.port}`], labels: { namespace, pod: t.pod } })),
    ),
  );
  return vars.PROMETHEUS_URL ?? '';
}

/** How many of the demo's targets Prometheus scraped successfully last time. */
async function prometheusTargets(url: string): Promise<string> {
  try {
    const r = await fetch(`${url}/api/v1/query?query=${encodeURIComponent('count(up == 1) or vector(0)')}`);
    const body = (await r.json()) as { data?: { result?: { value?: [number, string] }[] } };
    return `${url}/graph (${body.data?.result?.[0]?.value?.[1] ?? '0'} targets up)`;
  } catch (err) {
    return `${url}/graph (unreachable: ${String(err)})`;
  }
}

async function scrapeMetrics(name: string, url: string): Promise<string> {
  try {
    const r = await fetch(`${url}/metrics`);
    const text = await r.text();
    const series = text.split('\n').filter((l) => l !== '' && !l.startsWith('#')).length;
    return `${name.padEnd(9)} ${url}/metrics (${r.status}, ${series} series)`;
  } catch (err) {
    return `${name.padEnd(9)} ${url}/metrics (unreachable: ${String(err)})`;
  }
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<number> {
  const k = readKnobs(process.argv.slice(2));
  await startServers(process.env.DEMO_STATE_DIR || '/tmp/flashsale-demo');
  const databaseUrl = process.env.DATABASE_URL ?? '';
  const a = admin();
  const namespace = uniqueId('flashsale-demo');
  // The id is chosen here (spec.activityId) so that the relay and the consumer, which serve one
  // activity, start alongside the operator instead of after warm-up: in a cluster the operator
  // scales their Deployments up at warm-up; here there is no kubelet and a local process takes
  // seconds to start. Their topics are created now for the same reason (the operator's warm-up
  // finds them and goes on); the cache loading, gate and everything after stay the operator's.
  const activityId = uniqueId('demo-double11');
  say(`installing the CRD, namespace ${namespace} with the operator's RBAC, migrating PostgreSQL`);
  await migrate(databaseUrl);
  const kafkaAdmin = createKafka((process.env.KAFKA_BROKERS ?? '').split(','), 'flashsale-demo').admin();
  await kafkaAdmin.connect();
  await ensureTopics(kafkaAdmin, topicsFor(activityId), 2, 1);
  await kafkaAdmin.disconnect();
  // Own readiness waits (the helpers' are sized for tests): a loaded machine can take minutes to
  // start four Node processes.
  const ready = async (what: string, probe: () => Promise<boolean>, proc: ChildProcess): Promise<void> => {
    await waitFor(
      what,
      async () => {
        if (proc.exitCode !== null || proc.signalCode !== null)
          throw new Error(`${what}: the process exited`);
        return probe();
      },
      k.starttimeout * 1000,
      250,
    );
  };
  // A short payment window (spec.payment.timeout, the same PAYMENT_TIMEOUT_SECONDS the operator
  // gives its Deployments) and a sweeper every 2 s, so that the orders outlive the sale by seconds.
  // The payment provider's refund endpoint: a local stand-in that signs its answers and refunds
  // each refund id once, like a real provider; the after-sale role's refund worker calls it.
  const provider = await startFakeProvider({ secret: PAY_SECRET });
  payProvider = provider;
  closers.push(() => provider.close());
  const afterSaleEnv = {
    PAYMENT_TIMEOUT_SECONDS: String(Math.max(10, k.paywindow)),
    PAYMENT_SWEEP_CRON: '*/2 * * * * *',
    STOCK_SETTLE_GRACE_SECONDS: '2',
  };
  const started = Promise.all(
    (['api', 'relay', 'consumer', 'after-sale'] as const).map(async (role) => {
      const r = await startRole(role, {
        databaseUrl,
        waitReady: false,
        ...(role === 'api' || role === 'after-sale' ? {} : { activityId }),
        env: {
          ...afterSaleEnv,
          ...(role === 'after-sale'
            ? {
                PAYMENT_HMAC_SECRET: PAY_SECRET,
                PAYMENT_HMAC_APP_ID: PAY_APP,
                PAYMENT_HMAC_MERCHANT_ID: PAY_MERCHANT,
                PAYMENT_HMAC_REFUND_URL: provider.refundUrl,
                REFUND_WORKER_CRON: '* * * * * *',
              }
            : {}),
        },
      });
      roles.push(r);
      await ready(`${role} ready`, async () => (await fetch(`${r.url}/readyz`)).status === 200, r.proc);
      return r;
    }),
  );
  started.catch(() => undefined);
  await installCrd(a);
  const ns = await prepareNamespace(namespace, a);
  say('starting the operator and the runtime roles (api, relay, consumer, after-sale) as local processes');
  const op = await startOperator({ ns, databaseUrl, waitFor: 'nothing' });
  operator = op;
  await ready(
    'operator leading',
    async () => op.records().some((r) => r.msg === 'controller started'),
    op.proc,
  );
  const [apiRole, , , afterSaleRole] = (await started) as [
    RoleProcess,
    RoleProcess,
    RoleProcess,
    RoleProcess,
  ];
  say(
    `operator leading (metrics http://127.0.0.1:${operator.port}/metrics); ` +
      roles.map((r) => `${r.role} ${r.url}`).join(', '),
  );
  let prometheus: string | undefined;
  if (k.prometheus > 0) {
    prometheus = startPrometheus(namespace, [
      { pod: op.identity, port: op.port },
      // The roles serve /metrics on their metrics port only (never the buyer port).
      ...roles.map((r) => ({ pod: `demo-${r.role}`, port: Number(new URL(r.metricsUrl).port) })),
    ]);
    say(`prometheus ${prometheus}/graph scrapes the operator and the roles every second (until the end)`);
  }

  const redis = new Redis(process.env.REDIS_URL ?? '');
  closers.push(() => redis.disconnect());
  const pg = createPool(databaseUrl, 3, 'flashsale-demo');
  closers.push(() => pg.end());

  const body = demoActivity(namespace, k, Date.now());
  const name = body.metadata.name;
  body.spec.activityId = activityId;
  await createActivity(a, body as unknown as Record<string, unknown>);
  const items = body.spec.items ?? [];
  const startMs = Date.parse(body.spec.schedule.startAt);
  const endMs = startMs + k.duration * 1000;
  say(
    `applied FlashSaleActivity ${namespace}/${name} (activity ${activityId}): ` +
      items.map((i) => `${i.skuId} x${i.stock}`).join(', ') +
      `; warm-up in ${k.warmup}s, opens in ${k.start}s, open for ${k.duration}s; ${k.buyers} buyers`,
  );

  const tally: Tally = {
    perSecond: new Map(),
    total: new Map(),
    accepted: new Map(),
    doubleClickMismatch: 0,
    sent: 0,
  };
  const payments: PaymentTally = {
    outcomes: new Map(),
    late: undefined,
    duplicate: undefined,
    seen: new Set(),
    paidNotified: 0,
  };
  const payRandom = rng(20301112);
  let phase: string | undefined;
  let buyers: Promise<void> | undefined;
  let done = false;
  const deadline = endMs + 120_000;
  while (!done) {
    const seen = await progress(a, redis, pg, namespace, name, activityId, tally, startMs, endMs).catch(
      (err: unknown) => {
        say(`progress: ${String(err)}`);
        return phase;
      },
    );
    if (seen !== phase) {
      say(`phase ${phase ?? '-'} → ${seen ?? '-'}`);
      phase = seen;
    }
    if (!buyers && Date.now() >= startMs - 2500) {
      buyers = runBuyers(apiRole.url, activityId, items, startMs, endMs, k, tally, () => stopping);
    }
    if (Date.now() >= startMs) {
      await payRound(pg, afterSaleRole.url, activityId, k, payments, payRandom, phase).catch((err: unknown) =>
        say(`payments: ${String(err)}`),
      );
    }
    if (phase === 'Completed' || phase === 'Failed') done = true;
    else if (Date.now() > deadline) {
      say('the activity did not complete within 2 minutes after its end');
      done = true;
    } else await new Promise((r) => setTimeout(r, k.interval * 1000));
  }
  await buyers;
  const metrics = await Promise.all([
    scrapeMetrics('operator', `http://127.0.0.1:${operator.port}`),
    ...roles.map((r) => scrapeMetrics(r.role, r.metricsUrl)),
  ]);
  if (prometheus) metrics.push(`prometheus ${await prometheusTargets(prometheus)}`);
  const fsa = await getActivity(a, namespace, name);
  const ok = await summary(redis, pg, fsa, activityId, items, tally, metrics, payments);
  return ok ? 0 : 1;
}

main()
  .then(
    (code) => code,
    (err: unknown) => {
      say(`failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
      for (const r of roles) process.stdout.write(`--- ${r.role} output ---\n${r.output().slice(-3000)}\n`);
      if (operator) process.stdout.write(`--- operator log: ${operator.logFile}\n`);
      return 2;
    },
  )
  .then(async (code) => {
    await stopAll();
    process.exit(code);
  });
