// Upgrade safety and fail-fast plumbing of the chart, against the test API server: a render without
// connection settings fails with a message naming them; the pre-upgrade guard program
// (operator/upgrade-guard.ts, the hook Job's command) refuses while a watched activity is in a live
// phase and passes with upgrade.allowDuringActiveSale; an existingSecret without the keys its
// reader needs fails `helm install --dry-run=server` (the `lookup` check), which a `helm template`
// cannot see, and the Secrets docs/install.md step 1 creates pass it; the runtime pods' plumbing
// values reach the operator.
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { stringify } from 'yaml';
import { loadOperatorConfig } from '../../../operator/config.js';
import { loadRuntimeConfig } from '../../../runtime/config.js';
import { serviceAccountKubeConfig, uniqueId } from '../../../dev/servers.js';
import { waitFor } from '../../../dev/roles.js';
import {
  at,
  chartDir,
  connectionValues,
  findObject,
  helmBinary,
  kubeconfig,
  kubectlBinary,
  kubeVersion,
  mustRun,
  parseManifests,
  renderChart,
  repoRoot,
  run,
  valuesArgs,
} from './chart-helpers.js';

let helm = '';
let kubectl = '';
const CRD = path.join(repoRoot, 'crds', 'flashsale.io_flashsaleactivities.yaml');

function k(args: string[], input?: string): string {
  return mustRun(kubectl, ['--kubeconfig', kubeconfig(), ...args], input === undefined ? {} : { input });
}

/** `helm install --dry-run=server` with runtime.existingSecret: runs the chart's `lookup` checks. */
function dryRunInstall(namespace: string, base: string, set: string[] = []): ReturnType<typeof run> {
  return run(
    helm,
    [
      'install',
      uniqueId('fs'),
      chartDir,
      '--namespace',
      namespace,
      '--dry-run=server',
      ...valuesArgs([], ['crds.create=false', `runtime.existingSecret=${base}`, ...set]),
    ],
    { env: { ...process.env, KUBECONFIG: kubeconfig() } },
  );
}

function secretManifest(namespace: string, name: string, data: Record<string, string>): string {
  return stringify({ apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace }, stringData: data });
}

beforeAll(() => {
  helm = helmBinary();
  kubectl = kubectlBinary();
  k(['apply', '--server-side', '--force-conflicts', '--field-manager=flashsale-chart-test', '-f', CRD]);
  k(['wait', '--for=condition=Established', '--timeout=60s', 'crd/flashsaleactivities.flashsale.io']);
}, 900_000);

