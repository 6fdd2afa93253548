// The Grafana dashboards name a sale by one identity. Every selector of a per-activity metric (one
// that carries an `activity` label: the operator's per-activity series, and every series of a
// runtime process serving one activity) filters by `activity=~"$activity"`, the activity id, and
// none selects by the resource's `name`; the variables come from the operator's phase series, which
// exist from the operator's first pass (before the first reservation). The Sale overview opens with
// the golden signals, their thresholds equal to the alerts' defaults (values.yaml), a colour per
// phase, and a stock stat that is not red at 0. The label sets are read from the registries of
// core/metrics.ts, as the metrics contract does.
import path from 'node:path';
import client from 'prom-client';
import { parse } from 'yaml';
import { createMetrics, createOperatorMetrics } from '../../../core/metrics.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { chartDir, filesIn, readText } from './chart-helpers.js';
import { exposition, selectors } from './promql.js';

interface Target {
  expr?: string;
}
interface Panel {
  type: string;
  title?: string;
  gridPos: { x: number; y: number; w: number; h: number };
  targets?: Target[];
  fieldConfig?: {
    defaults?: {
      thresholds?: { steps: { color: string; value: number | null }[] };
      mappings?: { options: Record<string, { text: string; color: string }> }[];
    };
  };
}
interface Dashboard {
  panels: Panel[];
  templating: { list: { name: string; query?: { query?: string } | string }[] };
  annotations: { list: { expr?: string; name: string }[] };
}

const dashboards = filesIn(path.join(chartDir, 'files', 'dashboards'), /\.json$/);
const load = (file: string): Dashboard => JSON.parse(readText(file)) as Dashboard;
const overview = load(path.join(chartDir, 'files', 'dashboards', 'flashsale-sale-overview.json'));
const IDENTITY = 'activity=~"$activity"';

function observeAll(registry: client.Registry): void {
  for (const metric of registry.getMetricsAsArray()) {
    const names: unknown = Reflect.get(metric, 'labelNames');
    const labels: Record<string, string> = {};
    if (Array.isArray(names)) for (const n of names) labels[String(n)] = 'x';
    if (metric instanceof client.Counter) metric.inc(labels, 1);
    else if (metric instanceof client.Gauge) metric.set(labels, 1);
    else if (metric instanceof client.Histogram) metric.observe(labels, 0.01);
  }
}

/** Metric name → labels, for the runtime (a process serving one activity) and the operator. */
async function labelSets(): Promise<{
  runtime: Map<string, Set<string>>;
  operator: Map<string, Set<string>>;
  afterSale: Map<string, Set<string>>;
}> {
  const runtime = createMetrics('runtime-api', 'shop.s1-aaaaaaaa');
  const operator = createOperatorMetrics();
  // The platform after-sale role serves every activity: no activity id among its default labels.
  const afterSale = createMetrics('runtime-after-sale');
  observeAll(runtime.registry);
  observeAll(operator.registry);
  observeAll(afterSale.registry);
  return {
    runtime: exposition(await runtime.registry.metrics()),
    operator: exposition(await operator.registry.metrics()),
    afterSale: exposition(await afterSale.registry.metrics()),
  };
}

/** Every query of a dashboard: panel targets and annotations (where they were written). */
function queries(file: string): { where: string; expr: string }[] {
  const d = load(file);
  const name = path.basename(file);
  return [
    ...d.panels.flatMap((p) =>
      (p.targets ?? [])
        .filter((t) => t.expr?.trim())
        .map((t) => ({ where: `${name} / ${p.title}`, expr: t.expr! })),
    ),
    ...d.annotations.list
      .filter((a) => a.expr)
      .map((a) => ({ where: `${name} / annotation ${a.name}`, expr: a.expr! })),
  ];
}

/** Selectors that do not name the sale by its activity id (or that select by the resource name). */
function identityViolations(
  list: { where: string; expr: string }[],
  sets: {
    runtime: Map<string, Set<string>>;
    operator: Map<string, Set<string>>;
    afterSale: Map<string, Set<string>>;
  },
): string[] {
  const out: string[] = [];
  for (const q of list) {
    for (const s of selectors(q.expr, true)) {
      const block = s.block ?? '';
      // A selector pinned to the operator's own series reads the operator's registry.
      // One pinned to the after-sale role's reads its registry (series of every activity, no id).
      const set = /component="operator"/.test(block)
        ? sets.operator.get(s.metric)
        : /component="runtime-after-sale"/.test(block)
          ? sets.afterSale.get(s.metric)
          : (sets.operator.get(s.metric) ?? sets.runtime.get(s.metric));
      if (s.labels.includes('name')) out.push(`${q.where}: ${s.metric} selects by the resource name`);
      if (set?.has('activity') && !block.includes(IDENTITY))
        out.push(`${q.where}: ${s.metric} without ${IDENTITY}`);
    }
  }
  return out;
}

