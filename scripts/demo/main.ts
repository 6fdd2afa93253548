// `make demo`: one whole flash sale on this machine, visible as it runs (docs/demo.md).
//
// Starts the servers unless they are given (servers.ts), runs the operator and the runtime roles
// as local processes (processes.ts), applies examples/activity.yaml with its times a few seconds
// ahead (activity.ts), drives simulated buyers (buyers.ts) and payments (payments.ts) through the
// real HTTP API while showing the progress (display.ts), and ends with a summary whose checks are
// queries against PostgreSQL and Redis (checks.ts). Exits 1 when a check fails, 2 when the demo
// could not run. Stops everything it started, also on Ctrl-C.
import { Redis } from 'ioredis';
import { createPool } from '../../core/db/pool.js';
import { createActivity, getActivity } from '../../dev/operator-harness.js';
import { uniqueId } from '../../dev/servers.js';
import { demoActivity } from './activity.js';
import { newTally, rng, runBuyers } from './buyers.js';
import { summary } from './checks.js';
import { progress, say } from './display.js';
import type { Watched } from './display.js';
import { readKnobs } from './knobs.js';
import { prometheusTargets, scrapeMetrics, startPrometheus } from './metrics.js';
import { newPaymentTally, payRound } from './payments.js';
import { startPlatform } from './processes.js';
import { isStopping, startServers, started, stopAll, stopOnSignals } from './servers.js';

/** How long after its end the activity may take to complete before the demo gives up. */
const COMPLETION_GRACE_MS = 120_000;

async function main(): Promise<number> {
  const k = readKnobs(process.argv.slice(2));
  await startServers(process.env.DEMO_STATE_DIR || '/tmp/flashsale-demo');
  const namespace = uniqueId('flashsale-demo');
  const activityId = uniqueId('demo-double11');
  const platform = await startPlatform(k, namespace, activityId);
  const op = platform.operator;
  let prometheus: string | undefined;
  if (k.prometheus > 0) {
    prometheus = startPrometheus(namespace, [
      { pod: op.identity, port: op.port },
      // The roles serve /metrics on their metrics port only (never the buyer port).
      ...started.roles.map((r) => ({ pod: `demo-${r.role}`, port: Number(new URL(r.metricsUrl).port) })),
    ]);
    say(`prometheus ${prometheus}/graph scrapes the operator and the roles every second (until the end)`);
  }

  const redis = new Redis(process.env.REDIS_URL ?? '');
  started.closers.push(() => redis.disconnect());
  const pg = createPool(process.env.DATABASE_URL ?? '', 3, 'flashsale-demo');
  started.closers.push(() => pg.end());

  const body = demoActivity(namespace, activityId, k, Date.now());
  const name = body.metadata.name;
  await createActivity(platform.admin, body as unknown as Record<string, unknown>);
  const items = body.spec.items ?? [];
  const startMs = Date.parse(body.spec.schedule.startAt);
  const endMs = startMs + k.duration * 1000;
  say(
    `applied FlashSaleActivity ${namespace}/${name} (activity ${activityId}): ` +
      items.map((i) => `${i.skuId} x${i.stock}`).join(', ') +
      `; warm-up in ${k.warmup}s, opens in ${k.start}s, open for ${k.duration}s; ${k.buyers} buyers`,
  );

  const watched: Watched = { admin: platform.admin, redis, pg, namespace, name, activityId, startMs, endMs };
  const tally = newTally();
  const payments = newPaymentTally();
  const payRandom = rng(20301112);
  let phase: string | undefined;
  let buyers: Promise<void> | undefined;
  for (;;) {
    const seen = await progress(watched, tally).catch((err: unknown) => {
      say(`progress: ${String(err)}`);
      return phase;
    });
    if (seen !== phase) {
      say(`phase ${phase ?? '-'} → ${seen ?? '-'}`);
      phase = seen;
    }
    if (!buyers && Date.now() >= startMs - 2500) {
      const run = {
        apiUrl: platform.api.url,
        activityId,
        items,
        startMs,
        endMs,
        knobs: k,
        cancelled: isStopping,
      };
      buyers = runBuyers(run, tally);
    }
    if (Date.now() >= startMs) {
      await payRound(pg, platform.afterSale.url, activityId, k, payments, payRandom, phase).catch(
        (err: unknown) => say(`payments: ${String(err)}`),
      );
    }
    if (phase === 'Completed' || phase === 'Failed') break;
    if (Date.now() > endMs + COMPLETION_GRACE_MS) {
      say('the activity did not complete within 2 minutes after its end');
      break;
    }
    await new Promise((r) => setTimeout(r, k.interval * 1000));
  }
  await buyers;
  const metrics = await Promise.all([
    scrapeMetrics('operator', `http://127.0.0.1:${op.port}`),
    ...started.roles.map((r) => scrapeMetrics(r.role, r.metricsUrl)),
  ]);
  if (prometheus) metrics.push(`prometheus ${await prometheusTargets(prometheus)}`);
  const fsa = await getActivity(platform.admin, namespace, name);
  const ok = await summary(redis, pg, {
    fsa,
    activityId,
    items,
    tally,
    payments,
    provider: platform.provider,
    metrics,
  });
  return ok ? 0 : 1;
}

stopOnSignals();
main()
  .then(
    (code) => code,
    (err: unknown) => {
      say(`failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
      for (const r of started.roles)
        process.stdout.write(`--- ${r.role} output ---\n${r.output().slice(-3000)}\n`);
      if (started.operator) process.stdout.write(`--- operator log: ${started.operator.logFile}\n`);
      return 2;
    },
  )
  .then(async (code) => {
    await stopAll();
    process.exit(code);
  });
