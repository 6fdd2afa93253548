// The Helm chart (charts/flashsale): lint, render with --kube-version for the default, small and
// large values, and validate every rendered manifest against the real test API server with a
// server-side dry run and strict field validation. The FlashSaleActivity CRD is installed for real
// and the example activities are applied for real; the prometheus-operator objects are validated
// against the minimal monitoring CRDs in test/fixtures/crds/.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { parse, stringify } from 'yaml';
import { kafkaSecurityEnvShape } from '../../../core/kafka.js';
import { createMetrics, createOperatorMetrics } from '../../../core/metrics.js';
import { uniqueId } from '../../../dev/servers.js';
import {
  alertRules,
  at,
  chartDir,
  connectionValues,
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
  scrapedMetrics,
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
    // On failure: make chart-sync
    for (const file of ['role.yaml', 'tenant_role.yaml'])
      expect(readText(path.join(chartDir, 'files', 'rbac', file))).toBe(
        readText(path.join(repoRoot, 'config', 'rbac', file)),
      );
  });

  it("renders the tenants' ClusterRole with the rules of config/rbac/tenant_role.yaml", () => {
    const config = parseManifests(readText(path.join(repoRoot, 'config', 'rbac', 'tenant_role.yaml')));
    const chart = parseManifests(renderChart(helm, []));
    const tenant = findObject(chart, 'ClusterRole', '-tenant');
    expect(tenant.metadata.name).toBe('flashsale-tenant');
    expect(at(tenant, 'rules')).toEqual(at(findObject(config, 'ClusterRole', 'flashsale-tenant'), 'rules'));
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
    // By default only the release namespace is watched: a RoleBinding there, nothing cluster-wide.
    const operatorBindings = (objects: K8sObject[], kind: string): K8sObject[] =>
      objects.filter((o) => o.kind === kind && o.metadata.name.endsWith('-operator'));
    const watchEnv = (objects: K8sObject[]): unknown =>
      (
        at(findObject(objects, 'Deployment', '-operator'), 'spec.template.spec.containers.0.env') as {
          name: string;
          value?: string;
        }[]
      ).find((e) => e.name === 'WATCH_NAMESPACE')?.value;
    expect(operatorBindings(chart, 'ClusterRoleBinding')).toEqual([]);
    const own = operatorBindings(chart, 'RoleBinding');
    expect(own.map((b) => b.metadata.namespace)).toEqual(['flashsale']);
    expect(at(own[0], 'subjects.0.name')).toBe(
      findObject(chart, 'ServiceAccount', '-operator').metadata.name,
    );
    expect(at(own[0], 'roleRef')).toMatchObject({ kind: 'ClusterRole' });
    expect(watchEnv(chart)).toBe('flashsale');
    // A list of namespaces: a RoleBinding in each, and the operator watches exactly those.
    const listed = parseManifests(renderChart(helm, [], ['operator.watchNamespaces={shop,outlet}']));
    expect(operatorBindings(listed, 'ClusterRoleBinding')).toEqual([]);
    expect(operatorBindings(listed, 'RoleBinding').map((b) => b.metadata.namespace)).toEqual([
      'shop',
      'outlet',
    ]);
    expect(watchEnv(listed)).toBe('shop,outlet');
    // Cluster-wide only when asked for.
    const all = parseManifests(renderChart(helm, [], ['operator.watchAllNamespaces=true']));
    expect(operatorBindings(all, 'ClusterRoleBinding')).toHaveLength(1);
    expect(operatorBindings(all, 'RoleBinding')).toEqual([]);
    expect(watchEnv(all)).toBe('');
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
    // Migrations run once per install or upgrade in a hook Job, never in the operator's pods; the
    // upgrade guard runs before them.
    expect(at(pod, 'initContainers')).toBeUndefined();
    const job = findObject(objects, 'Job', '-migrate');
    expect(job.metadata.annotations?.['helm.sh/hook']).toBe('pre-install,pre-upgrade');
    const migrate = at(job, 'spec.template.spec.containers.0') as Record<string, unknown>;
    expect(at(migrate, 'command')).toEqual(['node', 'dist/runtime/main.js', 'migrate']);
    expect(at(migrate, 'securityContext.readOnlyRootFilesystem')).toBe(true);
    const guard = findObject(objects, 'Job', '-upgrade-guard');
    expect(guard.metadata.annotations?.['helm.sh/hook']).toBe('pre-upgrade');
    expect(Number(guard.metadata.annotations?.['helm.sh/hook-weight'])).toBeLessThan(
      Number(job.metadata.annotations?.['helm.sh/hook-weight']),
    );
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
      // Namespaces the values name (the watched ones, Grafana's) become the test namespace.
      const named = files.map((f) => parse(readText(f)) as { operator?: { watchNamespaces?: string[] } });
      const pinned = named.some((v) => v.operator?.watchNamespaces?.length)
        ? [`operator.watchNamespaces={${namespace}}`]
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
        'NetworkPolicy',
        'RoleBinding',
        'Job',
      ]) {
        expect(kinds).toContain(kind);
      }
      const out = serverDryRun(namespace, manifests);
      expect(out).not.toMatch(/\bunknown field\b/);
      expect(out).toMatch(/deployment\.apps\/\S+ (created|configured|unchanged) \(server dry run\)/);
      expect(out).toMatch(/prometheusrule\.monitoring\.coreos\.com\/\S+ created \(server dry run\)/);
      expect(out).toMatch(/networkpolicy\.networking\.k8s\.io\/\S+-runtime-api created \(server dry run\)/);
      expect(out).toMatch(
        /rolebinding\.rbac\.authorization\.k8s\.io\/\S+-operator created \(server dry run\)/,
      );
    } finally {
      k(['delete', 'namespace', namespace, '--wait=false']);
    }
  });
});

