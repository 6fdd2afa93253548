// Helpers of the chart tests: the helm and kubectl binaries built from their Go modules, rendering
// the chart, and reading the rendered manifests.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import client from 'prom-client';
import { parseAllDocuments } from 'yaml';
import { exposition } from './promql.js';

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const chartDir = path.join(repoRoot, 'charts', 'flashsale');
export const kubeVersion = '1.34.0';

/**
 * Connection settings for renders that are not about them: the chart fails to render without them
 * (templates/_helpers.tpl "flashsale.missingConnection"). renderChart puts this file first, so a
 * test's own values override it.
 */
export const connectionValues = path.join(repoRoot, 'test', 'integration', 'chart', 'values-connection.yaml');

/** The values files the chart is tested with: the defaults (plus connection settings) and the two examples. */
export const valuesSets: Record<string, string[]> = {
  default: [connectionValues],
  small: [path.join(repoRoot, 'examples', 'values-small.yaml')],
  large: [path.join(repoRoot, 'examples', 'values-large.yaml')],
};

export interface RunResult {
  status: number | null;
  stdout: string;
  stderr: string;
}

export interface RunOptions {
  input?: string;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  timeoutMs?: number;
}

/** Runs a command to completion; never throws for a non-zero exit (see `mustRun`). */
export function run(command: string, args: string[], options: RunOptions = {}): RunResult {
  const out = spawnSync(command, args, {
    input: options.input,
    env: options.env ?? process.env,
    cwd: options.cwd ?? repoRoot,
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
    timeout: options.timeoutMs ?? 120_000,
  });
  if (out.error) throw out.error;
  return { status: out.status, stdout: out.stdout, stderr: out.stderr };
}

/** Runs a command and throws, with its output, unless it exits 0. */
export function mustRun(command: string, args: string[], options: RunOptions = {}): string {
  const r = run(command, args, options);
  if (r.status !== 0) {
    throw new Error(
      `${path.basename(command)} ${args.join(' ')} exited ${String(r.status)}\n${r.stderr}\n${r.stdout}`,
    );
  }
  return r.stdout;
}

/** A variable of test/env/lib.sh (cache paths and pinned versions). */
function libVar(expression: string): string {
  return mustRun('bash', ['-c', `. test/env/lib.sh >/dev/null; echo "${expression}"`]).trim();
}

/** helm, built from its Go module into the cache by test/env/build-kube.sh (cached after the first run). */
export function helmBinary(): string {
  const helm = libVar('$FLASHSALE_CACHE/bin/helm-$HELM_VERSION/helm');
  if (!existsSync(helm)) mustRun('bash', ['test/env/build-kube.sh', 'helm'], { timeoutMs: 900_000 });
  if (!existsSync(helm)) throw new Error(`test/env/build-kube.sh helm did not produce ${helm}`);
  return helm;
}

/** kubectl of the test environment ($KUBECTL, else the one build-kube.sh built). */
export function kubectlBinary(): string {
  const fromEnv = process.env.KUBECTL;
  if (fromEnv && existsSync(fromEnv)) return fromEnv;
  const built = path.join(libVar('$FLASHSALE_CACHE/bin/kube-$KUBE_VERSION-etcd-$ETCD_VERSION'), 'kubectl');
  if (existsSync(built)) return built;
  throw new Error('kubectl not found: set KUBECTL or run test/env/build-kube.sh');
}

export function kubeconfig(): string {
  const value = process.env.KUBECONFIG;
  if (!value)
    throw new Error('KUBECONFIG is not set: run the tests through test/run.sh or start test/env/env-up.sh');
  return value;
}

export function valuesArgs(files: string[], set: string[] = []): string[] {
  return [...files.flatMap((f) => ['-f', f]), ...set.flatMap((s) => ['--set', s])];
}

