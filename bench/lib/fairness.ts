/**
 * Fairness under bots (`BENCH_ONLY=fairness`): the same opening run twice on one machine, with
 * traffic shaping and load shedding off, then on. Each run is an open-loop schedule (requests leave
 * at their planned instant whatever the answers, as a real crowd does); the flood is generated in
 * a worker thread (bench/lib/fairness-flood.ts), the honest clicks on the main thread:
 *
 * - honest buyers: one click each at a random instant of the first second of the sale, and a
 *   second click (a new requestId) only when the first was not an answer about stock (a 429, a 503,
 *   a network error, or "not started" from a clock a little ahead);
 * - bot accounts: each sends `botRate` requests per second from its own address, from before the
 *   opening until the end, every request a new requestId;
 * - one address drives `farmAccounts` accounts, `farmRate` requests per second in total.
 *
 * Stock is smaller than the honest demand. Reported: the share of the stock honest buyers won
 * against their fair share (their fraction of distinct accounts), the most requests one bot account
 * got past the limiter in a window (against its per-account limit), and the latency of honest
 * requests under the flood. Client addresses travel in X-Forwarded-For; the api believes one hop.
 */
import { Worker } from 'node:worker_threads';
import { Client, nowMs, tokenSigner } from './fairness-client.js';
import type { Sent } from './fairness-client.js';
import type { FloodPlan } from './fairness-flood.js';
import type { Ctx } from './context.js';
import { benchItem } from './context.js';
import { startRole, stopRole } from './runtime.js';
import { log } from './util.js';

export interface FairnessOptions {
  honest: number;
  bots: number;
  botRate: number;
  farmAccounts: number;
  farmRate: number;
  stock: number;
  /** Seconds the flood runs before the opening, and after it. */
  leadS: number;
  floodS: number;
  /** Limits of the "on" run (per account; per address). */
  perBuyer: { requests: number; perSeconds: number };
  perAddress: { requests: number; perSeconds: number };
}

export const DEFAULT_FAIRNESS: FairnessOptions = {
  honest: 1000,
  bots: 20,
  botRate: 50,
  farmAccounts: 200,
  farmRate: 1000,
  stock: 500,
  leadS: 1.5,
  floodS: 5,
  // The operator's default per-buyer limit; the per-address limit is off by default (many honest
  // buyers may share an address) and is switched on here for the activity, as docs/operator.md says.
  perBuyer: { requests: 20, perSeconds: 10 },
  perAddress: { requests: 20, perSeconds: 10 },
};

export interface FairnessRun {
  shaping: 'off' | 'on';
  /** Seconds the flood started before the opening (0: bots that start at the opening). */
  leadS: number;
  stock: number;
  won: { honest: number; bots: number; farm: number };
  fairShare: number;
  honestShare: number;
  /** honestShare / fairShare. */
  ratio: number;
  honest: { requests: number; p50Ms: number; p99Ms: number; statusCounts: Record<string, number> };
  /** Inside the api (its own histogram; every answer of the submit route, any client). */
  server: { p50Ms: number; p99Ms: number; loopDelayP99Ms: number };
  bots: {
    requests: number;
    statusCounts: Record<string, number>;
    /** Most requests one bot account got past the limiter (answered other than 429/503). */
    maxPassedPerAccount: number;
    /** For that account: how many limiter windows its requests spanned, and the limit per window. */
    windows: number;
    limit: number;
    /** Max over bot accounts of passed / (limit × windows spanned); ≤ 1 when the limit held. */
    worstUse: number;
  };
  farm: { requests: number; statusCounts: Record<string, number>; passed: number; limit: number };
  /** Requests that went out later than planned by more than 100 ms (the load generator fell behind). */
  lateSends: number;
  durationS: number;
}

/**
 * The api's own view from its /metrics: quantiles (bucket upper bounds) of the submit route's
 * duration, all answers, and of the event-loop delay windows. Separates time spent in the api from
 * time spent before it (kernel queues, the client's own event loop).
 */