describe('least privilege', () => {
  const connection = [
    'runtime.database.url=postgres://flashsale_app:app@db:5432/flashsale',
    'runtime.database.migrationUrl=postgres://flashsale_owner:owner@db:5432/flashsale',
    'runtime.redis.url=redis://redis:6379',
    'runtime.kafka.brokers={kafka:9092}',
    'runtime.jwt.hs256Secret=0123456789abcdef0123456789abcdef',
    'runtime.jwt.issuer=https://login.shop.example/',
    'runtime.jwt.audience=flashsale-buyers',
    'runtime.extraSecretData.api.PAYMENT_HMAC_SECRET=abcdefabcdefabcdefabcdefabcdefab',
  ];
  const keysOf = (o: K8sObject): string[] => Object.keys((at(o, 'stringData') ?? {}) as object).sort();

  it('renders a Secret per runtime role with only the keys that role reads, in each watched namespace', () => {
    const objects = parseManifests(
      renderChart(helm, [], [...connection, 'operator.watchNamespaces={shop,outlet}']),
    );
    const secrets = objects.filter((o) => o.kind === 'Secret');
    const where = (name: string): (string | undefined)[] =>
      secrets.filter((s) => s.metadata.name === name).map((s) => s.metadata.namespace);
    for (const role of ['api', 'relay', 'consumer'])
      expect(where(`flashsale-runtime-${role}`)).toEqual(['shop', 'outlet']);
    expect(where('flashsale-runtime-operator')).toEqual(['flashsale']);
    expect(where('flashsale-runtime-migrations')).toEqual(['flashsale']);
    expect(where('flashsale-runtime')).toEqual([]);
    const byName = (name: string): K8sObject => secrets.find((s) => s.metadata.name === name) as K8sObject;
    const shared = ['DATABASE_URL', 'KAFKA_BROKERS', 'REDIS_URL'];
    // The buyer token key and the payment key only where the api runs; each role only the
    // connections it uses (runtime/config.ts ROLE_NEEDS): no Kafka for the api, no database for
    // the relay.
    expect(keysOf(byName('flashsale-runtime-api'))).toEqual(
      [
        'DATABASE_URL',
        'REDIS_URL',
        'JWT_AUDIENCE',
        'JWT_HS256_SECRET',
        'JWT_ISSUER',
        'JWT_MAX_TOKEN_AGE_SECONDS',
        'PAYMENT_HMAC_SECRET',
      ].sort(),
    );
    expect(keysOf(byName('flashsale-runtime-relay'))).toEqual(['KAFKA_BROKERS', 'REDIS_URL']);
    expect(keysOf(byName('flashsale-runtime-consumer'))).toEqual(shared);
    expect(keysOf(byName('flashsale-runtime-operator'))).toEqual(shared);
    // The runtime and the operator get the data-only account; only migrations get the owner's.
    for (const name of ['api', 'consumer', 'operator']) {
      expect(at(byName(`flashsale-runtime-${name}`), 'stringData.DATABASE_URL')).toMatch(/flashsale_app/);
    }
    expect(at(byName('flashsale-runtime-migrations'), 'stringData')).toEqual({
      DATABASE_URL: 'postgres://flashsale_owner:owner@db:5432/flashsale',
    });
    const pod = at(findObject(objects, 'Deployment', '-operator'), 'spec.template.spec') as Record<
      string,
      unknown
    >;
    const refs = (container: unknown): unknown[] =>
      ((at(container, 'env') ?? []) as { valueFrom?: { secretKeyRef?: { name: string } } }[])
        .map((e) => e.valueFrom?.secretKeyRef?.name)
        .filter((n) => n !== undefined);
    const migrate = findObject(objects, 'Job', '-migrate');
    expect(new Set(refs(at(migrate, 'spec.template.spec.containers.0')))).toEqual(
      new Set(['flashsale-runtime-migrations']),
    );
    expect(at(pod, 'initContainers')).toBeUndefined();
    expect(new Set(refs(at(pod, 'containers.0')))).toEqual(new Set(['flashsale-runtime-operator']));
  });

  it("gives the after-sale role the api's and the consumer's extra keys: it runs both one's answers and the other's refunds", () => {
    const objects = parseManifests(
      renderChart(
        helm,
        [],
        [
          ...connection,
          'runtime.extraSecretData.consumer.PAYMENT_HMAC_REFUND_URL=https://pay.example/refunds',
        ],
      ),
    );
    const afterSale = objects.find(
      (o) => o.kind === 'Secret' && o.metadata.name === 'flashsale-runtime-after-sale',
    );
    expect(keysOf(afterSale!)).toEqual(
      expect.arrayContaining(['PAYMENT_HMAC_REFUND_URL', 'PAYMENT_HMAC_SECRET']),
    );
  });

  it('gives the operator every Kafka TLS and SASL key the runtime pods get, also from an existingSecret', () => {
    // The runtime pods load their whole Secret (envFrom); the operator imports named keys, so each
    // KAFKA_* variable of core/kafka.ts must be among them (optional: set only when configured).
    for (const set of [
      [],
      ['runtime.existingSecret=shop-conn'],
      ['runtime.extraSecretData.operator.KAFKA_TLS_SERVERNAME=kafka.internal.example'],
    ]) {
      const objects = parseManifests(renderChart(helm, [], [...connection, ...set]));
      const env = at(
        findObject(objects, 'Deployment', '-operator'),
        'spec.template.spec.containers.0.env',
      ) as {
        name: string;
        valueFrom?: { secretKeyRef?: { name: string; key: string } };
      }[];
      const fromSecret = env
        .filter((e) => e.valueFrom?.secretKeyRef?.name.endsWith('-operator'))
        .map((e) => e.name);
      expect(fromSecret).toEqual(expect.arrayContaining(Object.keys(kafkaSecurityEnvShape)));
      // A key of runtime.extraSecretData.operator that is imported anyway is not set twice.
      expect(env.map((e) => e.name).filter((n, i, all) => all.indexOf(n) !== i)).toEqual([]);
    }
  });

  it('renders NetworkPolicies for the runtime of each watched namespace and for the operator', () => {
    const objects = parseManifests(
      renderChart(
        helm,
        [],
        [
          ...connection,
          'operator.watchNamespaces={shop}',
          'networkPolicy.apiIngressFrom[0].namespaceSelector.matchLabels.gateway=edge',
          'networkPolicy.dataStores[0].ipBlock.cidr=10.20.0.0/16',
        ],
      ),
    );
    const policies = objects.filter((o) => o.kind === 'NetworkPolicy');
    expect(policies.map((p) => `${p.metadata.namespace}/${p.metadata.name}`).sort()).toEqual([
      'flashsale/flashsale-after-sale',
      'flashsale/flashsale-operator',
      'shop/flashsale-runtime',
      'shop/flashsale-runtime-api',
    ]);
    // Every pod the chart or the operator runs is under a policy of both kinds: the after-sale
    // pods serve every activity and hold every runtime credential.
    const afterSalePods = at(
      findObject(objects, 'Deployment', '-after-sale'),
      'spec.template.metadata.labels',
    ) as Record<string, string>;
    const covering = policies.filter(
      (p) =>
        p.metadata.namespace === 'flashsale' &&
        Object.entries(at(p, 'spec.podSelector.matchLabels') as Record<string, string>).every(
          ([k, v]) => afterSalePods[k] === v,
        ),
    );
    expect(covering.map((p) => [p.metadata.name, at(p, 'spec.policyTypes')])).toEqual([
      ['flashsale-after-sale', ['Ingress', 'Egress']],
    ]);
    const afterSale = covering[0]!;
    expect(at(afterSale, 'spec.ingress.0.from')).toEqual([
      { namespaceSelector: { matchLabels: { gateway: 'edge' } } },
    ]);
    expect(at(afterSale, 'spec.egress.1.to')).toEqual([{ ipBlock: { cidr: '10.20.0.0/16' } }]);
    // The refund workers (consumers, after-sale) reach the payment provider.
    for (const policy of [findObject(policies, 'NetworkPolicy', '-runtime'), afterSale])
      expect(at(policy, 'spec.egress.2')).toEqual({ ports: [{ protocol: 'TCP', port: 443 }] });
    const runtime = findObject(policies, 'NetworkPolicy', '-runtime');
    expect(at(runtime, 'spec.podSelector.matchLabels')).toEqual({
      'app.kubernetes.io/name': 'flashsale-runtime',
      'app.kubernetes.io/managed-by': 'flashsale-operator',
    });
    expect(at(runtime, 'spec.policyTypes')).toEqual(['Ingress', 'Egress']);
    // Egress: DNS, then the data stores only (at their addresses and ports).
    expect(at(runtime, 'spec.egress.1')).toEqual({
      ports: [5432, 6379, 9092].map((port) => ({ protocol: 'TCP', port })),
      to: [{ ipBlock: { cidr: '10.20.0.0/16' } }],
    });
    const api = findObject(policies, 'NetworkPolicy', '-runtime-api');
    expect(
      (at(api, 'spec.podSelector.matchLabels') as Record<string, string>)['app.kubernetes.io/component'],
    ).toBe('api');
    expect(at(api, 'spec.ingress.0.from')).toEqual([
      { namespaceSelector: { matchLabels: { gateway: 'edge' } } },
    ]);
    const operator = findObject(policies, 'NetworkPolicy', '-operator');
    expect((at(operator, 'spec.egress.1.ports') as { port: number }[]).map((p) => p.port)).toEqual([
      443, 6443,
    ]);
    // Off when asked.
    const off = parseManifests(renderChart(helm, [], [...connection, 'networkPolicy.enabled=false']));
    expect(off.filter((o) => o.kind === 'NetworkPolicy')).toEqual([]);
  });

  it('lets every pod reach the ports the connection values name (Sentinels, brokers, URLs), beside dataStorePorts', () => {
    const objects = parseManifests(
      renderChart(
        helm,
        [],
        [
          ...connection,
          'runtime.redis.url=rediss://:secret@redis:6380/0',
          'runtime.redis.sentinels={sentinel-0.redis:26379,sentinel-1.redis:26379}',
          'runtime.redis.sentinelMaster=sales',
          'runtime.kafka.brokers={b-1.kafka:9094,b-2.kafka:9094}',
        ],
      ),
    );
    const dataStorePorts = (name: string, egress: number) =>
      (
        at(findObject(objects, 'NetworkPolicy', name), `spec.egress.${egress}.ports`) as { port: number }[]
      ).map((p) => p.port);
    const expected = [5432, 6379, 9092, 26379, 9094, 6380];
    expect({
      runtime: dataStorePorts('-runtime', 1),
      afterSale: dataStorePorts('-after-sale', 1),
      operator: dataStorePorts('-operator', 2),
    }).toEqual({ runtime: expected, afterSale: expected, operator: expected });
  });
});

