// The metrics contract: every metric (and every matcher label) that a Grafana dashboard or an alert
// rule of the chart uses is exported by the code. The exported set is read from the running
// registries of core/metrics.ts (createMetrics for the runtime, createOperatorMetrics for the
// operator) after observing each metric once, so histogram series (_bucket/_sum/_count) and the
// default process metrics (flashsale_process_*) are there exactly as Prometheus would scrape them.
import path from 'node:path';
import { createMetrics, createOperatorMetrics } from '../../../core/metrics.js';
import {
  alertRules,
  chartDir,
  filesIn,
  helmBinary,
  parseManifests,
  readText,
  renderChart,
  scrapedMetrics,
} from './chart-helpers.js';
import { TARGET_LABELS, contractViolations, selectors } from './promql.js';

interface Query {
  source: string;
  expr: string;
}

async function exportedMetrics(): Promise<Map<string, Set<string>>> {
  // A process serving one activity: its series all carry the activity id (default label).
  const runtime = createMetrics('api', 'shop.s1-aaaaaaaa');
  const operator = createOperatorMetrics();
  const all = new Map<string, Set<string>>();
  for (const registry of [runtime.registry, operator.registry]) {
    for (const [name, labels] of await scrapedMetrics(registry)) {
      all.set(name, new Set([...(all.get(name) ?? []), ...labels]));
    }
  }
  return all;
}

/** Every PromQL string of a Grafana dashboard: panel targets and templating variable queries. */
function dashboardQueries(file: string): Query[] {
  const queries: Query[] = [];
  const name = path.basename(file);
  const walk = (node: unknown, where: string): void => {
    if (Array.isArray(node)) {
      node.forEach((n, i) => walk(n, `${where}[${i}]`));
      return;
    }
    if (typeof node !== 'object' || node === null) return;
    const obj = node as Record<string, unknown>;
    if (typeof obj.expr === 'string' && obj.expr.trim() !== '')
      queries.push({ source: `${name} ${where}`, expr: obj.expr });
    if (obj.type === 'query' && 'query' in obj) {
      const q = obj.query;
      const expr = typeof q === 'string' ? q : (q as { query?: unknown } | null)?.query;
      if (typeof expr === 'string') queries.push({ source: `${name} variable ${String(obj.name)}`, expr });
    }
    for (const [key, value] of Object.entries(obj)) walk(value, `${where}.${key}`);
  };
  walk(JSON.parse(readText(file)), '');
  return queries;
}

const dashboards = filesIn(path.join(chartDir, 'files', 'dashboards'), /\.json$/);
let exported = new Map<string, Set<string>>();
let alertQueries: Query[] = [];

beforeAll(async () => {
  exported = await exportedMetrics();
  const rendered = renderChart(helmBinary(), [], ['metrics.prometheusRule.enabled=true']);
  alertQueries = alertRules(parseManifests(rendered)).map((r) => ({
    source: `alert ${r.alert}`,
    expr: r.expr,
  }));
}, 900_000);

