// Where the demo's processes serve /metrics, and DEMO_PROMETHEUS=1: Prometheus (Debian's package,
// test/env/start-prometheus.sh) scraping the operator and the roles every second, as in
// test/e2e/prometheus/; stopped with the demo.
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ENV_DIR, started } from './servers.js';

/** Starts Prometheus with the targets and returns its URL. */
export function startPrometheus(namespace: string, targets: { pod: string; port: number }[]): string {
  const state = `/tmp/flashsale-demo-prometheus-${process.pid}`;
  const run = spawnSync('bash', [join(ENV_DIR, 'start-prometheus.sh'), state], { encoding: 'utf8' });
  started.closers.push(() => {
    spawnSync('bash', [join(ENV_DIR, 'env-down.sh'), state], { stdio: 'ignore', timeout: 30_000 });
  });
  if (run.status !== 0) throw new Error(`start-prometheus.sh failed: ${run.stderr}`);
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
export async function prometheusTargets(url: string): Promise<string> {
  try {
    const r = await fetch(`${url}/api/v1/query?query=${encodeURIComponent('count(up == 1) or vector(0)')}`);
    const body = (await r.json()) as { data?: { result?: { value?: [number, string] }[] } };
    return `${url}/graph (${body.data?.result?.[0]?.value?.[1] ?? '0'} targets up)`;
  } catch (err) {
    return `${url}/graph (unreachable: ${String(err)})`;
  }
}

/** One summary line: the process's /metrics answer and how many series it served. */
export async function scrapeMetrics(name: string, url: string): Promise<string> {
  try {
    const r = await fetch(`${url}/metrics`);
    const text = await r.text();
    const series = text.split('\n').filter((l) => l !== '' && !l.startsWith('#')).length;
    return `${name.padEnd(9)} ${url}/metrics (${r.status}, ${series} series)`;
  } catch (err) {
    return `${name.padEnd(9)} ${url}/metrics (unreachable: ${String(err)})`;
  }
}