export function serverSide(text: string): { p50Ms: number; p99Ms: number; loopDelayP99Ms: number } {
  const buckets = (metric: string, filter: (labels: string) => boolean): Map<number, number> => {
    const out = new Map<number, number>();
    const re = new RegExp(`^${metric}_bucket\\{([^}]*)\\} (\\S+)$`, 'gm');
    for (const m of text.matchAll(re)) {
      const labels = m[1] ?? '';
      if (!filter(labels)) continue;
      const le = /le="([^"]+)"/.exec(labels)?.[1] ?? '+Inf';
      const bound = le === '+Inf' ? Infinity : Number(le);
      out.set(bound, (out.get(bound) ?? 0) + Number(m[2]));
    }
    return out;
  };
  const quantile = (b: Map<number, number>, q: number): number => {
    const sorted = [...b.entries()].sort((x, y) => x[0] - y[0]);
    const total = sorted.at(-1)?.[1] ?? 0;
    if (total === 0) return NaN;
    return (sorted.find(([, n]) => n >= q * total)?.[0] ?? Infinity) * 1000;
  };
  const route = buckets(
    'flashsale_http_request_duration_seconds',
    (l) => l.includes('route="/v1/activities/:activityId/orders"') && l.includes('method="POST"'),
  );
  const loop = buckets('flashsale_event_loop_delay_seconds', () => true);
  return { p50Ms: quantile(route, 0.5), p99Ms: quantile(route, 0.99), loopDelayP99Ms: quantile(loop, 0.99) };
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

