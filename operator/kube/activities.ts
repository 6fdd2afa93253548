/**
 * FlashSaleActivity access. Every patch sets its content type per call (the generated client
 * defaults to JSON-Patch): merge-patch for status, JSON-Patch with a `test` operation for the
 * finalizer list, so a concurrent writer makes the patch fail instead of being overwritten.
 */
import { PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { CustomObjectsApi, KubernetesListObject, KubernetesObject } from '@kubernetes/client-node';
import type { FlashSaleActivity, FlashSaleActivityStatus } from '../api/v1alpha1/types.js';
import { FIELD_MANAGER, FINALIZER, GROUP, PLURAL, VERSION } from '../api/v1alpha1/types.js';

export function isApiStatus(err: unknown, code: number): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === code;
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * An RFC 7386 merge patch turning `from` into `to`: changed keys only, `null` for removed keys,
 * arrays replaced whole. Undefined when nothing changed.
 */
export function mergePatch(from: unknown, to: unknown): Json | undefined {
  if (isObject(from) && isObject(to)) {
    const patch: Record<string, Json> = {};
    for (const key of Object.keys(from)) {
      if (to[key] === undefined && from[key] !== undefined) patch[key] = null;
    }
    for (const [key, value] of Object.entries(to)) {
      if (value === undefined) continue;
      const sub = mergePatch(from[key], value);
      if (sub !== undefined) patch[key] = sub;
    }
    return Object.keys(patch).length > 0 ? patch : undefined;
  }
  if (JSON.stringify(from) === JSON.stringify(to)) return undefined;
  return JSON.parse(JSON.stringify(to ?? null)) as Json;
}

const mergePatchOptions = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
const jsonPatchOptions = setHeaderOptions('Content-Type', PatchStrategy.JsonPatch);

export class ActivityClient {
  constructor(private readonly api: CustomObjectsApi) {}

  async get(namespace: string, name: string): Promise<FlashSaleActivity | undefined> {
    try {
      return (await this.api.getNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace,
        plural: PLURAL,
        name,
      })) as FlashSaleActivity;
    } catch (err) {
      if (isApiStatus(err, 404)) return undefined;
      throw err;
    }
  }

  /** For the informer, which only reads metadata from what it lists. */
  async list(namespace: string | undefined): Promise<KubernetesListObject<KubernetesObject>> {
    const list = namespace
      ? await this.api.listNamespacedCustomObject({
          group: GROUP,
          version: VERSION,
          namespace,
          plural: PLURAL,
        })
      : await this.api.listClusterCustomObject({ group: GROUP, version: VERSION, plural: PLURAL });
    return list as KubernetesListObject<KubernetesObject>;
  }

  /**
   * Writes the status as a merge patch carrying the resourceVersion the status was computed from:
   * a concurrent change makes it fail with 409 (and the pass is retried) instead of going stale.
   * Returns undefined when there was nothing to write.
   */
  async patchStatus(
    fsa: FlashSaleActivity,
    next: FlashSaleActivityStatus,
  ): Promise<FlashSaleActivity | undefined> {
    const diff = mergePatch(fsa.status ?? {}, next);
    if (diff === undefined) return undefined;
    return (await this.api.patchNamespacedCustomObjectStatus(
      {
        group: GROUP,
        version: VERSION,
        namespace: fsa.metadata.namespace,
        plural: PLURAL,
        name: fsa.metadata.name,
        body: { metadata: { resourceVersion: fsa.metadata.resourceVersion }, status: diff },
        fieldManager: FIELD_MANAGER,
      },
      mergePatchOptions,
    )) as FlashSaleActivity;
  }

  async addFinalizer(fsa: FlashSaleActivity): Promise<FlashSaleActivity> {
    const current = fsa.metadata.finalizers;
    const ops = current
      ? [
          { op: 'test', path: '/metadata/finalizers', value: current },
          { op: 'add', path: '/metadata/finalizers/-', value: FINALIZER },
        ]
      : [
          { op: 'test', path: '/metadata/resourceVersion', value: fsa.metadata.resourceVersion },
          { op: 'add', path: '/metadata/finalizers', value: [FINALIZER] },
        ];
    return this.jsonPatch(fsa, ops);
  }

  async removeFinalizer(fsa: FlashSaleActivity): Promise<FlashSaleActivity> {
    const i = fsa.metadata.finalizers?.indexOf(FINALIZER) ?? -1;
    if (i < 0) return fsa;
    return this.jsonPatch(fsa, [
      { op: 'test', path: `/metadata/finalizers/${i}`, value: FINALIZER },
      { op: 'remove', path: `/metadata/finalizers/${i}` },
    ]);
  }

  private async jsonPatch(fsa: FlashSaleActivity, ops: { op: string; path: string; value?: unknown }[]) {
    return (await this.api.patchNamespacedCustomObject(
      {
        group: GROUP,
        version: VERSION,
        namespace: fsa.metadata.namespace,
        plural: PLURAL,
        name: fsa.metadata.name,
        body: ops,
        fieldManager: FIELD_MANAGER,
      },
      jsonPatchOptions,
    )) as FlashSaleActivity;
  }
}
