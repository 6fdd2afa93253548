// Smoke: RBAC is enforced for a ServiceAccount token from the TokenRequest API.
import { CoreV1Api, RbacAuthorizationV1Api } from '@kubernetes/client-node';
import { isApiError, kubeConfigFor, serviceAccountKubeConfig, uniqueId } from '../../../dev/servers.js';

async function status(call: Promise<unknown>): Promise<number> {
  try {
    await call;
    return 200;
  } catch (err) {
    if (isApiError(err, 403)) return 403;
    throw err;
  }
}

// jest's per-project testTimeout is ignored by jest 29: each hook and test sets its own.
const TIMEOUT_MS = 120_000;

describe('kubernetes RBAC smoke', () => {
  const admin = kubeConfigFor();
  const core = admin.makeApiClient(CoreV1Api);
  const rbac = admin.makeApiClient(RbacAuthorizationV1Api);
  const namespace = uniqueId('smoke-rbac');
  const other = uniqueId('smoke-rbac-other');

  beforeAll(async () => {
    await core.createNamespace({ body: { metadata: { name: namespace } } });
    await core.createNamespace({ body: { metadata: { name: other } } });
  }, TIMEOUT_MS);
  afterAll(async () => {
    await core.deleteNamespace({ name: namespace });
    await core.deleteNamespace({ name: other });
  }, TIMEOUT_MS);

  it(
    'denies a ServiceAccount until a Role and RoleBinding grant it exactly that permission',
    async () => {
      const sa = await serviceAccountKubeConfig(namespace, 'smoke-operator');
      expect(sa.getCurrentUser()?.name).toBe(`system:serviceaccount:${namespace}:smoke-operator`);
      const asSa = sa.makeApiClient(CoreV1Api);

      await expect(status(asSa.listNamespacedConfigMap({ namespace }))).resolves.toBe(403);

      await rbac.createNamespacedRole({
        namespace,
        body: {
          metadata: { name: 'configmap-reader' },
          rules: [{ apiGroups: [''], resources: ['configmaps'], verbs: ['get', 'list', 'watch'] }],
        },
      });
      await rbac.createNamespacedRoleBinding({
        namespace,
        body: {
          metadata: { name: 'smoke-operator-reads-configmaps' },
          roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'configmap-reader' },
          subjects: [{ kind: 'ServiceAccount', name: 'smoke-operator', namespace }],
        },
      });

      // The authorizer sees new bindings through its informers: allow a short propagation delay.
      const deadline = Date.now() + 15_000;
      let code = await status(asSa.listNamespacedConfigMap({ namespace }));
      while (code === 403 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 200));
        code = await status(asSa.listNamespacedConfigMap({ namespace }));
      }
      expect(code).toBe(200);

      // Least privilege: nothing beyond the Role's verbs, and nothing in other namespaces.
      await expect(
        status(asSa.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'nope' } } })),
      ).resolves.toBe(403);
      await expect(status(asSa.listNamespacedConfigMap({ namespace: other }))).resolves.toBe(403);
      await expect(status(asSa.listNamespacedSecret({ namespace }))).resolves.toBe(403);
    },
    TIMEOUT_MS,
  );

  it(
    'rejects a token that the API server did not issue',
    async () => {
      const forged = kubeConfigFor();
      const cluster = forged.getCurrentCluster();
      expect(cluster).not.toBeNull();
      forged.loadFromOptions({
        clusters: cluster ? [cluster] : [],
        users: [{ name: 'forger', token: 'eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl' }],
        contexts: [{ name: 'forger', cluster: cluster?.name ?? '', user: 'forger' }],
        currentContext: 'forger',
      });
      await expect(
        forged.makeApiClient(CoreV1Api).listNamespacedConfigMap({ namespace }),
      ).rejects.toMatchObject({
        code: 401,
      });
    },
    TIMEOUT_MS,
  );
});