let sets: Awaited<ReturnType<typeof labelSets>>;

beforeAll(async () => {
  sets = await labelSets();
});

describe('dashboards: one activity identity', () => {
  it('runtime and operator series both carry `activity` (the id); the operator adds `name`', () => {
    expect(sets.runtime.get('flashsale_http_request_duration_seconds_bucket')).toContain('activity');
    expect(sets.runtime.get('flashsale_process_cpu_seconds_total')).toContain('activity');
    expect(sets.operator.get('flashsale_activity_phase')).toEqual(
      new Set(['activity', 'name', 'namespace', 'phase', 'component']),
    );
    expect(sets.operator.get('flashsale_leader')?.has('activity')).toBe(false);
  });

  it.each(dashboards.map((f) => [path.basename(f), f]))(
    'every query of %s names the sale by its activity id',
    (_name, file) => {
      expect(queries(file).length).toBeGreaterThan(5);
      expect(identityViolations(queries(file), sets)).toEqual([]);
    },
  );

  // The platform after-sale role runs in the release namespace and serves every activity: after
  // Completed it alone exports these, with the release's namespace, not the activity's, which the
  // $namespace variable lists. The activity id names the sale (its namespace included).
  const AFTER_SALE_METRICS = [
    // Payments (orders PAID), timeout closures and cancellations after Completed.
    'flashsale_orders_total',
    'flashsale_orders_closed_total',
    'flashsale_cancellations_total',
    'flashsale_refunds_total',
    'flashsale_refunds_failed',
    'flashsale_refund_pending_oldest_age_seconds',
    'flashsale_surplus_payments_total',
    'flashsale_stock_returns_total',
    'flashsale_order_events_published_total',
    'flashsale_order_events_unpublished',
    'flashsale_order_events_oldest_unpublished_age_seconds',
  ];
  it.each(dashboards.map((f) => [path.basename(f), f]))(
    '%s does not filter what the after-sale role exports by the activity namespace',
    (_name, file) => {
      const filtered = queries(file).flatMap((q) =>
        selectors(q.expr, true)
          .filter((s) => AFTER_SALE_METRICS.includes(s.metric) && s.labels.includes('namespace'))
          .map((s) => `${q.where}: ${s.metric}`),
      );
      expect(filtered).toEqual([]);
    },
  );

  // What the after-sale role exports with no activity id (platform-wide figures, such as the order
  // events' outbox): a query filtering it by the id alone shows nothing once the sale's own
  // processes are gone (after Completed), when that role alone exports it.
  it.each(dashboards.map((f) => [path.basename(f), f]))(
    '%s reads what the after-sale role exports without an activity id',
    (_name, file) => {
      const platformWide = AFTER_SALE_METRICS.filter((m) => {
        const labels = sets.afterSale.get(m);
        return labels !== undefined && !labels.has('activity');
      });
      expect(platformWide.length).toBeGreaterThan(0);
      const blind = queries(file).flatMap((q) => {
        const of = selectors(q.expr, true).filter((s) => platformWide.includes(s.metric));
        const reads = of.some((s) => !(s.block ?? '').includes('activity='));
        return of.length > 0 && !reads ? [`${q.where}: ${of[0]!.metric}`] : [];
      });
      expect(blind).toEqual([]);
    },
  );

  // Those series are selected by the activity id alone: "All" activities must mean the activities
  // of the selected namespaces (the variable's own list), never every activity (allValue `.*`).
  it.each(dashboards.map((f) => [path.basename(f), f]))(
    "%s: All activities are the selected namespaces' activities",
    (_name, file) => {
      const activity = load(file).templating.list.find((v) => v.name === 'activity');
      expect(activity).toBeDefined();
      expect((activity as { allValue?: unknown }).allValue).toBeUndefined();
    },
  );

  it('the check fails on a query without the identity or by resource name', () => {
    const bad = [
      { where: 'x', expr: 'sum(rate(flashsale_reservations_total{namespace=~"$namespace"}[5m]))' },
      { where: 'y', expr: 'flashsale_activity_phase{name=~"$activity"}' },
      { where: 'z', expr: 'max by (pod) (flashsale_leader{component="operator"})' },
    ];
    expect(identityViolations(bad, sets)).toEqual([
      `x: flashsale_reservations_total without ${IDENTITY}`,
      'y: flashsale_activity_phase selects by the resource name',
      `y: flashsale_activity_phase without ${IDENTITY}`,
    ]);
  });

  it.each(dashboards.map((f) => [path.basename(f), f]))(
    '%s takes its variables from the operator phase series (there before the first reservation)',
    (_name, file) => {
      const vars = Object.fromEntries(
        load(file).templating.list.map((v) => [
          v.name,
          typeof v.query === 'string' ? v.query : v.query?.query,
        ]),
      );
      expect(vars.namespace).toBe('label_values(flashsale_activity_phase, namespace)');
      expect(vars.activity).toBe('label_values(flashsale_activity_phase{namespace=~"$namespace"}, activity)');
    },
  );
});

