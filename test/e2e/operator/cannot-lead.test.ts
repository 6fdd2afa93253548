// An operator that cannot lead says so: with its Lease namespace missing, or its Lease forbidden
// by RBAC, it is not ready (/readyz 503 with the reason), flashsale_leader_election_blocked is 1
// and one error log names the reason (not a warning every retry); once fixed, it leads.
import type { V1Role } from '@kubernetes/client-node';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import {
  SERVICE_ACCOUNT,
  admin,
  installCrd,
  prepareNamespace,
  readYaml,
  startOperator,
  waitFor,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess } from '../../../dev/operator-harness.js';

const TIMEOUT_MS = 240_000;

describe('operator: cannot lead', () => {
  const a = admin();
  let db: FreshDatabase;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;

  beforeAll(async () => {
    await installCrd(a);
    db = await freshDatabase();
    ns = await prepareNamespace(uniqueId('op-lead'), a);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await operator?.kill('SIGTERM');
    await db?.drop();
  }, TIMEOUT_MS);

  /** Runs an operator whose Lease lives in `leaseNamespace`; waits until it serves HTTP. */
  const start = async (
    identity: string,
    leaseNamespace: string,
    kubeconfigPath: string,
  ): Promise<OperatorProcess> =>
    startOperator({
      ns: { ...ns, kubeconfigPath },
      databaseUrl: db.url,
      identity,
      env: { POD_NAMESPACE: leaseNamespace },
      waitFor: 'serving',
    });

  const probe = (p: OperatorProcess) => {
    const base = `http://127.0.0.1:${p.port}`;
    return {
      readyz: async (): Promise<{ status: number; text: string }> => {
        const r = await fetch(`${base}/readyz`);
        return { status: r.status, text: await r.text() };
      },
      metric: async (name: string): Promise<string | undefined> =>
        new RegExp(`^${name}\\{component="operator"\\} (\\S+)$`, 'm').exec(
          await (await fetch(`${base}/metrics`)).text(),
        )?.[1],
      cannotLead: (): Record<string, unknown>[] => p.records().filter((r) => r.msg === 'cannot lead'),
      warnings: (): Record<string, unknown>[] =>
        p.records().filter((r) => r.msg === 'lease acquire attempt failed'),
    };
  };

  it(
    'says so while its Lease namespace is missing, and leads once it exists',
    async () => {
      // Run as an administrator (as on a developer's machine): nothing but the namespace is missing.
      const leaseNamespace = uniqueId('lease-ns');
      operator = await start('operator-admin', leaseNamespace, testEnv().kubeconfig);
      const p = probe(operator);
      const missing = await waitFor('not ready: namespace missing', async () => {
        const r = await p.readyz();
        return r.status === 503 && r.text.includes('cannot lead') ? r : undefined;
      });
      expect(missing.text).toBe(
        `not ready: cannot lead: the Lease namespace ${leaseNamespace} does not exist (create it, or set LEASE_NAMESPACE)\n`,
      );
      expect(await p.metric('flashsale_leader_election_blocked')).toBe('1');
      expect(await p.metric('flashsale_leader')).toBe('0');

      await a.core.createNamespace({ body: { metadata: { name: leaseNamespace } } });
      await waitFor(
        'leading and ready',
        async () =>
          operator?.records().some((r) => r.msg === 'controller started') &&
          (await p.readyz()).status === 200,
        90_000,
      );
      expect(await p.metric('flashsale_leader_election_blocked')).toBe('0');
      expect(await p.metric('flashsale_leader')).toBe('1');
      // Every failed attempt (one per 2 s) was quiet but the first: one error line, no warnings.
      expect(p.cannotLead()).toEqual([
        expect.objectContaining({ level: 50, reason: expect.stringMatching(/does not exist/) }),
      ]);
      expect(p.warnings()).toEqual([]);
      await operator.kill('SIGTERM');
    },
    TIMEOUT_MS,
  );

  it(
    'says so while RBAC forbids its Lease, and leads once the Role is bound',
    async () => {
      const leaseNamespace = uniqueId('lease-ns');
      await a.core.createNamespace({ body: { metadata: { name: leaseNamespace } } });
      operator = await start('operator-sa', leaseNamespace, ns.kubeconfigPath);
      const p = probe(operator);
      const forbidden = await waitFor('not ready: forbidden', async () => {
        const r = await p.readyz();
        return r.status === 503 && r.text.includes('cannot lead') ? r : undefined;
      });
      expect(forbidden.text).toBe(
        `not ready: cannot lead: forbidden to read or create the Lease ${leaseNamespace}/flashsale-operator (RBAC: bind the leader-election Role in ${leaseNamespace}, which must exist)\n`,
      );
      expect(await p.metric('flashsale_leader_election_blocked')).toBe('1');

      const leaseRole = readYaml<V1Role>('config/rbac/leader_election_role.yaml');
      await a.rbac.createNamespacedRole({
        namespace: leaseNamespace,
        body: { ...leaseRole, metadata: { ...leaseRole.metadata, namespace: leaseNamespace } },
      });
      await a.rbac.createNamespacedRoleBinding({
        namespace: leaseNamespace,
        body: {
          metadata: { name: 'flashsale-operator-leader-election' },
          roleRef: {
            apiGroup: 'rbac.authorization.k8s.io',
            kind: 'Role',
            name: leaseRole.metadata?.name ?? '',
          },
          subjects: [{ kind: 'ServiceAccount', name: SERVICE_ACCOUNT, namespace: ns.namespace }],
        },
      });
      await waitFor(
        'leading and ready',
        async () =>
          operator?.records().some((r) => r.msg === 'controller started') &&
          (await p.readyz()).status === 200,
        90_000,
      );
      expect(await p.metric('flashsale_leader_election_blocked')).toBe('0');
      expect(p.cannotLead()).toEqual([
        expect.objectContaining({ level: 50, reason: expect.stringMatching(/^forbidden/) }),
      ]);
      expect(p.warnings()).toEqual([]);
    },
    TIMEOUT_MS,
  );
});