describe('metrics contract: dashboards and alerts use only metrics the code exports', () => {
  it('reads the exported metrics from the registries (histogram series and process metrics included)', () => {
    expect(exported.has('flashsale_reservations_total')).toBe(true);
    expect(exported.has('flashsale_http_request_duration_seconds_bucket')).toBe(true);
    expect(exported.get('flashsale_http_request_duration_seconds_bucket')).toContain('le');
    expect(exported.has('flashsale_activity_phase')).toBe(true);
    expect([...exported.keys()].filter((n) => n.startsWith('flashsale_process_')).length).toBeGreaterThan(5);
    expect(exported.get('flashsale_activity_phase')).toEqual(
      new Set(['activity', 'name', 'namespace', 'phase', 'component']),
    );
  });

  it('has three dashboards with queries', () => {
    expect(dashboards.map((f) => path.basename(f)).sort()).toEqual([
      'flashsale-operator.json',
      'flashsale-order-pipeline.json',
      'flashsale-sale-overview.json',
    ]);
    for (const file of dashboards) expect(dashboardQueries(file).length).toBeGreaterThan(5);
  });

  it.each(dashboards.map((f) => [path.basename(f), f]))('dashboard %s', (_name, file) => {
    const queries = dashboardQueries(file);
    expect(contractViolations(queries, exported)).toEqual([]);
  });

  it("no runtime metric has a label Prometheus sets on its targets (the runtime's PodMonitor does not honour a pod's labels)", async () => {
    const runtime = await scrapedMetrics(createMetrics('api', 'shop.s1-aaaaaaaa').registry);
    const clashes = [...runtime].flatMap(([name, labels]) =>
      [...labels].filter((l) => TARGET_LABELS.includes(l)).map((l) => `${name}{${l}}`),
    );
    expect(clashes).toEqual([]);
  });

  it('alert rules', () => {
    expect(alertQueries.length).toBeGreaterThanOrEqual(7);
    expect(contractViolations(alertQueries, exported)).toEqual([]);
  });

  it('covers the metric names of the contract (each is used by a dashboard or an alert)', () => {
    const used = new Set(
      [...dashboards.flatMap(dashboardQueries), ...alertQueries].flatMap((q) =>
        selectors(q.expr).map((s) => s.metric),
      ),
    );
    for (const name of [
      'flashsale_outbox_half_messages',
      'flashsale_outbox_oldest_age_seconds',
      'flashsale_relay_published_total',
      'flashsale_consumer_retries_total',
      'flashsale_consumer_lag',
      'flashsale_dlq_depth',
      'flashsale_order_gap',
      'flashsale_reservations_total',
      'flashsale_stock_remaining',
      'flashsale_orders_total',
      'flashsale_http_request_duration_seconds_bucket',
      'flashsale_activity_phase',
      'flashsale_reconcile_total',
      'flashsale_reconcile_errors_total',
      'flashsale_reconcile_duration_seconds_bucket',
      'flashsale_workqueue_depth',
      'flashsale_refunds_total',
      'flashsale_refund_pending_oldest_age_seconds',
      'flashsale_order_events_published_total',
      'flashsale_surplus_payments_total',
      'flashsale_stock_returns_total',
      'flashsale_reconciliation_mismatch',
      'flashsale_dlq_unhandled',
      'flashsale_dlq_messages_total',
      'flashsale_sampler_last_success_timestamp_seconds',
      'flashsale_activity_schedule_timestamp_seconds',
      'flashsale_activity_replicas',
      'flashsale_activity_oldest_half_message_age_seconds',
      'flashsale_activity_order_gap',
      'flashsale_activity_consumer_lag',
      'flashsale_activity_half_messages',
      'flashsale_orders_stored',
    ]) {
      expect(used).toContain(name);
    }
  });
});

describe('the contract check itself fails when it should', () => {
  const q = (expr: string): Query[] => [{ source: 'test', expr }];

  it('reports a misspelled metric name', () => {
    expect(contractViolations(q('sum(rate(flashsale_reservation_total[5m]))'), exported)).toEqual([
      'test: metric flashsale_reservation_total is not exported by core/metrics.ts',
    ]);
    expect(
      contractViolations(
        q('histogram_quantile(0.9, rate(flashsale_http_request_duration_bucket[5m]))'),
        exported,
      ),
    ).toHaveLength(1);
  });

  it('reports a label the metric does not have, and an unknown function', () => {
    expect(contractViolations(q('flashsale_dlq_depth{sku="a"}'), exported)).toHaveLength(1);
    expect(contractViolations(q('rat(flashsale_relay_published_total[5m])'), exported)[0]).toMatch(
      /unknown function rat/,
    );
  });

  it('finds metrics but not labels, functions, keywords, variables or strings', () => {
    const found = selectors(
      'sum by (namespace, activity) (rate(flashsale_orders_total{activity=~"$activity", status="x"}[$__rate_interval] offset 5m))' +
        ' / on (activity) group_left (sku) max without (pod) (flashsale_stock_remaining) > bool 0.5' +
        ' and label_replace(flashsale_order_gap, "dst", "$1", "src", "(.*)") or vector(0)',
    );
    expect(found).toEqual([
      { metric: 'flashsale_orders_total', labels: ['activity', 'status'] },
      { metric: 'flashsale_stock_remaining', labels: [] },
      { metric: 'flashsale_order_gap', labels: [] },
    ]);
    expect(
      selectors('label_values(flashsale_reservations_total{namespace=~"$namespace"}, activity)'),
    ).toEqual([{ metric: 'flashsale_reservations_total', labels: ['namespace', 'activity'] }]);
  });
});
