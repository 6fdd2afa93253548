/**
 * The controller: informers on FlashSaleActivities and on the Deployments the operator owns, whose
 * handlers only enqueue a key; workers that take keys from the queue and reconcile them; requeue at
 * the instant the reconcile asks for, rate-limited retries after an error.
 */
import type {
  AppsV1Api,
  Informer,
  KubeConfig,
  KubernetesObject,
  ObjectCache,
  V1Deployment,
} from '@kubernetes/client-node';
import type { Logger } from '../../core/logger.js';
import type { OperatorMetrics } from '../../core/metrics.js';
import { objectKey } from '../api/v1alpha1/funcs.js';
import { GROUP, KIND, PLURAL, VERSION } from '../api/v1alpha1/types.js';
import type { ActivityClient } from '../kube/activities.js';
import type { Reconciler } from '../reconcile/reconciler.js';
import { MANAGED_BY_SELECTOR } from '../reconcile/runtime-objects.js';
import type { InformerEvent, ResilientInformerOptions } from './informer.js';
import { ResilientInformer } from './informer.js';
import { WorkQueue } from './work-queue.js';

export interface ControllerOptions {
  kubeConfig: KubeConfig;
  activities: ActivityClient;
  apps: AppsV1Api;
  reconciler: Reconciler;
  /** The watched namespaces (an informer pair each); empty = every namespace. */
  namespaces: readonly string[];
  workers: number;
  relistMs: number;
  retryBaseMs: number;
  retryMaxMs: number;
  metrics: OperatorMetrics;
  log: Logger;
  /** How long the first lists may take before start() fails (default 2 minutes). */
  cacheSyncTimeoutMs?: number;
  /** Builds each informer (tests substitute a fake); default: client-node's makeInformer. */
  makeInformer?: <T extends KubernetesObject>(o: ResilientInformerOptions<T>) => Informer<T> & ObjectCache<T>;
}

/**
 * What, in a FlashSaleActivity, warrants a reconcile: the spec (generation), deletion, finalizers
 * and annotations. Status-only updates (most of them written by the operator itself) do not.
 */
export function triggerSignature(fsa: KubernetesObject): string {
  const m = fsa.metadata ?? {};
  return JSON.stringify([m.generation, m.deletionTimestamp ?? '', m.finalizers ?? [], m.annotations ?? {}]);
}

export class Controller {
  readonly queue: WorkQueue;
  private readonly activityInformers: ResilientInformer<KubernetesObject>[] = [];
  /** Namespace (or '' for all of them) -> the Deployment informer that sees it. */
  private readonly deploymentInformers = new Map<string, ResilientInformer<V1Deployment>>();
  private readonly seen = new Map<string, string>();
  private readonly workers: Promise<void>[] = [];
  private running = false;

  constructor(private readonly options: ControllerOptions) {
    this.queue = new WorkQueue({
      baseDelayMs: options.retryBaseMs,
      maxDelayMs: options.retryMaxMs,
      onDepth: (d) => options.metrics.workqueueDepth.set(d),
    });
    const scopes: (string | undefined)[] =
      options.namespaces.length > 0 ? [...options.namespaces] : [undefined];
    for (const ns of scopes) {
      this.activityInformers.push(
        new ResilientInformer<KubernetesObject>({
          name: `flashsaleactivities${ns ? `/${ns}` : ''}`,
          kubeConfig: options.kubeConfig,
          path: ns
            ? `/apis/${GROUP}/${VERSION}/namespaces/${ns}/${PLURAL}`
            : `/apis/${GROUP}/${VERSION}/${PLURAL}`,
          list: () => options.activities.list(ns),
          relistMs: options.relistMs,
          onEvent: (event, obj) => this.onActivity(event, obj),
          log: options.log,
          ...(options.makeInformer ? { make: options.makeInformer } : {}),
        }),
      );
      this.deploymentInformers.set(
        ns ?? '',
        new ResilientInformer<V1Deployment>({
          name: `deployments${ns ? `/${ns}` : ''}`,
          kubeConfig: options.kubeConfig,
          path: ns ? `/apis/apps/v1/namespaces/${ns}/deployments` : '/apis/apps/v1/deployments',
          list: () =>
            ns
              ? options.apps.listNamespacedDeployment({ namespace: ns, labelSelector: MANAGED_BY_SELECTOR })
              : options.apps.listDeploymentForAllNamespaces({ labelSelector: MANAGED_BY_SELECTOR }),
          labelSelector: MANAGED_BY_SELECTOR,
          relistMs: options.relistMs,
          onEvent: (_event, obj) => this.onDeployment(obj),
          log: options.log,
          ...(options.makeInformer ? { make: options.makeInformer } : {}),
        }),
      );
    }
  }

