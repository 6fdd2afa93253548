// The chart's alert rules under promtool (built from its Go module by test/env/build-promtool.sh):
// the PrometheusRule is rendered with the default values, its groups written as a Prometheus rules
// file, checked with `promtool check rules` and unit-tested with `promtool test rules` against
// alerts.promtool.yaml (each alert fires when it should, stays silent when it should not, with the
// exact labels and rendered annotations).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parse, stringify } from 'yaml';
import {
  alertRules,
  at,
  findObject,
  helmBinary,
  mustRun,
  parseManifests,
  readText,
  renderChart,
  repoRoot,
  run,
} from './chart-helpers.js';

const here = path.join(repoRoot, 'test', 'integration', 'chart');
let promtool = '';
let dir = '';
let rulesFile = '';
let alertCount = 0;

function promtoolBinary(): string {
  // Cached after the first build (a few minutes on 2 cores).
  return (
    mustRun('bash', ['test/env/build-promtool.sh'], { timeoutMs: 1_800_000 }).trim().split('\n').at(-1) ?? ''
  );
}

beforeAll(() => {
  promtool = promtoolBinary();
  dir = mkdtempSync(path.join(tmpdir(), 'flashsale-rules-'));
  const objects = parseManifests(renderChart(helmBinary(), [], ['metrics.prometheusRule.enabled=true']));
  alertCount = alertRules(objects).length;
  rulesFile = path.join(dir, 'flashsale.rules.yaml');
  writeFileSync(rulesFile, stringify({ groups: at(findObject(objects, 'PrometheusRule'), 'spec.groups') }));
}, 1_900_000);

afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('alert rules (promtool)', () => {
  it('pass promtool check rules', () => {
    const out = mustRun(promtool, ['check', 'rules', rulesFile]);
    expect(out).toMatch(new RegExp(`SUCCESS: ${alertCount} rules found`));
  });

  it('pass their unit tests (promtool test rules)', () => {
    const tests = readText(path.join(here, 'alerts.promtool.yaml')).replace(
      '[RENDERED_RULES]',
      JSON.stringify([rulesFile]),
    );
    const testFile = path.join(dir, 'alerts.promtool.yaml');
    writeFileSync(testFile, tests);
    const r = run(promtool, ['test', 'rules', testFile]);
    expect(`${r.stdout}${r.stderr}`).toMatch(/SUCCESS/);
    expect(r.status).toBe(0);
  });

  it('has a unit test for every alert', () => {
    const tested = new Set(
      [...readText(path.join(here, 'alerts.promtool.yaml')).matchAll(/alertname: (\w+)/g)].map((m) => m[1]),
    );
    const rules = parseManifests(renderChart(helmBinary(), [], ['metrics.prometheusRule.enabled=true']));
    for (const rule of alertRules(rules))
      expect([rule.alert, tested.has(rule.alert)]).toEqual([rule.alert, true]);
  });

  it('lets values.schema.json name exactly the alerts of files/alerts/ in disabledAlerts', () => {
    const schema = JSON.parse(readText(path.join(repoRoot, 'charts', 'flashsale', 'values.schema.json'))) as {
      properties: {
        metrics: {
          properties: { prometheusRule: { properties: { disabledAlerts: { items: { enum: string[] } } } } };
        };
      };
    };
    const names = schema.properties.metrics.properties.prometheusRule.properties.disabledAlerts.items.enum;
    const rules = parseManifests(renderChart(helmBinary(), [], ['metrics.prometheusRule.enabled=true']));
    expect([...names].sort()).toEqual(
      alertRules(rules)
        .map((r) => r.alert)
        .sort(),
    );
  });

  it('renders FlashSaleOrderEventsRelayMissing only where the chart runs the after-sale relay, for the release namespace', () => {
    const rendered = (set: string[], namespace?: string) =>
      alertRules(
        parseManifests(
          renderChart(helmBinary(), [], ['metrics.prometheusRule.enabled=true', ...set], namespace),
        ),
      );
    const relayMissing = (rules: ReturnType<typeof rendered>) =>
      rules.find((r) => r.alert === 'FlashSaleOrderEventsRelayMissing');
    const all = rendered([], 'shop-ops');
    expect(relayMissing(all)?.expr).toContain('{namespace="shop-ops", component="runtime-after-sale"}');
    for (const off of [['afterSale.enabled=false'], ['afterSale.replicas=0']]) {
      const rules = rendered(off);
      expect([off, relayMissing(rules)]).toEqual([off, undefined]);
      // Only that alert is left out.
      expect(rules.length).toBe(all.length - 1);
    }
  });

  it("documents every threshold value with its default in docs/install.md's table", () => {
    const thresholds = (
      parse(readText(path.join(repoRoot, 'charts', 'flashsale', 'values.yaml'))) as {
        metrics: { prometheusRule: { thresholds: Record<string, number | string> } };
      }
    ).metrics.prometheusRule.thresholds;
    const page = readText(path.join(repoRoot, 'docs', 'install.md'));
    // Rows `| `a`, `b` | 1, 2 | Alert |`: each value's name and its default, in order.
    const documented = new Map<string, string>();
    for (const [, names, defaults] of page.matchAll(
      /^\| (`[A-Za-z0-9]+`(?:, `[A-Za-z0-9]+`)*) \| ([^|]+) \|/gm,
    )) {
      const keys = [...(names ?? '').matchAll(/`([A-Za-z0-9]+)`/g)].map((m) => m[1]!);
      const values = (defaults ?? '').split(',').map((v) => v.trim().split(' ')[0]!);
      keys.forEach((k, i) => documented.set(k, values[i] ?? ''));
    }
    expect(
      Object.entries(thresholds)
        .filter(([k, v]) => documented.get(k) !== String(v))
        .map(([k, v]) => `${k}=${v}`),
    ).toEqual([]);
  });

  it('promtool rejects a broken rule (the check can fail)', () => {
    const bad = path.join(dir, 'bad.rules.yaml');
    writeFileSync(
      bad,
      stringify({ groups: [{ name: 'g', rules: [{ alert: 'X', expr: 'sum(rate(flashsale_x[5m])' }] }] }),
    );
    const r = run(promtool, ['check', 'rules', bad]);
    expect(r.status).not.toBe(0);
    expect(`${r.stdout}${r.stderr}`).toMatch(/parse error|unclosed|unexpected/i);
  });
});