function counts(xs: Sent[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const x of xs) {
    const k = x.status === 0 ? `error ${x.error}` : `${x.status}${x.code ? ` ${x.code}` : ''}`;
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}

async function oneRun(ctx: Ctx, shaping: 'off' | 'on', o: FairnessOptions): Promise<FairnessRun> {
  const variant = `${shaping}${o.leadS === 0 ? '-at-opening' : ''}`;
  const { core, redis } = ctx;
  const activityId = `bfair-${variant}-${ctx.runId}`;
  ctx.activities.add(activityId);
  const opensAt = Date.now() + (Math.max(o.leadS, 1.5) + 2) * 1000;
  await core.cache.loadActivity(redis, {
    id: activityId,
    generation: 1,
    startAt: new Date(opensAt),
    endAt: new Date(opensAt + 3600_000),
    requireOrderCode: false,
    reopenOnRelease: false,
    items: [benchItem('drop', o.stock)],
  });
  await core.policy.writeTrafficPolicy(redis, activityId, {
    shaping: { enabled: shaping === 'on', perBuyer: o.perBuyer, perAddress: o.perAddress },
    eligibility: { preRegistration: false, orderCodesPerBuyerPerSku: 0 },
  });
  // The gate is open; the Redis clock keeps the sale shut until startAt (NOT_STARTED before it).
  await core.cache.setGate(redis, activityId, 'open');
  const api = await startRole('api', {
    distDir: ctx.cfg.distDir,
    luaDir: ctx.cfg.luaDir,
    logDir: ctx.logDir,
    env: ctx.servers.env,
    activityId,
    label: `api-fairness-${variant}`,
    roleEnv: ctx.cfg.roleEnv,
    extraEnv: {
      JWT_HS256_SECRET: ctx.secret,
      API_TRUST_PROXY: '1',
      // "off" is the api as it was: no limiter, no shedding.
      ...(shaping === 'off' ? { API_MAX_IN_FLIGHT: '0', API_MAX_EVENT_LOOP_DELAY_MS: '0' } : {}),
    },
  });
  const sign = tokenSigner(ctx.secret);
  const url = `http://127.0.0.1:${api.port}/v1/activities/${activityId}/orders`;
  const floodStart = opensAt - o.leadS * 1000;
  const plan: FloodPlan = {
    url,
    secret: ctx.secret,
    runId: ctx.runId,
    bots: o.bots,
    botRate: o.botRate,
    farmAccounts: o.farmAccounts,
    farmRate: o.farmRate,
    floodStart,
    floodEnd: opensAt + o.floodS * 1000,
  };
  // The flood runs in a worker thread, on its own event loop and connections (as other machines
  // would): an honest click neither waits for the flood's generation nor for a connection it holds.
  // A worker does not inherit the tsx loader of `node --import tsx`: the bootstrap registers it.
  const floodModule = new URL('./fairness-flood.ts', import.meta.url).href;
  const worker = new Worker(
    `import { register } from 'tsx/esm/api'; register(); await import(${JSON.stringify(floodModule)});`,
    { eval: true, workerData: plan },
  );
  const flooded = new Promise<{ sent: Sent[]; lateSends: number }>((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
    worker.once('exit', (code) => reject(new Error(`flood worker exited with ${code}`)));
  });
  const honest = new Client(url, 1000);
  const tasks: Promise<unknown>[] = [];
  // Honest buyers: one click in the first second; a second click only after an answer that says
  // nothing about stock.
  for (let h = 0; h < o.honest; h += 1) {
    const account = `honest-${ctx.runId}-${h}`;
    const token = sign(account);
    const address = `10.${(h >> 16) & 255}.${(h >> 8) & 255}.${h & 255}`;
    const clickAt = opensAt + Math.random() * 1000;
    tasks.push(
      (async () => {
        await honest.at(clickAt);
        const first = await honest.fire('honest', account, token, address, `h${h}-1`);
        if (first.status === 202 || first.code === 'SOLD_OUT' || first.code === 'LIMIT_REACHED') return;
        await new Promise((r) => setTimeout(r, 300 + Math.random() * 500));
        await honest.fire('honest', account, token, address, `h${h}-2`);
      })(),
    );
  }
  const started = nowMs();
  await Promise.all(tasks);
  const floodResult = await flooded;
  await worker.terminate();
  const durationS = (nowMs() - started) / 1000;
  await honest.close();
  // /metrics is served on the metrics port only (runtime/http.ts); the buyer port answers 404.
  const server = serverSide(await (await fetch(`http://127.0.0.1:${api.metricsPort}/metrics`)).text());
  await stopRole(api);
  const sent: Sent[] = [...honest.sent, ...floodResult.sent];
  const lateSends = honest.lateSends + floodResult.lateSends;

  const of = (who: Sent['who']): Sent[] => sent.filter((s) => s.who === who);
  const wins = (who: Sent['who']): number =>
    new Set(
      of(who)
        .filter((s) => s.status === 202 && !s.replayed)
        .map((s) => s.account),
    ).size;
  const won = { honest: wins('honest'), bots: wins('bot'), farm: wins('farm') };
  const total = won.honest + won.bots + won.farm;
  const accounts = o.honest + o.bots + o.farmAccounts;
  const fairShare = o.honest / accounts;
  const honestShare = total > 0 ? won.honest / total : NaN;
  const honestMs = of('honest')
    .map((s) => s.ms)
    .sort((a, b) => a - b);
  // Requests past the limiter: anything but the limiter's 429 and the admission control's 503.
  const passed = (s: Sent): boolean => s.status !== 429 && s.status !== 503 && s.status !== 0;
  // The limiter's windows are fixed and start at an account's first request; an account's
  // requests span ceil(span / window) of them, so the limit held if passed <= limit x windows.
  let worst = { passed: 0, windows: 1, use: 0 };
  const byBot = new Map<string, Sent[]>();
  for (const s of of('bot')) byBot.set(s.account, [...(byBot.get(s.account) ?? []), s]);
  for (const list of byBot.values()) {
    const ok = list.filter(passed);
    const first = Math.min(...list.map((s) => s.sentAt));
    const last = Math.max(first, ...ok.map((s) => s.answeredAt));
    const windows = Math.max(1, Math.ceil((last - first) / 1000 / o.perBuyer.perSeconds));
    const use = ok.length / (o.perBuyer.requests * windows);
    if (use > worst.use || (use === worst.use && ok.length > worst.passed)) {
      worst = { passed: ok.length, windows, use };
    }
  }
  const run: FairnessRun = {
    shaping,
    leadS: o.leadS,
    stock: o.stock,
    won,
    fairShare,
    honestShare,
    ratio: honestShare / fairShare,
    honest: {
      requests: honestMs.length,
      p50Ms: percentile(honestMs, 50),
      p99Ms: percentile(honestMs, 99),
      statusCounts: counts(of('honest')),
    },
    server,
    bots: {
      requests: of('bot').length,
      statusCounts: counts(of('bot')),
      maxPassedPerAccount: worst.passed,
      windows: worst.windows,
      limit: o.perBuyer.requests,
      worstUse: worst.use,
    },
    farm: {
      requests: of('farm').length,
      statusCounts: counts(of('farm')),
      passed: of('farm').filter(passed).length,
      limit: o.perAddress.requests,
    },
    lateSends,
    durationS,
  };
  log(
    `fairness ${variant}: honest won ${won.honest}/${total} (share ${honestShare.toFixed(3)}, fair ${fairShare.toFixed(3)}, ` +
      `ratio ${run.ratio.toFixed(2)}), bots ${won.bots}, farm ${won.farm}; honest p99 ${run.honest.p99Ms.toFixed(0)} ms ` +
      `(inside the api: p50 ${server.p50Ms} / p99 ${server.p99Ms} ms, loop delay p99 ${server.loopDelayP99Ms} ms); ` +
      `bot max passed ${run.bots.maxPassedPerAccount} over ${run.bots.windows} window(s) (limit ${run.bots.limit} each); ` +
      `late sends ${lateSends}`,
  );
  return run;
}

export async function fairness(ctx: Ctx, o: FairnessOptions = DEFAULT_FAIRNESS): Promise<FairnessRun[]> {
  const off = await oneRun(ctx, 'off', o);
  const on = await oneRun(ctx, 'on', o);
  // Bots that save their budget for the opening instead of spending it on "not started".
  const onAtOpening = await oneRun(ctx, 'on', { ...o, leadS: 0 });
  return [off, on, onAtOpening];
}