describe('connection settings', () => {
  it('a render without them fails, naming each missing value', () => {
    const r = run(helm, ['template', 'x', chartDir, '--kube-version', kubeVersion]);
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/runtime connection settings missing: runtime\.database\.url \(DATABASE_URL\)/);
    for (const named of ['runtime.redis.url', 'runtime.kafka.brokers', 'runtime.jwt.hs256Secret']) {
      expect(r.stderr).toContain(named);
    }
    // One missing value: only that one is named.
    const one = run(helm, [
      'template',
      'x',
      chartDir,
      '--kube-version',
      kubeVersion,
      '--set',
      'runtime.database.url=postgres://a:b@db:5432/flashsale',
      '--set',
      'runtime.kafka.brokers={kafka:9092}',
      '--set',
      'runtime.jwt.hs256Secret=0123456789abcdef0123456789abcdef',
      '--set',
      'runtime.jwt.issuer=i',
      '--set',
      'runtime.jwt.audience=a',
    ]);
    expect(one.status).not.toBe(0);
    expect(one.stderr).toMatch(
      /runtime connection settings missing: runtime\.redis\.url \(REDIS_URL\), runtime\.redis\.sentinels or runtime\.redis\.clusterNodes\./,
    );
    // A malformed URL is refused by values.schema.json.
    const bad = run(helm, [
      'template',
      'x',
      chartDir,
      '--kube-version',
      kubeVersion,
      '--set',
      'runtime.redis.url=redis.db.svc:6379',
    ]);
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toMatch(/runtime\.redis\.url|\/runtime\/redis\/url/);
  });

  describe('with runtime.existingSecret', () => {
    const namespace = uniqueId('chart-existing');
    const base = 'shop-conn';
    const secret = (name: string, data: Record<string, string>): string =>
      secretManifest(namespace, name, data);
    const install = (): ReturnType<typeof run> => dryRunInstall(namespace, base);

    beforeAll(() => {
      k(['create', 'namespace', namespace]);
      const db = 'postgres://app:app@db:5432/flashsale';
      const docs = [
        secret(`${base}-operator`, {
          DATABASE_URL: db,
          REDIS_URL: 'redis://r:6379',
          KAFKA_BROKERS: 'k:9092',
        }),
        secret(`${base}-migrations`, { DATABASE_URL: db }),
        secret(`${base}-after-sale`, {
          DATABASE_URL: db,
          REDIS_URL: 'redis://r:6379',
          KAFKA_BROKERS: 'k:9092',
          JWT_JWKS: '{}',
          JWT_ISSUER: 'https://login.shop.example/',
          JWT_AUDIENCE: 'flashsale-buyers',
        }),
        // The api's Secret lacks the buyer token key.
        secret(`${base}-api`, { DATABASE_URL: db, REDIS_URL: 'redis://r:6379' }),
        secret(`${base}-relay`, { REDIS_URL: 'redis://r:6379', KAFKA_BROKERS: 'k:9092' }),
      ];
      k(['apply', '-f', '-'], docs.join('---\n'));
    });
    afterAll(() => {
      k(['delete', 'namespace', namespace, '--wait=false']);
    });

    it('is checked for each Secret and key when Helm talks to the cluster, not in helm template', () => {
      const missingKey = install();
      expect(missingKey.status).not.toBe(0);
      expect(missingKey.stderr).toMatch(
        new RegExp(
          `Secret ${namespace}/${base}-api has no JWT_HS256_SECRET or JWT_RS256_PUBLIC_KEY or JWT_JWKS`,
        ),
      );
      k(['patch', 'secret', `${base}-api`, '-n', namespace, '-p', '{"stringData":{"JWT_JWKS":"{}"}}']);
      // A token key without the issuer and audience would accept tokens issued for other services.
      const noIssuer = install();
      expect(noIssuer.status).not.toBe(0);
      expect(noIssuer.stderr).toMatch(new RegExp(`Secret ${namespace}/${base}-api has no JWT_ISSUER`));
      const optedOut = dryRunInstall(namespace, base, ['runtime.jwt.requireIssuerAudience=false']);
      expect(optedOut.stderr).not.toMatch(/has no JWT_ISSUER/);
      // Not secret: runtime.extraEnv may set them instead.
      const fromEnv = dryRunInstall(namespace, base, [
        'runtime.extraEnv[0].name=JWT_ISSUER',
        'runtime.extraEnv[0].value=https://login.shop.example/',
        'runtime.extraEnv[1].name=JWT_AUDIENCE',
        'runtime.extraEnv[1].value=flashsale-buyers',
      ]);
      expect(fromEnv.stderr).not.toMatch(/has no JWT_(ISSUER|AUDIENCE)/);
      k([
        'patch',
        'secret',
        `${base}-api`,
        '-n',
        namespace,
        '-p',
        '{"stringData":{"JWT_ISSUER":"https://login.shop.example/","JWT_AUDIENCE":"flashsale-buyers"}}',
      ]);
      const missingSecret = install();
      expect(missingSecret.status).not.toBe(0);
      expect(missingSecret.stderr).toMatch(new RegExp(`Secret ${namespace}/${base}-consumer not found`));
      k(
        ['apply', '-f', '-'],
        secret(`${base}-consumer`, {
          DATABASE_URL: 'postgres://app:app@db:5432/flashsale',
          REDIS_URL: 'redis://r:6379',
          KAFKA_BROKERS: 'k:9092',
        }),
      );
      const ok = install();
      expect([ok.status, /Error.*/.exec(ok.stderr)?.[0]]).toEqual([0, undefined]);
      expect(ok.stdout).toMatch(/STATUS: pending-install/);
      // Offline, the Secrets cannot be read: the render passes (the check runs at install).
      const offline = run(helm, [
        'template',
        'x',
        chartDir,
        '--namespace',
        namespace,
        '--kube-version',
        kubeVersion,
        '--set',
        'runtime.existingSecret=nothing-here',
      ]);
      expect(offline.status).toBe(0);
    });
  });

  describe("with the Secrets of docs/install.md step 1, created by the page's own commands", () => {
    const namespace = uniqueId('chart-docs');
    const base = 'flashsale-connection';

    /** The ```sh blocks of a page, list-item indentation removed. */
    function shellBlocks(markdown: string): string[] {
      return [...markdown.matchAll(/^( *)```sh\n([\s\S]*?)^\1```$/gm)].map((m) => {
        const indent = m[1] ?? '';
        return (m[2] ?? '')
          .split('\n')
          .map((l) => (l.startsWith(indent) ? l.slice(indent.length) : l))
          .join('\n');
      });
    }

    /** A Secret's keys and values. */
    function secretData(name: string): Record<string, string> {
      const data = (
        JSON.parse(k(['get', 'secret', name, '-n', namespace, '-o', 'json'])) as {
          data?: Record<string, string>;
        }
      ).data;
      return Object.fromEntries(
        Object.entries(data ?? {}).map(([key, v]) => [key, Buffer.from(v, 'base64').toString('utf8')]),
      );
    }

    beforeAll(() => {
      k(['create', 'namespace', namespace]);
      const page = readFileSync(path.join(repoRoot, 'docs', 'install.md'), 'utf8');
      const step1 = shellBlocks(page).filter((b) => b.includes('create secret generic'));
      expect(step1).toHaveLength(1);
      // The page's namespace `flashsale` (the release's and the only watched one) is this test's;
      // everything else runs as written.
      const shim = `kubectl() {
  local args=() a
  for a in "$@"; do if [[ $a == flashsale ]]; then args+=("$NS"); else args+=("$a"); fi; done
  command "$FS_KUBECTL" --kubeconfig "$KUBECONFIG" "\${args[@]}"
}
`;
      mustRun('bash', ['-c', `set -euo pipefail\n${shim}${step1[0] ?? ''}`], {
        env: { ...process.env, NS: namespace, FS_KUBECTL: kubectl, KUBECONFIG: kubeconfig() },
      });
    });
    afterAll(() => {
      k(['delete', 'namespace', namespace, '--wait=false']);
    });

    it("creates each Secret the chart reads, each accepted by its reader's configuration", () => {
      const ok = dryRunInstall(namespace, base);
      expect([ok.status, /Error.*/.exec(ok.stderr)?.[0]]).toEqual([0, undefined]);
      for (const role of ['api', 'relay', 'consumer', 'after-sale'] as const) {
        const env = secretData(`${base}-${role}`);
        const activity = role === 'api' || role === 'after-sale' ? {} : { ACTIVITY_ID: 'spring' };
        expect(() => loadRuntimeConfig(role, { ...env, ...activity })).not.toThrow();
      }
      // The after-sale role verifies the same buyer tokens as the api.
      expect(secretData(`${base}-after-sale`).JWT_HS256_SECRET).toBe(
        secretData(`${base}-api`).JWT_HS256_SECRET,
      );
      // Least privilege, as the chart's own Secrets: the relay has no database URL, the api no
      // Kafka settings ("Security").
      expect(secretData(`${base}-relay`).DATABASE_URL).toBeUndefined();
      expect(Object.keys(secretData(`${base}-api`)).filter((key) => key.startsWith('KAFKA_'))).toEqual([]);
    });

    it('fails the install naming the after-sale Secret when it is missing or lacks a key', () => {
      const name = `${base}-after-sale`;
      const saved = secretData(name);
      k(['delete', 'secret', name, '-n', namespace]);
      try {
        const missing = dryRunInstall(namespace, base);
        expect(missing.status).not.toBe(0);
        expect(missing.stderr).toContain(
          `runtime.existingSecret: Secret ${namespace}/${name} not found (docs/install.md, "Connection settings")`,
        );
        // Without the after-sale role its Secret is not needed.
        const off = dryRunInstall(namespace, base, ['afterSale.enabled=false']);
        expect([off.status, /Error.*/.exec(off.stderr)?.[0]]).toEqual([0, undefined]);
        const { JWT_HS256_SECRET: _key, ...withoutKey } = saved;
        k(['apply', '-f', '-'], secretManifest(namespace, name, withoutKey));
        const noKey = dryRunInstall(namespace, base);
        expect(noKey.status).not.toBe(0);
        expect(noKey.stderr).toContain(
          `Secret ${namespace}/${name} has no JWT_HS256_SECRET or JWT_RS256_PUBLIC_KEY or JWT_JWKS`,
        );
      } finally {
        k(['apply', '-f', '-'], secretManifest(namespace, name, saved));
      }
    });
  });
});

