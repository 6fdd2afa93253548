// The tenants' ClusterRole (config/rbac/tenant_role.yaml; the chart's `<fullname>-tenant` is a
// copy) on a real API server, bound in a namespace as docs/install.md "Security" says: a tenant
// runs and watches their sales there, and can neither read the runtime Secrets nor create or
// change a workload (which could mount them), nor act in another namespace.
import type { V1ClusterRole } from '@kubernetes/client-node';
import { uniqueId } from '../../../dev/servers.js';
import { admin, canI, installCrd, readYaml } from '../../../dev/operator-harness.js';
import type { Access, Subject } from '../../../dev/operator-harness.js';

const TIMEOUT_MS = 60_000;

describe("the tenants' ClusterRole on the API server", () => {
  const a = admin();
  const namespace = uniqueId('tenant');
  const elsewhere = uniqueId('other');
  const group = uniqueId('shop-team');
  const role = uniqueId('flashsale-tenant');

  beforeAll(async () => {
    await installCrd(a);
    for (const name of [namespace, elsewhere]) await a.core.createNamespace({ body: { metadata: { name } } });
    const shipped = readYaml<V1ClusterRole>('config/rbac/tenant_role.yaml');
    await a.rbac.createClusterRole({ body: { ...shipped, metadata: { ...shipped.metadata, name: role } } });
    // docs/install.md: kubectl create rolebinding <tenant> --clusterrole=<fullname>-tenant --group=<team> -n <namespace>
    await a.rbac.createNamespacedRoleBinding({
      namespace,
      body: {
        metadata: { name: 'tenant' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: role },
        subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: group }],
      },
    });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await a.rbac.deleteClusterRole({ name: role }).catch(() => undefined);
    for (const name of [namespace, elsewhere]) await a.core.deleteNamespace({ name }).catch(() => undefined);
  });

  it(
    'runs and watches sales in its namespace only; no Secret, no workload it could mount one into',
    async () => {
      const tenant: Subject = { user: 'tenant-user', groups: [group, 'system:authenticated'] };
      const can = (access: Access, ns = namespace) => canI(a, tenant, access, ns);
      const granted: Access[] = [
        ['create', 'flashsale.io', 'flashsaleactivities'],
        ['patch', 'flashsale.io', 'flashsaleactivities'],
        ['delete', 'flashsale.io', 'flashsaleactivities'],
        ['get', 'flashsale.io', 'flashsaleactivities', 'status'],
        ['create', '', 'configmaps'],
        ['list', '', 'events'],
        ['list', 'apps', 'deployments'],
        ['get', '', 'pods'],
        ['get', '', 'pods', 'log'],
      ];
      const denied: Access[] = [
        ['get', '', 'secrets'],
        ['list', '', 'secrets'],
        ['create', '', 'pods'],
        ['create', '', 'pods', 'exec'],
        ['create', '', 'pods', 'attach'],
        ['create', '', 'pods', 'portforward'],
        ['create', '', 'pods', 'ephemeralcontainers'],
        ['patch', '', 'pods', 'ephemeralcontainers'],
        ['create', 'apps', 'deployments'],
        ['patch', 'apps', 'deployments'],
        ['patch', 'apps', 'deployments', 'scale'],
        ['create', 'apps', 'statefulsets'],
        ['create', 'apps', 'daemonsets'],
        ['create', 'apps', 'replicasets'],
        ['create', '', 'replicationcontrollers'],
        ['create', 'batch', 'jobs'],
        ['create', 'batch', 'cronjobs'],
        ['create', '', 'serviceaccounts', 'token'],
        ['patch', 'flashsale.io', 'flashsaleactivities', 'status'],
        ['create', 'rbac.authorization.k8s.io', 'rolebindings'],
      ];
      const seen = async (list: Access[], ns?: string) =>
        Promise.all(list.map(async (x) => [x.join(' '), await can(x, ns)] as const));
      expect(await seen(granted)).toEqual(granted.map((x) => [x.join(' '), true]));
      expect(await seen(denied)).toEqual(denied.map((x) => [x.join(' '), false]));
      // Bound in one namespace: nothing in another.
      expect(await seen(granted, elsewhere)).toEqual(granted.map((x) => [x.join(' '), false]));
    },
    TIMEOUT_MS,
  );
});
