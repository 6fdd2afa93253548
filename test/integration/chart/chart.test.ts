// The Helm chart (charts/flashsale): lint, render with --kube-version for the default, small and
// large values, and validate every rendered manifest against the real test API server with a
// server-side dry run and strict field validation. The FlashSaleActivity CRD is installed for real
// and the example activities are applied for real; the prometheus-operator objects are validated
// against the minimal monitoring CRDs in test/fixtures/crds/.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { parse, stringify } from 'yaml';
import { uniqueId } from '../../helpers/env.js';
import {
  alertRules,
  at,
  chartDir,
  filesIn,
  findObject,
  helmBinary,
  kubeconfig,
  kubectlBinary,
  kubeVersion,
  mustRun,
  parseManifests,
  readText,
  renderChart,
  repoRoot,
  run,
  valuesArgs,
  valuesSets,
  type K8sObject,
} from './chart-helpers.js';

const CRD_NAME = 'flashsaleactivities.flashsale.io';
const repoCrd = path.join(repoRoot, 'crds', 'flashsale.io_flashsaleactivities.yaml');
const chartCrd = path.join(chartDir, 'files', 'crds', 'flashsale.io_flashsaleactivities.yaml');
const dashboardFiles = filesIn(path.join(chartDir, 'files', 'dashboards'), /\.json$/);
const alertFiles = filesIn(path.join(chartDir, 'files', 'alerts'), /\.yaml$/);
const exampleActivities = filesIn(path.join(repoRoot, 'examples'), /^activity.*\.ya?ml$/);
/** Every monitoring object enabled, so that nothing optional escapes validation. */
const allMonitoring = [
  'metrics.podMonitor.enabled=true',
  'metrics.serviceMonitor.enabled=true',
  'metrics.prometheusRule.enabled=true',
  'metrics.dashboards.enabled=true',
];

let helm = '';
let kubectl = '';

function k(args: string[], input?: string): string {
  return mustRun(kubectl, ['--kubeconfig', kubeconfig(), ...args], input === undefined ? {} : { input });
}

function tryK(args: string[], input?: string): { status: number | null; out: string } {
  const r = run(kubectl, ['--kubeconfig', kubeconfig(), ...args], input === undefined ? {} : { input });
  return { status: r.status, out: `${r.stdout}\n${r.stderr}` };
}

function serverDryRun(namespace: string, manifests: string): string {
  return k(['apply', '--dry-run=server', '--validate=strict', '-n', namespace, '-f', '-'], manifests);
}

beforeAll(() => {
  helm = helmBinary();
  kubectl = kubectlBinary();
  // The monitoring CRDs (minimal test copies) and the FlashSaleActivity CRD, for real.
  k([
    'apply',
    '--server-side',
    '--force-conflicts',
    '--field-manager=flashsale-chart-test',
    '-f',
    'test/fixtures/crds/',
  ]);
  k(['apply', '--server-side', '--force-conflicts', '--field-manager=flashsale-chart-test', '-f', repoCrd]);
  k(['wait', '--for=condition=Established', '--timeout=60s', `crd/${CRD_NAME}`]);
  for (const name of ['podmonitors', 'servicemonitors', 'prometheusrules']) {
    k(['wait', '--for=condition=Established', '--timeout=60s', `crd/${name}.monitoring.coreos.com`]);
  }
}, 900_000);

describe('chart sources', () => {
  it('ships the repository CRD unchanged (charts/flashsale/files/crds is a copy of crds/)', () => {
    expect(existsSync(chartCrd)).toBe(true);
    // On failure: cp crds/flashsale.io_flashsaleactivities.yaml charts/flashsale/files/crds/
    expect(readText(chartCrd)).toBe(readText(repoCrd));
  });

  it('ships the repository RBAC rules unchanged (charts/flashsale/files/rbac is a copy of config/rbac/)', () => {
    // On failure: cp config/rbac/role.yaml charts/flashsale/files/rbac/
    expect(readText(path.join(chartDir, 'files', 'rbac', 'role.yaml'))).toBe(
      readText(path.join(repoRoot, 'config', 'rbac', 'role.yaml')),
    );
  });

  it('grants exactly the RBAC rules of config/rbac (least privilege, in step with the operator)', () => {
    const rulesOf = (objects: K8sObject[], kind: string, nameSuffix: string): unknown =>
      at(findObject(objects, kind, nameSuffix), 'rules');
    const config = parseManifests(
      ['role.yaml', 'leader_election_role.yaml']
        .map((f) => readText(path.join(repoRoot, 'config', 'rbac', f)))
        .join('\n---\n'),
    );
    const chart = parseManifests(renderChart(helm, []));
    expect(rulesOf(chart, 'ClusterRole', '-operator')).toEqual(
      rulesOf(config, 'ClusterRole', 'flashsale-operator'),
    );
    expect(rulesOf(chart, 'Role', '-leader-election')).toEqual(rulesOf(config, 'Role', '-leader-election'));
    // Every namespace watched: bound cluster-wide; one namespace: bound in it only.
    const binding = findObject(chart, 'ClusterRoleBinding', '-operator');
    expect(at(binding, 'subjects.0.name')).toBe(
      findObject(chart, 'ServiceAccount', '-operator').metadata.name,
    );
    const one = parseManifests(renderChart(helm, [], ['operator.watchNamespace=shop']));
    expect(one.filter((o) => o.kind === 'ClusterRoleBinding')).toEqual([]);
    expect(findObject(one, 'RoleBinding', '-operator').metadata.namespace).toBe('shop');
    // The Lease name is configurable; its rule follows it.
    const lease = parseManifests(renderChart(helm, [], ['operator.leaderElection.leaseName=other']));
    expect(at(findObject(lease, 'Role', '-leader-election'), 'rules.1.resourceNames')).toEqual(['other']);
  });

  it('has one runbook per alert, named after it', () => {
    expect(alertFiles.length).toBeGreaterThanOrEqual(7);
    for (const file of alertFiles) {
      const alert = path.basename(file, '.yaml');
      expect(existsSync(path.join(repoRoot, 'docs', 'runbooks', `${alert}.md`))).toBe(true);
    }
  });
});