describe('pre-upgrade guard', () => {
  const namespace = uniqueId('chart-guard');
  const guard = (env: Record<string, string>): ReturnType<typeof run> =>
    run(process.execPath, ['--import', 'tsx', path.join(repoRoot, 'operator', 'upgrade-guard.ts')], {
      env: { PATH: process.env.PATH, HOME: process.env.HOME, KUBECONFIG: kubeconfig(), ...env },
    });
  const canList = (ns: string, user: string): boolean =>
    run(kubectl, [
      '--kubeconfig',
      kubeconfig(),
      'auth',
      'can-i',
      'list',
      'flashsaleactivities.flashsale.io',
      '-n',
      ns,
      `--as=${user}`,
    ]).stdout.trim() === 'yes';
  const setPhase = (name: string, phase: string): void => {
    k([
      'patch',
      'fsa',
      name,
      '-n',
      namespace,
      '--subresource=status',
      '--type=merge',
      '-p',
      JSON.stringify({ status: { phase } }),
    ]);
  };

  beforeAll(() => {
    k(['create', 'namespace', namespace]);
    for (const name of ['spring', 'autumn']) {
      k(
        ['apply', '-f', '-'],
        stringify({
          apiVersion: 'flashsale.io/v1alpha1',
          kind: 'FlashSaleActivity',
          metadata: { name, namespace },
          spec: {
            schedule: { startAt: '2030-11-10T16:00:00Z', endAt: '2030-11-10T18:00:00Z' },
            items: [{ skuId: 'tea', name: 'tea', price: '1.00', stock: 1 }],
          },
        }),
      );
    }
  });
  afterAll(() => {
    k(['delete', 'namespace', namespace, '--wait=false']);
  });

  it('refuses while a watched activity is live, names it, and passes with the override or after the sale', () => {
    setPhase('spring', 'Active');
    setPhase('autumn', 'Pending');
    const refused = guard({ WATCH_NAMESPACE: namespace });
    expect(refused.status).toBe(1);
    expect(refused.stderr).toContain(
      `upgrade refused: 1 FlashSaleActivity(s) in a live phase: ${namespace}/spring (Active)`,
    );
    expect(refused.stderr).toContain('upgrade.allowDuringActiveSale=true');

    const allowed = guard({ WATCH_NAMESPACE: namespace, GUARD_ALLOW_DURING_ACTIVE_SALE: 'true' });
    expect(allowed.status).toBe(0);
    expect(allowed.stdout).toMatch(/upgrading anyway/);

    // Draining counts as live too; Completed does not.
    setPhase('autumn', 'Draining');
    expect(guard({ WATCH_NAMESPACE: namespace }).stderr).toMatch(
      /2 FlashSaleActivity\(s\).*autumn \(Draining\)/,
    );
    setPhase('spring', 'Completed');
    setPhase('autumn', 'Completed');
    const after = guard({ WATCH_NAMESPACE: namespace });
    expect([after.status, after.stderr]).toEqual([0, '']);
    expect(after.stdout).toMatch(/no live sale/);
  });

  it("under the operator's own RBAC: refuses for a watched namespace, skips one it may not read", async () => {
    // The hook Job's ServiceAccount is the operator's, bound to the shipped ClusterRole in the
    // namespaces it watched before the upgrade (here: this one, not `newly`).
    k(['apply', '-f', path.join(repoRoot, 'config', 'rbac', 'role.yaml')]);
    const sa = 'flashsale-operator';
    const kc = await serviceAccountKubeConfig(namespace, sa, { expirationSeconds: 600 });
    k([
      'create',
      'rolebinding',
      'flashsale-operator',
      '-n',
      namespace,
      '--clusterrole=flashsale-operator',
      `--serviceaccount=${namespace}:${sa}`,
    ]);
    const user = `system:serviceaccount:${namespace}:${sa}`;
    await waitFor('RBAC of the operator applied', () => Promise.resolve(canList(namespace, user)));
    const newly = uniqueId('chart-guard-new');
    expect(canList(newly, user)).toBe(false);
    const file = path.join(mkdtempSync(path.join(tmpdir(), 'fs-guard-')), 'kubeconfig.json');
    writeFileSync(file, kc.exportConfig(), { mode: 0o600 });
    setPhase('spring', 'Ready');
    const refused = guard({ KUBECONFIG: file, WATCH_NAMESPACE: `${namespace},${newly}` });
    expect(refused.status).toBe(1);
    expect(refused.stderr).toContain(`${namespace}/spring (Ready)`);
    expect(refused.stdout).toContain(newly);
    expect(refused.stdout).toMatch(/not readable \(not watched before\): skipped/);
    setPhase('spring', 'Completed');
    expect(guard({ KUBECONFIG: file, WATCH_NAMESPACE: `${namespace},${newly}` }).status).toBe(0);
  }, 120_000);

  it('is the hook Job of helm upgrade, with the override passed through', () => {
    const objects = parseManifests(renderChart(helm, [], ['upgrade.allowDuringActiveSale=true']));
    const job = findObject(objects, 'Job', '-upgrade-guard');
    expect(job.metadata.annotations?.['helm.sh/hook']).toBe('pre-upgrade');
    const container = at(job, 'spec.template.spec.containers.0');
    expect(at(container, 'command')).toEqual(['node', 'dist/operator/upgrade-guard.js']);
    const env = new Map(
      ((at(container, 'env') ?? []) as { name: string; value?: string }[]).map((e) => [e.name, e.value]),
    );
    expect(env.get('GUARD_ALLOW_DURING_ACTIVE_SALE')).toBe('true');
    expect(env.get('WATCH_NAMESPACE')).toBe('flashsale');
    // The operator's ServiceAccount, which may list exactly the watched namespaces' activities.
    expect(at(job, 'spec.template.spec.serviceAccountName')).toBe(
      findObject(objects, 'ServiceAccount', '-operator').metadata.name,
    );
    const off = parseManifests(renderChart(helm, [], ['upgrade.guard.enabled=false']));
    expect(off.some((o) => o.kind === 'Job' && o.metadata.name.endsWith('-upgrade-guard'))).toBe(false);
  });
});