describe('monitoring reaches every pod that serves /metrics', () => {
  /** The named container ports of a pod template. */
  const portsOf = (podTemplate: unknown): Map<string, number> =>
    new Map(
      ((at(podTemplate, 'spec.containers.0.ports') ?? []) as { name: string; containerPort: number }[]).map(
        (p) => [p.name, p.containerPort],
      ),
    );

  it('opens the runtime metrics port, not the HTTP port, to metricsFrom', () => {
    // The operator's runtime pods serve /metrics only on the `metrics` port (runtime.metricsPort;
    // operator/reconcile/runtime-objects.ts), which the runtime PodMonitor scrapes.
    for (const [set, metricsPort] of [
      [[], 9090],
      [['runtime.metricsPort=9464'], 9464],
    ] as const) {
      const objects = parseManifests(
        renderChart(
          helm,
          [],
          [...set, 'networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus'],
        ),
      );
      const runtime = findObject(objects, 'NetworkPolicy', '-runtime');
      expect(at(runtime, 'spec.ingress')).toEqual([
        {
          ports: [{ protocol: 'TCP', port: metricsPort }],
          from: [{ podSelector: { matchLabels: { app: 'prometheus' } } }],
        },
      ]);
      // The port the after-sale pods (the same runtime image and values) name `metrics`.
      const afterSale = at(findObject(objects, 'Deployment', '-after-sale'), 'spec.template');
      expect(portsOf(afterSale).get('metrics')).toBe(metricsPort);
    }
  });

  it('stops the after-sale pods only after their endpoints are gone: a preStop sleep, then 30 s to drain', () => {
    const pod = (set: string[]) =>
      at(
        findObject(parseManifests(renderChart(helm, [], set)), 'Deployment', '-after-sale'),
        'spec.template.spec',
      );
    // Payment notifications and buyers reach it through a Service: without the sleep, SIGTERM
    // closes the listener while endpoints still send to it (connections refused at every rollout).
    const byDefault = pod([]);
    expect([
      at(byDefault, 'containers.0.lifecycle.preStop.sleep.seconds'),
      at(byDefault, 'terminationGracePeriodSeconds'),
    ]).toEqual([5, 35]);
    const off = pod(['afterSale.preStopSeconds=0']);
    expect([at(off, 'containers.0.lifecycle'), at(off, 'terminationGracePeriodSeconds')]).toEqual([
      undefined,
      30,
    ]);
  });

  it('scrapes the after-sale pods in the release namespace when other namespaces are watched', () => {
    /** Whether a PodMonitor selects pods with these labels in this namespace (matchNames/any, matchLabels). */
    const selects = (monitor: K8sObject, namespace: string, labels: Record<string, string>): boolean => {
      const ns = at(monitor, 'spec.namespaceSelector') as { any?: boolean; matchNames?: string[] };
      const match = (at(monitor, 'spec.selector.matchLabels') ?? {}) as Record<string, string>;
      return (
        (ns.any === true || (ns.matchNames ?? []).includes(namespace)) &&
        Object.entries(match).every(([k, v]) => labels[k] === v)
      );
    };
    const monitoring = ['metrics.podMonitor.enabled=true'];
    for (const set of [
      ['operator.watchNamespaces={shop}'],
      ['operator.watchNamespaces={shop,outlet}', 'metrics.podMonitor.runtimeNamespaces={shop}'],
      [],
      ['operator.watchAllNamespaces=true'],
    ]) {
      const objects = parseManifests(renderChart(helm, [], [...monitoring, ...set]));
      const monitor = findObject(objects, 'PodMonitor', '-runtime');
      const deployment = findObject(objects, 'Deployment', '-after-sale');
      const template = at(deployment, 'spec.template');
      const labels = (at(template, 'metadata.labels') ?? {}) as Record<string, string>;
      expect([set, deployment.metadata.namespace]).toEqual([set, 'flashsale']);
      expect([set, selects(monitor, 'flashsale', labels)]).toEqual([set, true]);
      // It scrapes a port the after-sale container has.
      expect(portsOf(template).has(String(at(monitor, 'spec.podMetricsEndpoints.0.port')))).toBe(true);
      // The activities' namespaces stay covered, each listed once.
      expect([
        set,
        selects(monitor, 'shop', {
          'app.kubernetes.io/name': 'flashsale-runtime',
          'app.kubernetes.io/managed-by': 'flashsale-operator',
        }),
      ]).toEqual([set, set.length > 0]);
      const names = (at(monitor, 'spec.namespaceSelector.matchNames') ?? []) as string[];
      expect(new Set(names).size).toBe(names.length);
    }
    // Without the after-sale role the release namespace is not added.
    const without = parseManifests(
      renderChart(helm, [], [...monitoring, 'operator.watchNamespaces={shop}', 'afterSale.enabled=false']),
    );
    expect(at(findObject(without, 'PodMonitor', '-runtime'), 'spec.namespaceSelector')).toEqual({
      matchNames: ['shop'],
    });
  });
});

