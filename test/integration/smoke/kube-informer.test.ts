// Smoke: a small CRD and a @kubernetes/client-node informer seeing ADDED, MODIFIED and DELETED.
import {
  ApiextensionsV1Api,
  CoreV1Api,
  CustomObjectsApi,
  makeInformer,
  type KubernetesListObject,
  type KubernetesObject,
  type V1CustomResourceDefinition,
} from '@kubernetes/client-node';
import { isApiError, kubeConfigFor, uniqueId } from '../../../dev/servers.js';

const group = 'smoke.flashsale.test';
const version = 'v1';
const plural = 'widgets';

interface Widget extends KubernetesObject {
  spec: { size: number };
}

const crd: V1CustomResourceDefinition = {
  apiVersion: 'apiextensions.k8s.io/v1',
  kind: 'CustomResourceDefinition',
  metadata: { name: `${plural}.${group}` },
  spec: {
    group,
    scope: 'Namespaced',
    names: { plural, singular: 'widget', kind: 'Widget', listKind: 'WidgetList' },
    versions: [
      {
        name: version,
        served: true,
        storage: true,
        schema: {
          openAPIV3Schema: {
            type: 'object',
            properties: {
              spec: {
                type: 'object',
                required: ['size'],
                properties: { size: { type: 'integer', minimum: 1 } },
              },
            },
          },
        },
      },
    ],
  },
};

async function until<T>(
  what: string,
  fn: () => Promise<T | undefined> | T | undefined,
  ms = 30_000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await fn();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// jest's per-project testTimeout is ignored by jest 29: each hook and test sets its own.
const TIMEOUT_MS = 120_000;

describe('kubernetes informer smoke', () => {
  const kc = kubeConfigFor();
  const core = kc.makeApiClient(CoreV1Api);
  const custom = kc.makeApiClient(CustomObjectsApi);
  const namespace = uniqueId('smoke-informer');

  beforeAll(async () => {
    const ext = kc.makeApiClient(ApiextensionsV1Api);
    try {
      await ext.createCustomResourceDefinition({ body: crd });
    } catch (err) {
      if (!isApiError(err, 409)) throw err; // installed by an earlier run against the same server
    }
    await until('CRD Established', async () => {
      const got = await ext.readCustomResourceDefinition({ name: crd.metadata?.name ?? '' });
      return got.status?.conditions?.some((c) => c.type === 'Established' && c.status === 'True')
        ? true
        : undefined;
    });
    await core.createNamespace({ body: { metadata: { name: namespace } } });
  }, TIMEOUT_MS);
  afterAll(async () => {
    await core.deleteNamespace({ name: namespace });
  }, TIMEOUT_MS);

  it(
    'rejects an object that violates the CRD schema',
    async () => {
      const bad = {
        apiVersion: `${group}/${version}`,
        kind: 'Widget',
        metadata: { name: 'bad' },
        spec: { size: 0 },
      };
      await expect(
        custom.createNamespacedCustomObject({ group, version, namespace, plural, body: bad }),
      ).rejects.toMatchObject({
        code: 422,
      });
    },
    TIMEOUT_MS,
  );

  it(
    'delivers ADDED, MODIFIED and DELETED events of a custom object',
    async () => {
      const path = `/apis/${group}/${version}/namespaces/${namespace}/${plural}`;
      const list = async (): Promise<KubernetesListObject<Widget>> =>
        (await custom.listNamespacedCustomObject({
          group,
          version,
          namespace,
          plural,
        })) as KubernetesListObject<Widget>;
      const informer = makeInformer<Widget>(kc, path, list);
      const events: { type: string; name: string | undefined; size: number }[] = [];
      const record = (type: string) => (obj: Widget) =>
        events.push({ type, name: obj.metadata?.name, size: obj.spec.size });
      informer.on('add', record('ADDED'));
      informer.on('update', record('MODIFIED'));
      informer.on('delete', record('DELETED'));
      const errors: unknown[] = [];
      informer.on('error', (err) => errors.push(err));
      await informer.start();
      try {
        const name = uniqueId('w');
        const body: Widget = {
          apiVersion: `${group}/${version}`,
          kind: 'Widget',
          metadata: { name },
          spec: { size: 1 },
        };
        await custom.createNamespacedCustomObject({ group, version, namespace, plural, body });
        await until('ADDED', () => events.find((e) => e.type === 'ADDED' && e.name === name));

        // The generated patch call defaults to JSON-Patch.
        await custom.patchNamespacedCustomObject({
          group,
          version,
          namespace,
          plural,
          name,
          body: [{ op: 'replace', path: '/spec/size', value: 3 }],
        });
        const modified = await until('MODIFIED', () =>
          events.find((e) => e.type === 'MODIFIED' && e.name === name),
        );
        expect(modified.size).toBe(3);
        expect(informer.get(name, namespace)?.spec.size).toBe(3);

        await custom.deleteNamespacedCustomObject({ group, version, namespace, plural, name });
        await until('DELETED', () => events.find((e) => e.type === 'DELETED' && e.name === name));
        expect(informer.get(name, namespace)).toBeUndefined();
        expect(events.map((e) => e.type)).toEqual(['ADDED', 'MODIFIED', 'DELETED']);
        expect(errors).toEqual([]);
      } finally {
        await informer.stop();
      }
    },
    TIMEOUT_MS,
  );
});