describe('runtime plumbing reaches the operator', () => {
  it('passes pull secrets, extra env, volumes and role settings; keeps the runtime Secrets', () => {
    const objects = parseManifests(
      renderChart(helm, [path.join(repoRoot, 'examples', 'values-large.yaml')], ['runtime.existingSecret=']),
    );
    const operator = findObject(objects, 'Deployment', '-operator');
    const env = new Map(
      ((at(operator, 'spec.template.spec.containers.0.env') ?? []) as { name: string; value?: string }[]).map(
        (e) => [e.name, e.value],
      ),
    );
    expect(env.get('RUNTIME_IMAGE')).toMatch(/flashsale-runtime@sha256:[0-9a-f]{64}$/);
    expect(env.get('RUNTIME_IMAGE_PULL_SECRETS')).toBe('registry-example-com');
    expect(JSON.parse(env.get('RUNTIME_EXTRA_ENV') ?? '')).toEqual([
      { name: 'NODE_EXTRA_CA_CERTS', value: '/etc/flashsale/ca/ca.crt' },
    ]);
    expect(JSON.parse(env.get('RUNTIME_EXTRA_VOLUMES') ?? '')).toEqual([
      { name: 'corporate-ca', configMap: { name: 'corporate-ca' } },
    ]);
    expect(JSON.parse(env.get('RUNTIME_EXTRA_VOLUME_MOUNTS') ?? '')).toHaveLength(1);
    const roles = JSON.parse(env.get('RUNTIME_ROLE_SETTINGS') ?? '') as Record<
      string,
      Record<string, unknown>
    >;
    expect(roles.api).toMatchObject({ priorityClassName: 'flashsale-sale-critical', preStopSeconds: 10 });
    // The operator accepts what the chart renders (its role settings schema is strict).
    const rendered = Object.fromEntries([...env].filter((e): e is [string, string] => e[1] !== undefined));
    const config = loadOperatorConfig({
      ...rendered,
      DATABASE_URL: 'postgres://a:b@db:5432/flashsale',
      REDIS_URL: 'redis://r:6379',
      KAFKA_BROKERS: 'k:9092',
    });
    expect(config.runtime.roles.api).toMatchObject({ preStopSeconds: 10, disruptionBudget: true });
    expect(config.runtime.roles.relay.topologySpreadConstraints).toHaveLength(1);
    expect(config.runtime.imagePullSecrets).toEqual(['registry-example-com']);
    const afterSale = findObject(objects, 'Deployment', '-after-sale');
    expect(at(afterSale, 'spec.template.spec.imagePullSecrets')).toEqual([{ name: 'registry-example-com' }]);
    expect(at(afterSale, 'spec.template.spec.volumes.0.name')).toBe('corporate-ca');
    const roleSecrets = objects.filter(
      (o) => o.kind === 'Secret' && /-(api|relay|consumer)$/.test(o.metadata.name),
    );
    expect(roleSecrets.length).toBeGreaterThan(0);
    for (const s of roleSecrets) expect(s.metadata.annotations?.['helm.sh/resource-policy']).toBe('keep');
    // A Secret reference in the extras is refused: each role reads only its own Secret.
    for (const extra of [
      'runtime.extraVolumes[0].secret.secretName=other',
      'runtime.extraEnv[0].valueFrom.secretKeyRef.name=other',
    ]) {
      const refused = run(helm, [
        'template',
        'x',
        chartDir,
        '--kube-version',
        kubeVersion,
        ...valuesArgs([connectionValues], [extra.replace(/\[0\]\..*/, '[0].name=x'), extra]),
      ]);
      expect(refused.status).not.toBe(0);
      expect(refused.stderr).toMatch(/may not reference Secrets/);
    }
  });
});