describe("tenant pods cannot forge or hide the operator's series", () => {
  interface Relabeling {
    action?: string;
    sourceLabels?: string[];
    separator?: string;
    regex?: string;
  }

  /**
   * Whether Prometheus keeps a scraped series named `name` after these metricRelabelings (only
   * keep and drop, the actions that decide; the regex is anchored, as Prometheus anchors it).
   */
  const kept = (relabelings: Relabeling[], name: string, labels: Record<string, string> = {}): boolean =>
    relabelings.every((r) => {
      const action = (r.action ?? 'replace').toLowerCase();
      if (action !== 'drop' && action !== 'keep')
        throw new Error(`unexpected metricRelabelings action ${action}`);
      const value = (r.sourceLabels ?? [])
        .map((l) => (l === '__name__' ? name : (labels[l] ?? '')))
        .join(r.separator ?? ';');
      const matches = new RegExp(`^(?:${r.regex ?? '(.*)'})$`).test(value);
      return action === 'drop' ? !matches : matches;
    });

  /** The metricRelabelings of each endpoint of a PodMonitor or ServiceMonitor. */
  const endpointRelabelings = (monitor: K8sObject): Relabeling[][] => {
    const key = monitor.kind === 'PodMonitor' ? 'spec.podMetricsEndpoints' : 'spec.endpoints';
    const endpoints = (at(monitor, key) ?? []) as { metricRelabelings?: Relabeling[] }[];
    expect(endpoints.length).toBeGreaterThan(0);
    return endpoints.map((e) => e.metricRelabelings ?? []);
  };

  it('the runtime PodMonitor drops every metric only the operator exports, and none a runtime pod exports', async () => {
    // As scraped: histogram series and the default metrics, which both registries serve.
    const runtime = new Set((await scrapedMetrics(createMetrics('api', 'shop.s1-aaaaaaaa').registry)).keys());
    const operatorOnly = [...(await scrapedMetrics(createOperatorMetrics().registry)).keys()].filter(
      (n) => !runtime.has(n),
    );
    // The series the rules and dashboards tell the operator by.
    for (const name of [
      'flashsale_leader',
      'flashsale_activity_phase',
      'flashsale_activity_half_messages',
      'flashsale_reconcile_errors_total',
      'flashsale_reconcile_duration_seconds_bucket',
      'flashsale_cache_restore_open_since_timestamp_seconds',
      'flashsale_orders_unsettled',
    ])
      expect(operatorOnly).toContain(name);
    expect([...runtime].filter((n) => n.startsWith('flashsale_process_')).length).toBeGreaterThan(5);

    for (const set of [
      ['operator.watchNamespaces={shop}'],
      ['operator.watchAllNamespaces=true'],
      ['metrics.serviceMonitor.enabled=true'],
    ]) {
      const objects = parseManifests(renderChart(helm, [], ['metrics.podMonitor.enabled=true', ...set]));
      for (const relabelings of endpointRelabelings(findObject(objects, 'PodMonitor', '-runtime'))) {
        expect([set, operatorOnly.filter((n) => kept(relabelings, n))]).toEqual([set, []]);
        expect([set, [...runtime].filter((n) => !kept(relabelings, n))]).toEqual([set, []]);
        // A tenant pod labelling its series as the operator's (FlashSaleOperatorNoLeader counts
        // the operator's process starts by that label) is dropped; the runtime's own are kept.
        const start = 'flashsale_process_start_time_seconds';
        expect([set, kept(relabelings, start, { component: 'operator' })]).toEqual([set, false]);
        expect([set, kept(relabelings, start, { component: 'runtime-api' })]).toEqual([set, true]);
      }
      // The operator's own monitor keeps them.
      const own = set.includes('metrics.serviceMonitor.enabled=true')
        ? findObject(objects, 'ServiceMonitor', '-operator')
        : findObject(objects, 'PodMonitor', '-operator');
      for (const relabelings of endpointRelabelings(own))
        expect(operatorOnly.filter((n) => !kept(relabelings, n))).toEqual([]);
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
    // Buyer tokens are checked against an issuer and an audience unless explicitly waived.
    const key = ['--set', 'runtime.jwt.hs256Secret=0123456789abcdef0123456789abcdef'];
    const noIssuer = run(helm, ['template', 'x', chartDir, '--kube-version', kubeVersion, ...key]);
    expect(noIssuer.status).not.toBe(0);
    expect(noIssuer.stderr).toMatch(/runtime\.jwt\.issuer and runtime\.jwt\.audience are required/);
    const waived = run(helm, [
      'template',
      'x',
      chartDir,
      '--kube-version',
      kubeVersion,
      ...valuesArgs([connectionValues]),
      ...key,
      '--set',
      'runtime.jwt.requireIssuerAudience=false',
    ]);
    expect(waived.status).toBe(0);
    // SASL PLAIN would send the password in clear without TLS.
    const plain = run(helm, [
      'template',
      'x',
      chartDir,
      '--kube-version',
      kubeVersion,
      '--set',
      'runtime.kafka.sasl.mechanism=plain',
      '--set',
      'runtime.kafka.sasl.username=u',
      '--set',
      'runtime.kafka.sasl.password=p',
    ]);
    expect(plain.stderr).toMatch(/sends the password in clear/);
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
    // The CRD is shared by the tests on this API server: this release does not own it. No hooks:
    // kwok plays the kubelet but runs no container, so the migration and upgrade-guard Jobs would
    // never finish (they are validated by the server-side dry run above, the guard's program by
    // upgrade-safety.test.ts).
    const common = ['--namespace', namespace, '--set', 'crds.create=false', '--no-hooks'];
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
          '--set',
          'runtime.jwt.issuer=https://login.shop.example/',
          '--set',
          'runtime.jwt.audience=flashsale-buyers',
        ],
        { env },
      );
      expect(install).toMatch(/STATUS: deployed/);
      expect(install).toMatch(/kubectl get fsa -A -w/);
      expect(install).not.toMatch(/WARNING: the connection settings are incomplete/);
      const secret = JSON.parse(
        k(['get', 'secret', 'flashsale-runtime-relay', '-n', namespace, '-o', 'json']),
      ) as {
        data: Record<string, string>;
      };
      expect(Buffer.from(secret.data.KAFKA_BROKERS ?? '', 'base64').toString()).toBe(
        'kafka-0.kafka.svc:9092,kafka-1.kafka.svc:9092',
      );
      // The relay's own Secret: only what the relay connects to (no database URL).
      expect(Object.keys(secret.data).sort()).toEqual(['KAFKA_BROKERS', 'REDIS_URL']);
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
      // The runtime role Secrets stay (helm.sh/resource-policy: keep): live sales' pods read them.
      expect(
        k(['get', 'secret', '-n', namespace, '-l', `app.kubernetes.io/instance=${release}`, '-o', 'name'])
          .trim()
          .split('\n')
          .sort(),
      ).toEqual(['api', 'consumer', 'relay'].map((role) => `secret/flashsale-runtime-${role}`));
      k(['delete', 'secret', '-n', namespace, '-l', `app.kubernetes.io/instance=${release}`]);
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