/** `helm template` of the chart; throws with helm's message when rendering fails. */
export function renderChart(
  helm: string,
  files: string[],
  set: string[] = [],
  namespace = 'flashsale',
): string {
  return mustRun(helm, [
    'template',
    'flashsale',
    chartDir,
    '--namespace',
    namespace,
    '--kube-version',
    kubeVersion,
    ...valuesArgs([connectionValues, ...files], set),
  ]);
}

export interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: {
    name: string;
    namespace?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
  };
  [key: string]: unknown;
}

function isK8sObject(value: unknown): value is K8sObject {
  if (typeof value !== 'object' || value === null) return false;
  const v = value as Record<string, unknown>;
  const meta = v.metadata as Record<string, unknown> | undefined;
  return typeof v.apiVersion === 'string' && typeof v.kind === 'string' && typeof meta?.name === 'string';
}

/** Every object of a multi-document YAML stream (empty documents skipped; a parse error throws). */
export function parseManifests(text: string): K8sObject[] {
  const objects: K8sObject[] = [];
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length > 0)
      throw new Error(`invalid YAML: ${doc.errors.map((e) => e.message).join('; ')}`);
    const value: unknown = doc.toJS();
    if (value === null || value === undefined) continue;
    if (!isK8sObject(value))
      throw new Error(`not a Kubernetes object: ${JSON.stringify(value).slice(0, 200)}`);
    objects.push(value);
  }
  return objects;
}

export function findObject(objects: K8sObject[], kind: string, nameSuffix = ''): K8sObject {
  const found = objects.filter((o) => o.kind === kind && o.metadata.name.endsWith(nameSuffix));
  if (found.length !== 1) {
    throw new Error(`expected one ${kind} named *${nameSuffix}, found ${found.length}`);
  }
  return found[0] as K8sObject;
}

/** A nested property by path (`a.b.0.c`), or undefined. */
export function at(value: unknown, dotted: string): unknown {
  let cur: unknown = value;
  for (const key of dotted.split('.')) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<string, unknown>)[key];
  }
  return cur;
}

/** Files in a directory matching a pattern, sorted. */
export function filesIn(dir: string, pattern: RegExp): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => pattern.test(f))
    .sort()
    .map((f) => path.join(dir, f));
}

export function readText(file: string): string {
  return readFileSync(file, 'utf8');
}

export interface AlertRule {
  alert: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

/** The alert rules of the rendered PrometheusRule (all groups). */
export function alertRules(objects: K8sObject[]): AlertRule[] {
  const rule = findObject(objects, 'PrometheusRule');
  const groups = at(rule, 'spec.groups');
  if (!Array.isArray(groups)) throw new Error('PrometheusRule has no spec.groups');
  const rules: AlertRule[] = [];
  for (const group of groups as { rules?: unknown }[]) {
    for (const r of (group.rules ?? []) as AlertRule[]) rules.push(r);
  }
  return rules;
}

/** Sets, increments or observes every metric of a registry once, with a value for each label. */
function observeAll(registry: client.Registry): void {
  for (const metric of registry.getMetricsAsArray()) {
    const names: unknown = Reflect.get(metric, 'labelNames');
    const labels: Record<string, string> = {};
    if (Array.isArray(names)) for (const n of names) labels[String(n)] = 'x';
    if (metric instanceof client.Counter) metric.inc(labels, 1);
    else if (metric instanceof client.Gauge) metric.set(labels, 1);
    else if (metric instanceof client.Histogram) metric.observe(labels, 0.01);
    else if (metric instanceof client.Summary) metric.observe(labels, 0.01);
  }
}

/**
 * The metric names a registry of core/metrics.ts serves, each with its labels, after observing
 * every metric once: exactly as Prometheus scrapes them, histogram series (_bucket/_sum/_count)
 * and the default process metrics (flashsale_process_*) included.
 */
export async function scrapedMetrics(registry: client.Registry): Promise<Map<string, Set<string>>> {
  observeAll(registry);
  return exposition(await registry.metrics());
}