describe.each(Object.keys(valuesSets))('chart with %s values', (set) => {
  const files = valuesSets[set] ?? [];

  it('passes helm lint --strict', () => {
    const out = mustRun(helm, [
      'lint',
      '--strict',
      chartDir,
      '--kube-version',
      kubeVersion,
      ...valuesArgs(files),
    ]);
    expect(out).toMatch(/1 chart\(s\) linted, 0 chart\(s\) failed/);
  });

  it('renders the operator hardened, with leader election and the runtime defaults', () => {
    const objects = parseManifests(renderChart(helm, files));
    const deployment = findObject(objects, 'Deployment', '-operator');
    expect(at(deployment, 'spec.replicas')).toBeGreaterThanOrEqual(2);
    const pod = at(deployment, 'spec.template.spec') as Record<string, unknown>;
    expect(at(pod, 'securityContext.runAsNonRoot')).toBe(true);
    expect(at(pod, 'securityContext.seccompProfile.type')).toBe('RuntimeDefault');
    const container = at(pod, 'containers.0') as Record<string, unknown>;
    expect(at(container, 'securityContext.readOnlyRootFilesystem')).toBe(true);
    expect(at(container, 'securityContext.allowPrivilegeEscalation')).toBe(false);
    expect(at(container, 'securityContext.capabilities.drop')).toEqual(['ALL']);
    expect(at(container, 'livenessProbe.httpGet.path')).toBe('/healthz');
    expect(at(container, 'readinessProbe.httpGet.path')).toBe('/readyz');
    expect(at(container, 'resources.requests')).toBeDefined();
    expect(at(container, 'resources.limits.memory')).toBeDefined();
    const env = new Map(
      ((at(container, 'env') ?? []) as { name: string; value?: string }[]).map((e) => [e.name, e]),
    );
    expect(env.get('LEADER_ELECTION')?.value).toBe('true');
    expect(env.get('RUNTIME_IMAGE')?.value).toMatch(/flashsale-runtime[:@]/);
    expect(env.get('RUNTIME_SECRET_NAME')?.value).toBeTruthy();
    const migrate = at(pod, 'initContainers.0') as Record<string, unknown>;
    expect(at(migrate, 'command')).toEqual(['node', 'dist/runtime/main.js', 'migrate']);
    expect(at(migrate, 'securityContext.readOnlyRootFilesystem')).toBe(true);
    expect(at(pod, 'serviceAccountName')).toBe(
      findObject(objects, 'ServiceAccount', '-operator').metadata.name,
    );
  });

  it('renders the CRD with the keep policy and one dashboard ConfigMap per JSON file', () => {
    const objects = parseManifests(renderChart(helm, files, allMonitoring));
    const crd = findObject(objects, 'CustomResourceDefinition');
    expect(crd.metadata.name).toBe(CRD_NAME);
    expect(crd.metadata.annotations?.['helm.sh/resource-policy']).toBe('keep');
    const dashboards = objects.filter(
      (o) => o.kind === 'ConfigMap' && o.metadata.labels?.grafana_dashboard === '1',
    );
    expect(dashboards).toHaveLength(dashboardFiles.length);
    for (const file of dashboardFiles) {
      const key = path.basename(file);
      const holding = dashboards.filter((d) => key in ((at(d, 'data') ?? {}) as Record<string, string>));
      expect(holding).toHaveLength(1);
      const data = (at(holding[0], 'data') as Record<string, string>)[key] ?? '';
      expect(JSON.parse(data)).toEqual(JSON.parse(readText(file)));
    }
  });

  it('renders every alert with a severity and a runbook in docs/runbooks', () => {
    const rules = alertRules(parseManifests(renderChart(helm, files, allMonitoring)));
    expect(rules.map((r) => r.alert).sort()).toEqual(alertFiles.map((f) => path.basename(f, '.yaml')).sort());
    for (const rule of rules) {
      expect(['critical', 'warning', 'info']).toContain(rule.labels?.severity);
      const url = rule.annotations?.runbook_url ?? '';
      expect(url.endsWith(`/docs/runbooks/${rule.alert}.md`)).toBe(true);
      expect(rule.annotations?.summary).toBeTruthy();
      expect(rule.expr).not.toMatch(/<no value>/);
    }
  });

  it('is accepted by the API server: server-side dry run with strict field validation', () => {
    const namespace = uniqueId(`chart-${set}`);
    k(['create', 'namespace', namespace]);
    try {
      // Namespaces the values name (the watched one, Grafana's) become the test namespace.
      const named = files.map((f) => parse(readText(f)) as { operator?: { watchNamespace?: string } });
      const pinned = named.some((v) => v.operator?.watchNamespace)
        ? [`operator.watchNamespace=${namespace}`]
        : [];
      const manifests = renderChart(
        helm,
        files,
        [...allMonitoring, `metrics.dashboards.namespace=${namespace}`, ...pinned],
        namespace,
      );
      expect(
        parseManifests(manifests).every((o) => [undefined, namespace].includes(o.metadata.namespace)),
      ).toBe(true);
      const kinds = new Set(parseManifests(manifests).map((o) => o.kind));
      for (const kind of [
        'CustomResourceDefinition',
        'Deployment',
        'ServiceAccount',
        'PodMonitor',
        'PrometheusRule',
      ]) {
        expect(kinds).toContain(kind);
      }
      const out = serverDryRun(namespace, manifests);
      expect(out).not.toMatch(/\bunknown field\b/);
      expect(out).toMatch(/deployment\.apps\/\S+ (created|configured|unchanged) \(server dry run\)/);
      expect(out).toMatch(/prometheusrule\.monitoring\.coreos\.com\/\S+ created \(server dry run\)/);
    } finally {
      k(['delete', 'namespace', namespace, '--wait=false']);
    }
  });
});