describe('sale overview', () => {
  const byTitle = new Map(overview.panels.map((p) => [p.title ?? '', p]));
  const thresholds = (
    parse(readText(path.join(chartDir, 'values.yaml'))) as {
      metrics: { prometheusRule: { thresholds: Record<string, number | string> } };
    }
  ).metrics.prometheusRule.thresholds;
  const redAt = (title: string): number | null | undefined =>
    byTitle.get(title)?.fieldConfig?.defaults?.thresholds?.steps.find((s) => s.color === 'red')?.value;

  it('opens with the golden signals, before any other row', () => {
    const firstRows = overview.panels.filter((p) => p.type === 'row');
    expect(firstRows[0]?.title).toBe('Golden signals');
    const end = firstRows[1]?.gridPos.y ?? 0;
    expect(overview.panels.filter((p) => p.type !== 'row' && p.gridPos.y < end).map((p) => p.title)).toEqual([
      'Reservations/s by result',
      '5xx ratio',
      'Reserve p99 (accepted reservations)',
      'Oldest half message',
      'Consumer lag',
      'Order gap',
      'New dead letters',
    ]);
  });

  it("draws the alerts' thresholds (the chart's defaults)", () => {
    expect(redAt('5xx ratio')).toBe(thresholds.apiErrorRatio);
    expect(redAt('Reserve p99 (accepted reservations)')).toBe(thresholds.reserveP99Seconds);
    expect(redAt('Oldest half message')).toBe(thresholds.oldestHalfMessageSeconds);
    expect(redAt('Consumer lag')).toBe(thresholds.consumerLag);
    expect(redAt('Oldest runtime sample')).toBe(thresholds.staleMetricsSeconds);
    expect(redAt('Order gap')).toBe(1);
    expect(redAt('New dead letters')).toBe(1);
  });

  it("draws FlashSaleRedisMemoryHigh's threshold on the order pipeline's Redis memory", () => {
    const pipeline = load(path.join(chartDir, 'files', 'dashboards', 'flashsale-order-pipeline.json'));
    const panel = pipeline.panels.find((p) => p.title === 'Redis memory (fullest primary)');
    expect(panel?.fieldConfig?.defaults?.thresholds?.steps.find((s) => s.color === 'red')?.value).toBe(
      thresholds.redisMemoryRatio,
    );
    expect(panel?.targets?.[0]?.expr).toContain('flashsale_redis_memory_max_bytes');
  });

  it('leaves probes and the sold-out fast path out of the reserve latency', () => {
    const expr = byTitle.get('Reserve p99 (accepted reservations)')?.targets?.[0]?.expr ?? '';
    expect(expr).toContain('route="/v1/activities/:activityId/orders", method="POST", code="202"');
    expect(byTitle.get('Latency quantiles')?.targets?.[0]?.expr).toContain(
      'route!~"/healthz|/readyz|/metrics"',
    );
  });

  it('colours each phase differently on the timeline', () => {
    const options = byTitle.get('Phase timeline')?.fieldConfig?.defaults?.mappings?.[0]?.options ?? {};
    const texts = Object.values(options).map((o) => o.text);
    expect(texts.sort()).toEqual(Object.values(Phase).sort());
    expect(new Set(Object.values(options).map((o) => o.color)).size).toBe(Object.values(Phase).length);
  });

  it('does not paint the stock red at 0 (sold out is the goal of a sale)', () => {
    const stock = byTitle.get('Stock remaining')?.fieldConfig?.defaults;
    expect(stock?.thresholds?.steps.map((s) => s.color)).not.toContain('red');
    expect(stock?.mappings?.[0]?.options['0']).toEqual({ text: 'sold out', color: 'blue', index: 0 });
  });

  it('has an after-sale row and phase annotations', () => {
    for (const t of [
      'Orders in PostgreSQL by status',
      'Payments applied',
      'Stock returns by destination',
      'Cancellations by outcome',
      'Reconciliation runs by result',
    ])
      expect([t, byTitle.has(t)]).toEqual([t, true]);
    expect(overview.annotations.list.find((a) => a.name === 'Phase changes')?.expr).toContain(
      'flashsale_activity_phase',
    );
  });
});
