// A real Prometheus (Debian's package, test/env/start-prometheus.sh) scrapes the operator and the
// runtime roles (api, relay, consumer with its jobs) every second during an end-to-end sale on the
// test servers: every PromQL expression of the chart's three dashboards returns at least one series
// (or is listed below as expected-empty, with the reason), the chart's rules are loaded and
// evaluate without error, and the alerts see what they exist for:
// - a buyer's order dead-lettered (a defect refuses it): FlashSaleDLQNewDeadLetters fires and
//   FlashSaleDLQUnhandled is raised; once the defect is fixed, `dlq replay` resolves the latter;
// - the relay and the consumer (which runs the gauge jobs) stopped mid-sale: with no runtime pod
//   exporting the backlog, FlashSaleHalfMessageBacklogGrowing is raised from the operator's view,
//   and FlashSaleRuntimeMetricsStale (sampler "none") because the sale is Active;
// - no after-sale pod in the release namespace: FlashSaleOrderEventsRelayMissing is raised, and
//   an after-sale pod scraped there clears it.
// The list of panels with their series count is printed.
//
// Test-only rendering: the rules are the chart's PrometheusRule (default values), except that the
// `for:` of the alerts the test waits for is shortened to 5s, so that they can become
// pending/firing within the test; their expressions are unchanged.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { stringify } from 'yaml';
import { createPool } from '../../../core/db/pool.js';
import { createKafka, ensureTopics, topicsFor } from '../../../core/kafka.js';
import type { Pool } from '../../../core/db/pool.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { runDlqCli } from '../../../runtime/dlq.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { ROOT, httpClient, startRole, tokenFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import {
  at,
  chartDir,
  filesIn,
  findObject,
  helmBinary,
  parseManifests,
  readText,
  renderChart,
} from '../../integration/chart/chart-helpers.js';
import {
  activityBody,
  admin,
  createActivity,
  installCrd,
  prepareNamespace,
  startOperator,
  waitFor,
  waitForPhase,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess } from '../../../dev/operator-harness.js';

const TIMEOUT_MS = 420_000;
const BACKLOG_ALERT = 'FlashSaleHalfMessageBacklogGrowing';
const STALE_ALERT = 'FlashSaleRuntimeMetricsStale';
const NEW_DLQ_ALERT = 'FlashSaleDLQNewDeadLetters';
const UNHANDLED_ALERT = 'FlashSaleDLQUnhandled';
const RELAY_MISSING_ALERT = 'FlashSaleOrderEventsRelayMissing';
/** The namespace the chart is rendered for (renderChart's default): the after-sale role's. */
const RELEASE_NAMESPACE = 'flashsale';
const SHORTENED = [BACKLOG_ALERT, STALE_ALERT, UNHANDLED_ALERT];

/**
 * Queries (panel title and the metric they read) with no series in a clean sale, and why: each is
 * a counter that only gets a series once something goes wrong or times out. Any other query
 * returning nothing fails the test.
 */
const EXPECTED_EMPTY: { panel: string; metric: string; reason: string }[] = [
  {
    panel: 'Relay publish rate',
    metric: 'flashsale_relay_reclaimed_total',
    reason: 'a relay stopped with SIGTERM acknowledges what it read: nothing is left to reclaim',
  },
  {
    panel: 'Consumer retries by reason',
    metric: 'flashsale_consumer_retries_total',
    reason: 'no order write fails in a clean run, so no retry is counted',
  },
  {
    panel: 'Order-gap repairs by action',
    metric: 'flashsale_order_gap_repairs_total',
    reason: 'every reservation reaches PostgreSQL, so no gap is repaired',
  },
  {
    panel: 'Refunds by outcome',
    metric: 'flashsale_refunds_total',
    reason: 'nobody pays in this sale, so nothing is refunded',
  },
  {
    panel: 'Surplus payments by reason',
    metric: 'flashsale_surplus_payments_total',
    reason: 'no payment notification arrives in this sale',
  },
  {
    panel: 'Rate limited (429) by reason',
    metric: 'flashsale_rate_limited_total',
    reason: "the test's buyers stay within the default per-buyer limit",
  },
  {
    panel: 'Shed (503 OVERLOADED) by pod and reason',
    metric: 'flashsale_shed_total',
    reason: 'the api is never overloaded in a clean run',
  },
  {
    panel: '5xx ratio',
    metric: 'flashsale_http_request_duration_seconds_count',
    reason: 'the api answers no request with a 5xx in a clean run',
  },
  {
    panel: 'Payments applied',
    metric: 'flashsale_orders_total',
    reason: 'nobody pays in this sale, so no order becomes PAID',
  },
  {
    panel: 'Cancellations by outcome',
    metric: 'flashsale_cancellations_total',
    reason: 'no buyer cancels in this sale',
  },
  {
    panel: 'Error responses (5xx) by route',
    metric: 'flashsale_http_request_duration_seconds_count',
    reason: 'the api answers no request with a 5xx in a clean run',
  },
];

interface PanelQuery {
  dashboard: string;
  panel: string;
  expr: string;
}

interface Variable {
  name: string;
  metric: string;
  label: string;
}

function dashboardQueries(file: string): { queries: PanelQuery[]; variables: Variable[] } {
  const json = JSON.parse(readText(file)) as {
    panels?: { title?: string; targets?: { expr?: string }[] }[];
    templating?: { list?: { name: string; type?: string; query?: { query?: string } | string }[] };
  };
  const dashboard = path.basename(file, '.json');
  const queries: PanelQuery[] = [];
  for (const p of json.panels ?? []) {
    for (const t of p.targets ?? []) {
      if (t.expr?.trim()) queries.push({ dashboard, panel: p.title ?? '?', expr: t.expr });
    }
  }
  const variables: Variable[] = [];
  for (const v of json.templating?.list ?? []) {
    const q = typeof v.query === 'string' ? v.query : v.query?.query;
    const m = q ? /^label_values\((.*),\s*(\w+)\)$/.exec(q) : null;
    if (m?.[1] && m[2]) variables.push({ name: v.name, metric: m[1], label: m[2] });
  }
  return { queries, variables };
}

interface PromResult {
  metric: Record<string, string>;
}

describe('a real Prometheus during an end-to-end sale', () => {
  const a = admin();
  const activity = uniqueId('prom');
  let stateDir = '';
  let promUrl = '';
  let targetsDir = '';
  let db: FreshDatabase;
  let pg: Pool;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;
  const roles: RoleProcess[] = [];
  let relay: RoleProcess | undefined;
  let consumer: RoleProcess | undefined;
  let afterSale: RoleProcess | undefined;
  // The reconciliation job every 5 s instead of 5 min, so that its panel has data in the test;
  // a 15 s payment window (the activity's too), so that the unpaid orders close and the sale
  // settles and completes within the test.
  const roleEnv = {
    RECONCILIATION_CRON: '*/5 * * * * *',
    PAYMENT_TIMEOUT_SECONDS: '15',
    PAYMENT_SWEEP_CRON: '*/2 * * * * *',
  };

  const prom = async (api: string, params: Record<string, string> = {}): Promise<unknown> => {
    const r = await fetch(`${promUrl}/api/v1/${api}?${new URLSearchParams(params).toString()}`);
    const body = (await r.json()) as { status: string; data: unknown; error?: string };
    if (body.status !== 'success') throw new Error(`${api}: ${body.error ?? r.status}`);
    return body.data;
  };

  const writeTargets = (): void => {
    const targets = [
      ...(operator ? [{ port: operator.port, pod: operator.identity }] : []),
      // The roles serve /metrics on their metrics port only (never the buyer port).
      ...roles.map((r) => ({
        port: Number(new URL(r.metricsUrl).port),
        pod: `${activity}-${r.role}`,
        namespace: ns.namespace,
      })),
      // The platform's after-sale pod lives in the release namespace, as the chart deploys it.
      ...(afterSale
        ? [
            {
              port: Number(new URL(afterSale.metricsUrl).port),
              pod: 'flashsale-after-sale-0',
              namespace: RELEASE_NAMESPACE,
            },
          ]
        : []),
    ];
    writeFileSync(
      path.join(targetsDir, 'flashsale.json'),
      JSON.stringify(
        targets.map((t) => ({
          targets: [`127.0.0.1:${t.port}`],
          labels: { namespace: 'namespace' in t ? t.namespace : ns.namespace, pod: t.pod },
        })),
      ),
    );
  };

  beforeAll(async () => {
    stateDir = mkdtempSync(path.join(tmpdir(), 'flashsale-prom-'));
    const started = spawnSync('bash', [path.join(ROOT, 'test', 'env', 'start-prometheus.sh'), stateDir], {
      encoding: 'utf8',
    });
    if (started.status !== 0) throw new Error(`start-prometheus.sh failed:\n${started.stderr}`);
    const env = Object.fromEntries(
      readText(path.join(stateDir, 'prometheus.env'))
        .trim()
        .split('\n')
        .map((l) => l.split('=', 2) as [string, string]),
    );
    promUrl = env.PROMETHEUS_URL ?? '';
    targetsDir = env.PROMETHEUS_TARGETS_DIR ?? '';

    // The chart's rules, with the `for:` of the alerts waited for shortened (see the header).
    const objects = parseManifests(renderChart(helmBinary(), [], ['metrics.prometheusRule.enabled=true']));
    const groups = at(findObject(objects, 'PrometheusRule'), 'spec.groups') as {
      rules: Record<string, unknown>[];
    }[];
    for (const g of groups) for (const r of g.rules) if (SHORTENED.includes(String(r.alert))) r.for = '5s';
    writeFileSync(path.join(env.PROMETHEUS_RULES_DIR ?? '', 'flashsale.yaml'), stringify({ groups }));
    await fetch(`${promUrl}/-/reload`, { method: 'POST' });

    await installCrd(a);
    db = await freshDatabase();
    pg = createPool(db.url, 2);
    ns = await prepareNamespace(uniqueId('op-prom'), a);
    // The consumer subscribes at start: the topics exist first (the operator finds them there).
    const kadmin = createKafka(testEnv().kafkaBrokers, activity).admin();
    await kadmin.connect();
    await ensureTopics(kadmin, topicsFor(activity), 2, 1);
    await kadmin.disconnect();
    const [op, api, rel, con] = await Promise.all([
      startOperator({ ns, databaseUrl: db.url }),
      startRole('api', { activityId: activity, databaseUrl: db.url, env: roleEnv }),
      startRole('relay', { activityId: activity, databaseUrl: db.url, env: roleEnv, waitReady: false }),
      startRole('consumer', { activityId: activity, databaseUrl: db.url, env: roleEnv, waitReady: false }),
    ]);
    operator = op;
    relay = rel;
    consumer = con;
    roles.push(api, rel, con);
    writeTargets();
  }, TIMEOUT_MS);

  afterAll(async () => {
    await Promise.all([...roles, ...(afterSale ? [afterSale] : [])].map((r) => r.stop()));
    await operator?.kill('SIGTERM');
    await pg?.end();
    await db?.drop();
    if (stateDir) spawnSync('bash', [path.join(ROOT, 'test', 'env', 'env-down.sh'), stateDir]);
  }, TIMEOUT_MS);

  type Alert = { labels: Record<string, string>; state: string };
  const alerts = async (name: string): Promise<Alert[]> =>
    ((await prom('alerts')) as { alerts: Alert[] }).alerts.filter(
      (x) => x.labels.alertname === name && x.labels.activity === activity,
    );

  it(
    'answers every dashboard query, loads the rules and raises the DLQ, backlog and stale-metrics alerts',
    async () => {
      const t0 = Date.now();
      const startAt = new Date(t0 + 12_000);
      await createActivity(
        a,
        activityBody(ns.namespace, activity, {
          warmUpAt: new Date(t0 + 2_000),
          startAt,
          endAt: new Date(startAt.getTime() + 150_000),
          items: [
            { skuId: 'rice', name: '五常大米 5kg', price: '59.90', stock: 400, limitPerUser: 1 },
            { skuId: 'tea', name: '西湖龙井礼盒', price: '199.00', stock: 5, limitPerUser: 1 },
          ],
          extraSpec: { activityId: activity, payment: { timeout: '15s' } },
          drainTimeout: '60s',
        }),
      );
      await waitForPhase(a, ns.namespace, activity, Phase.Active, 120_000);

      const http = httpClient(8);
      const api = roles.find((r) => r.role === 'api');
      const url = `${api?.url ?? ''}/v1/activities/${activity}/orders`;
      const buy = async (user: string, skuId: string): Promise<number> =>
        (await http.post(url, { skuId, quantity: 1, requestId: `${user}-1` }, await tokenFor(user))).status;
      // Demand beyond the small SKU's stock (sold-out answers) and orders through the pipeline.
      const first = await Promise.all(
        Array.from({ length: 30 }, (_, i) => buy(`b-${i}`, i % 3 === 0 ? 'tea' : 'rice')),
      );
      expect(first.filter((s) => s === 202).length).toBeGreaterThan(0);
      expect(first.filter((s) => s === 409).length).toBeGreaterThan(0);

      // A defect refuses one buyer's order for good: the consumer dead-letters it.
      await pg.query(`ALTER TABLE orders ADD CONSTRAINT prom_dlq_defect CHECK (user_id <> 'dlq-buyer')`);
      expect(await buy('dlq-buyer', 'rice')).toBe(202);
      await waitFor(
        `${NEW_DLQ_ALERT} firing and ${UNHANDLED_ALERT} raised`,
        async () =>
          (await alerts(NEW_DLQ_ALERT)).some((x) => x.state === 'firing') &&
          (await alerts(UNHANDLED_ALERT)).length > 0,
        90_000,
        1_000,
      );
      // The defect is fixed and the dead letter replayed with the shipped command: the replay moves
      // the handled offset, and the unhandled alert resolves (the topic's depth does not change).
      await pg.query('ALTER TABLE orders DROP CONSTRAINT prom_dlq_defect');
      const replayed: string[] = [];
      expect(
        await runDlqCli(
          ['replay', '--all', '--activity', activity],
          { KAFKA_BROKERS: testEnv().kafkaBrokers.join(',') },
          (l) => replayed.push(l),
        ),
      ).toBe(0);
      expect(replayed.join('\n')).toContain('0 message(s) not handled');
      await waitFor(
        `${UNHANDLED_ALERT} resolved`,
        async () => (await alerts(UNHANDLED_ALERT)).length === 0,
        60_000,
        1_000,
      );
      await waitFor(
        "the replayed buyer's order",
        async () => (await pg.query(`SELECT 1 FROM orders WHERE user_id = 'dlq-buyer'`)).rowCount === 1,
      );

      // The relay and the consumer (with the gauge jobs) stop: reservations keep coming, half
      // messages pile up in the outbox, and no runtime pod exports the backlog or any sampler.
      await Promise.all([relay?.stop(), consumer?.stop()]);
      let n = 0;
      // Each buyer's answer, checked after the wait: waitFor retries a probe that throws, so an
      // expect inside it would let a refused buyer pass as long as a later one got through.
      const answers: number[] = [];
      const [alert, stale] = await waitFor(
        `${BACKLOG_ALERT} and ${STALE_ALERT} pending or firing`,
        async () => {
          n += 1;
          answers.push(await buy(`late-${n}`, 'rice'));
          const backlog = (await alerts(BACKLOG_ALERT))[0];
          const none = (await alerts(STALE_ALERT)).find((x) => x.labels.sampler === 'none');
          return backlog && none ? ([backlog, none] as [Alert, Alert]) : undefined;
        },
        90_000,
        1_000,
      ).catch(async (err: unknown) => {
        // What Prometheus saw, for the post-mortem.
        const seen: string[] = [];
        for (const q of [
          `flashsale_sampler_last_success_timestamp_seconds{activity="${activity}"}`,
          `flashsale_outbox_half_messages{activity="${activity}"}`,
          `flashsale_activity_half_messages{activity="${activity}"}`,
          `flashsale_activity_phase{activity="${activity}"} == 1`,
          'flashsale_leader',
          'ALERTS',
        ]) {
          const data = (await prom('query', { query: q })) as { result: unknown[] };
          seen.push(`${q}: ${JSON.stringify(data.result)}`);
        }
        throw new Error(`${String(err)}\n${seen.join('\n')}`);
      });
      expect(answers.filter((s) => s !== 202)).toEqual([]);
      expect(['pending', 'firing']).toContain(alert.state);
      expect(['pending', 'firing']).toContain(stale.state);
      expect(stale.labels.name).toBe(activity);

      // The relay and the consumer come back; the backlog drains and the sale completes.
      const [back, backConsumer] = await Promise.all([
        startRole('relay', { activityId: activity, databaseUrl: db.url, waitReady: false }),
        startRole('consumer', { activityId: activity, databaseUrl: db.url, env: roleEnv, waitReady: false }),
      ]);
      roles.splice(roles.indexOf(relay as RoleProcess), 1, back);
      roles.splice(roles.indexOf(consumer as RoleProcess), 1, backConsumer);
      writeTargets();
      await waitForPhase(a, ns.namespace, activity, Phase.Completed, 180_000);
      await http.close();

      // No after-sale pod in the release namespace reports the order-event backlog (the sale's own
      // relay, in its consumer, does not count): FlashSaleOrderEventsRelayMissing is raised. An
      // after-sale pod scraped there, its relay sampling, clears it.
      const relayMissing = async (): Promise<Alert[]> =>
        ((await prom('alerts')) as { alerts: Alert[] }).alerts.filter(
          (x) => x.labels.alertname === RELAY_MISSING_ALERT && x.labels.namespace === RELEASE_NAMESPACE,
        );
      expect((await relayMissing()).map((x) => x.state)).toEqual([
        expect.stringMatching(/^(pending|firing)$/),
      ]);
      afterSale = await startRole('after-sale', { databaseUrl: db.url, env: roleEnv });
      writeTargets();
      await waitFor(
        `${RELAY_MISSING_ALERT} resolved`,
        async () => (await relayMissing()).length === 0,
        60_000,
        1_000,
      );
      // A few more scrapes after the end, so the last values are in.
      await new Promise((r) => setTimeout(r, 3_000));

      // Rules: every rule of the chart loaded and evaluated without error.
      const rules = (await prom('rules')) as {
        groups: { rules: { name: string; type: string; health: string; lastError?: string }[] }[];
      };
      const loaded = rules.groups.flatMap((g) => g.rules);
      const alertFiles = filesIn(path.join(chartDir, 'files', 'alerts'), /\.yaml$/).map((f) =>
        path.basename(f, '.yaml'),
      );
      expect(
        loaded
          .filter((r) => r.type === 'alerting')
          .map((r) => r.name)
          .sort(),
      ).toEqual(alertFiles.sort());
      expect(loaded.filter((r) => r.health !== 'ok')).toEqual([]);

      // Every dashboard query over the sale's window, its variables resolved as Grafana would.
      const end = Date.now() / 1000;
      const range = { start: String(t0 / 1000), end: String(end), step: '2' };
      const lines: string[] = [];
      const empty: string[] = [];
      for (const file of filesIn(path.join(chartDir, 'files', 'dashboards'), /\.json$/)) {
        const { queries, variables } = dashboardQueries(file);
        const values: Record<string, string> = {};
        for (const v of variables) {
          const metric = v.metric.replace(/\$(\w+)/g, (_m, name: string) => values[name] ?? '.*');
          const series = (await prom('series', {
            'match[]': metric,
            start: range.start,
            end: range.end,
          })) as Record<string, string>[];
          const found = [...new Set(series.map((s) => s[v.label]).filter((x): x is string => Boolean(x)))];
          expect([file, v.name, found.length > 0]).toEqual([file, v.name, true]);
          values[v.name] = found.join('|');
        }
        for (const q of queries) {
          const expr = q.expr
            .replaceAll('$__rate_interval', '15s')
            .replaceAll('$__range', '2m')
            .replace(/\$(\w+)/g, (_m, name: string) => values[name] ?? '.*');
          const data = (await prom('query_range', { query: expr, ...range })) as { result: PromResult[] };
          const count = data.result.length;
          const reason = EXPECTED_EMPTY.find((e) => e.panel === q.panel && q.expr.includes(e.metric))?.reason;
          lines.push(
            `${String(count).padStart(3)}  ${q.dashboard} / ${q.panel}${count === 0 && reason ? ` (expected empty: ${reason})` : ''}`,
          );
          if (count === 0 && !reason) empty.push(`${q.dashboard} / ${q.panel}: ${q.expr}`);
        }
      }
      console.log(`series per dashboard query during the sale:\n${lines.join('\n')}`);
      expect(empty).toEqual([]);
    },
    TIMEOUT_MS,
  );
});