describe('validation can fail', () => {
  it('rejects a misspelled value (values.schema.json)', () => {
    const top = run(helm, [
      'template',
      'x',
      chartDir,
      '--kube-version',
      kubeVersion,
      '--set',
      'operator.replica=3',
    ]);
    expect(top.status).not.toBe(0);
    expect(top.stderr).toMatch(/additional properties 'replica' not allowed/);
    const nested = run(helm, [
      'template',
      'x',
      chartDir,
      '--kube-version',
      kubeVersion,
      '--set',
      'runtime.databse.url=postgres://x',
    ]);
    expect(nested.status).not.toBe(0);
    expect(nested.stderr).toMatch(/databse/);
  });

  it('rejects contradictory values (both JWT keys, several replicas without leader election)', () => {
    const jwt = run(helm, [
      'template',
      'x',
      chartDir,
      '--kube-version',
      kubeVersion,
      '--set',
      'runtime.jwt.hs256Secret=0123456789abcdef0123456789abcdef',
      '--set',
      'runtime.jwt.rs256PublicKey=-----BEGIN PUBLIC KEY-----x',
    ]);
    expect(jwt.stderr).toMatch(/not both/);
    const le = run(helm, [
      'template',
      'x',
      chartDir,
      '--kube-version',
      kubeVersion,
      '--set',
      'operator.leaderElection.enabled=false',
    ]);
    expect(le.stderr).toMatch(/leaderElection/);
  });

  it('the API server rejects an unknown field in a rendered manifest (strict validation is on)', () => {
    const namespace = uniqueId('chart-strict');
    k(['create', 'namespace', namespace]);
    try {
      const objects = parseManifests(renderChart(helm, [], allMonitoring, namespace));
      const deployment = findObject(objects, 'Deployment', '-operator') as K8sObject & {
        spec: { template: { spec: { containers: Record<string, unknown>[] } } };
      };
      const container = deployment.spec.template.spec.containers[0] as Record<string, unknown>;
      container.securityContxt = { runAsNonRoot: true };
      const rule = findObject(objects, 'PrometheusRule') as K8sObject & {
        spec: { groups: { rules: unknown[] }[] };
      };
      const groups = rule.spec.groups;
      (groups[0] as { rules: Record<string, unknown>[] }).rules.push({ alert: 'X', expr: 'up', fro: '5m' });
      for (const bad of [deployment, rule]) {
        const r = tryK(
          ['apply', '--dry-run=server', '--validate=strict', '-n', namespace, '-f', '-'],
          stringify(bad),
        );
        expect(r.status).not.toBe(0);
        expect(r.out).toMatch(/unknown field/);
      }
    } finally {
      k(['delete', 'namespace', namespace, '--wait=false']);
    }
  });
});