  /** The Deployment informer's cache (read by scale-runtime). */
  deployment(namespace: string, name: string): V1Deployment | undefined {
    const informer = this.deploymentInformers.get(namespace) ?? this.deploymentInformers.get('');
    return informer?.get(name, namespace);
  }

  get synced(): boolean {
    return (
      this.activityInformers.every((i) => i.hasSynced) &&
      [...this.deploymentInformers.values()].every((i) => i.hasSynced)
    );
  }

  get isRunning(): boolean {
    return this.running;
  }

  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    const informers = [...this.deploymentInformers.values(), ...this.activityInformers];
    for (const informer of informers) await informer.start();
    // No pass before every cache was filled (client-go's WaitForCacheSync): an informer whose first
    // list failed restarts with a backoff, and a pass reading its empty cache would take a live
    // sale's Deployments for absent and apply them afresh, rolling its pods.
    if (!this.synced) this.options.log.info('waiting for the informers to list before the first pass');
    // Bounded, as controller-runtime's CacheSyncTimeout: a list refused for good (a namespace whose
    // Role is missing) must not hold every other namespace's sales without a word. The caller
    // exits; the Lease moves to a standby, and the restarts show in the pod's status.
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), this.options.cacheSyncTimeoutMs ?? 120_000);
    });
    const synced = await Promise.race([Promise.all(informers.map((i) => i.whenSynced())), timedOut]);
    clearTimeout(timer);
    if (!this.running) return; // stopped while waiting
    if (synced === 'timeout') {
      const waiting = informers.filter((i) => !i.hasSynced).map((i) => i.name);
      throw new Error(`informers did not list within the cache sync timeout: ${waiting.join(', ')}`);
    }
    for (let i = 0; i < this.options.workers; i += 1) this.workers.push(this.work(i));
    this.options.log.info(
      {
        namespaces: this.options.namespaces.length > 0 ? this.options.namespaces.join(',') : '(all)',
        workers: this.options.workers,
      },
      'controller started',
    );
  }

  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    this.queue.shutDown();
    // The passes in flight finish with the informers' cache still filled: a pass that found its
    // Deployments gone from it would apply them afresh (unpinned, or without their owner).
    await Promise.all(this.workers.splice(0));
    await Promise.all([...this.activityInformers, ...this.deploymentInformers.values()].map((i) => i.stop()));
  }

  private onActivity(event: InformerEvent, fsa: KubernetesObject): void {
    const { namespace, name } = fsa.metadata ?? {};
    if (!namespace || !name) return;
    const key = objectKey(namespace, name);
    if (event === 'delete') {
      this.seen.delete(key);
      this.queue.add(key); // clears its metrics
      return;
    }
    const signature = triggerSignature(fsa);
    if (event === 'update' && this.seen.get(key) === signature) return;
    this.seen.set(key, signature);
    this.queue.add(key);
  }

  private onDeployment(d: V1Deployment): void {
    const owner = d.metadata?.ownerReferences?.find((r) => r.kind === KIND && r.controller);
    const ns = d.metadata?.namespace;
    if (owner && ns) this.queue.add(objectKey(ns, owner.name));
  }

  private async work(worker: number): Promise<void> {
    const { metrics, log, reconciler } = this.options;
    for (;;) {
      const key = await this.queue.get();
      if (key === undefined) return;
      const started = process.hrtime.bigint();
      try {
        const result = await reconciler.reconcile(key);
        this.queue.forget(key);
        if (result.requeueAtMs !== undefined) this.queue.addAt(key, result.requeueAtMs);
        metrics.reconcileTotal.inc({ result: result.requeueAtMs !== undefined ? 'requeue' : 'success' });
      } catch (err) {
        const delay = this.queue.addRateLimited(key);
        metrics.reconcileTotal.inc({ result: 'error' });
        metrics.reconcileErrors.inc();
        const conflict = (err as { code?: unknown }).code === 409;
        log[conflict ? 'debug' : 'warn'](
          { key, worker, err: err instanceof Error ? err.message : String(err), retryInMs: delay },
          conflict ? 'reconcile conflict; retrying' : 'reconcile failed; retrying',
        );
      } finally {
        metrics.reconcileDuration.observe(Number(process.hrtime.bigint() - started) / 1e9);
        this.queue.done(key);
      }
    }
  }
}