describe('example activities', () => {
  it('are accepted by the installed CRD (applied for real)', () => {
    expect(exampleActivities.length).toBeGreaterThan(0);
    const namespace = uniqueId('chart-examples');
    k(['create', 'namespace', namespace]);
    try {
      for (const file of exampleActivities) {
        const objects = parseManifests(readText(file));
        expect(objects.every((o) => o.kind === 'FlashSaleActivity')).toBe(true);
        // Into the test's namespace, whatever namespace the example names.
        const docs = objects.map((o) => stringify({ ...o, metadata: { ...o.metadata, namespace } }));
        const out = k(['apply', '--validate=strict', '-n', namespace, '-f', '-'], docs.join('---\n'));
        expect(out).toMatch(/flashsaleactivity\.flashsale\.io\/\S+ created/);
      }
      const listed = k(['get', 'fsa', '-n', namespace, '-o', 'name']).trim().split('\n');
      expect(listed.length).toBe(
        exampleActivities.reduce((n, f) => n + parseManifests(readText(f)).length, 0),
      );
    } finally {
      // No operator runs here, so nothing holds a finalizer: the activities go with the namespace.
      k(['delete', 'namespace', namespace, '--wait=false']);
    }
  });
});

describe('helm install, upgrade and uninstall against the API server', () => {
  it('installs as documented, upgrades, and uninstalls leaving no operator objects behind', () => {
    const namespace = uniqueId('chart-release');
    const release = uniqueId('fs');
    const env = { ...process.env, KUBECONFIG: kubeconfig() };
    // The CRD is shared by the tests on this API server: this release does not own it.
    const common = ['--namespace', namespace, '--set', 'crds.create=false'];
    try {
      const install = mustRun(
        helm,
        [
          'install',
          release,
          chartDir,
          '--create-namespace',
          ...common,
          '--set',
          'runtime.database.url=postgres://flashsale:secret@postgres.db.svc:5432/flashsale',
          '--set',
          'runtime.redis.url=redis://redis.db.svc:6379',
          '--set',
          'runtime.kafka.brokers={kafka-0.kafka.svc:9092,kafka-1.kafka.svc:9092}',
          '--set',
          'runtime.jwt.hs256Secret=0123456789abcdef0123456789abcdef',
        ],
        { env },
      );
      expect(install).toMatch(/STATUS: deployed/);
      expect(install).toMatch(/kubectl get fsa -A -w/);
      expect(install).not.toMatch(/WARNING: the connection settings are incomplete/);
      const secret = JSON.parse(k(['get', 'secret', 'flashsale-runtime', '-n', namespace, '-o', 'json'])) as {
        data: Record<string, string>;
      };
      expect(Buffer.from(secret.data.KAFKA_BROKERS ?? '', 'base64').toString()).toBe(
        'kafka-0.kafka.svc:9092,kafka-1.kafka.svc:9092',
      );
      expect(k(['get', 'deployment', '-n', namespace, '-o', 'name'])).toMatch(/-operator/);
      // The platform after-sale role: one Deployment and Service for every activity.
      expect(k(['get', 'deployment', '-n', namespace, '-o', 'name'])).toMatch(/-after-sale/);
      expect(k(['get', 'service', '-n', namespace, '-o', 'name'])).toMatch(/-after-sale/);

      const upgrade = mustRun(
        helm,
        ['upgrade', release, chartDir, ...common, '--reuse-values', '--set', 'operator.replicas=3'],
        { env },
      );
      expect(upgrade).toMatch(/STATUS: deployed/);
      const replicas = k([
        'get',
        'deployment',
        '-n',
        namespace,
        '-l',
        'app.kubernetes.io/component=operator',
        '-o',
        'jsonpath={.items[0].spec.replicas}',
      ]);
      expect(replicas).toBe('3');

      mustRun(helm, ['uninstall', release, '--namespace', namespace, '--wait'], { env });
      expect(
        k([
          'get',
          'deployment,serviceaccount,secret,configmap',
          '-n',
          namespace,
          '-l',
          `app.kubernetes.io/instance=${release}`,
          '-o',
          'name',
        ]).trim(),
      ).toBe('');
      expect(k(['get', 'crd', CRD_NAME, '-o', 'name']).trim()).toBe(
        `customresourcedefinition.apiextensions.k8s.io/${CRD_NAME}`,
      );
    } finally {
      run(helm, ['uninstall', release, '--namespace', namespace], { env });
      k(['delete', 'namespace', namespace, '--wait=false', '--ignore-not-found']);
    }
  });
});
