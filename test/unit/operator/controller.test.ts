// The controller's start and stop (operator/controller/controller.ts) with fake informers: no key
// is passed before every cache was filled; the passes in flight finish with the Deployment cache
// still filled, and no queued key is passed after the stop.
import type { Informer, KubeConfig, KubernetesObject, ObjectCache } from '@kubernetes/client-node';
import { createLogger } from '../../../core/logger.js';
import { createOperatorMetrics } from '../../../core/metrics.js';
import { Controller } from '../../../operator/controller/controller.js';
import type { ControllerOptions } from '../../../operator/controller/controller.js';
import type { ResilientInformerOptions } from '../../../operator/controller/informer.js';

/** An informer that lists `objects` at once and answers from them until stopped. */
class ListedInformer<T extends KubernetesObject> implements Informer<T>, ObjectCache<T> {
  private readonly callbacks = new Map<string, ((arg: unknown) => void)[]>();
  private listed = false;
  constructor(private readonly objects: T[]) {}
  on(verb: string, cb: (arg: never) => void): void {
    this.callbacks.set(verb, [...(this.callbacks.get(verb) ?? []), cb as unknown as (arg: unknown) => void]);
  }
  off(): void {}
  /** When set, the list fails (once reported as client-node does: `connect`, then `error`). */
  listFails = false;
  async start(): Promise<void> {
    for (const cb of this.callbacks.get('connect') ?? []) cb(undefined);
    if (this.listFails) {
      for (const cb of this.callbacks.get('error') ?? []) cb(new Error('the API server answered 429'));
      return;
    }
    this.listed = true;
  }
  async stop(): Promise<void> {
    this.listed = false;
  }
  get(name: string, namespace?: string): T | undefined {
    if (!this.listed) return undefined;
    return this.objects.find((o) => o.metadata?.name === name && o.metadata?.namespace === namespace);
  }
  list(): readonly T[] {
    return this.listed ? this.objects : [];
  }
}

/** What both tests give the controller, with `reconciler` and `makeInformer`. */
const baseOptions = {
  kubeConfig: {} as KubeConfig,
  activities: {},
  apps: {},
  namespaces: ['ns'],
  workers: 1,
  relistMs: 600_000,
  retryBaseMs: 10,
  retryMaxMs: 100,
  metrics: createOperatorMetrics(),
  log: createLogger('test', 'silent'),
};

describe('Controller.start', () => {
  it('passes no key before every cache was filled: a Deployment list that failed once is waited for', async () => {
    const deployment = { metadata: { name: 'flashsale-a-api', namespace: 'ns' } };
    const seenAtStart: (KubernetesObject | undefined)[] = [];
    const ref: { controller?: Controller } = {};
    let deploymentLists = 0;
    const controller = new Controller({
      ...baseOptions,
      reconciler: {
        reconcile: async () => {
          // What scale-runtime reads: absent would apply the runtime afresh (a live sale's pods rolled).
          seenAtStart.push(ref.controller!.deployment('ns', 'flashsale-a-api'));
          return {};
        },
      },
      makeInformer: <T extends KubernetesObject>(o: ResilientInformerOptions<T>) => {
        const informer = new ListedInformer<T>([deployment as unknown as T]);
        if (o.name.startsWith('deployments')) informer.listFails = deploymentLists++ === 0;
        return informer;
      },
    } as unknown as ControllerOptions);
    ref.controller = controller;
    const starting = controller.start();
    controller.queue.add('ns/a');
    await new Promise((r) => setTimeout(r, 100));
    expect(seenAtStart).toEqual([]);
    expect(controller.synced).toBe(false);
    await starting; // the Deployment informer's restart (500 ms later) lists
    for (let i = 0; i < 100 && seenAtStart.length === 0; i += 1) await new Promise((r) => setTimeout(r, 5));
    expect(seenAtStart).toEqual([deployment]);
    expect(deploymentLists).toBe(2);
    await controller.stop();
  });

  it('fails its start, naming the informer, when a list is refused past the cache sync timeout', async () => {
    const passed: string[] = [];
    const controller = new Controller({
      ...baseOptions,
      cacheSyncTimeoutMs: 300,
      reconciler: { reconcile: async (key: string) => (passed.push(key), {}) },
      makeInformer: <T extends KubernetesObject>(o: ResilientInformerOptions<T>) => {
        const informer = new ListedInformer<T>([]);
        informer.listFails = o.name.startsWith('deployments');
        return informer;
      },
    } as unknown as ControllerOptions);
    controller.queue.add('ns/a');
    await expect(controller.start()).rejects.toThrow(
      'informers did not list within the cache sync timeout: deployments/ns',
    );
    expect(passed).toEqual([]);
    await controller.stop();
  });

  it('stopped while waiting for its caches, starts no worker', async () => {
    const passed: string[] = [];
    const controller = new Controller({
      ...baseOptions,
      reconciler: { reconcile: async (key: string) => (passed.push(key), {}) },
      makeInformer: <T extends KubernetesObject>(o: ResilientInformerOptions<T>) => {
        const informer = new ListedInformer<T>([]);
        informer.listFails = o.name.startsWith('deployments');
        return informer;
      },
    } as unknown as ControllerOptions);
    const starting = controller.start();
    controller.queue.add('ns/a');
    await new Promise((r) => setTimeout(r, 50));
    await controller.stop();
    await starting;
    await new Promise((r) => setTimeout(r, 50));
    expect(passed).toEqual([]);
  });
});

describe('Controller.stop', () => {
  it('lets the passes in flight finish with the Deployment cache still filled, and starts no other', async () => {
    const deployment = { metadata: { name: 'flashsale-a-api', namespace: 'ns' } };
    let release = (): void => undefined;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const passed: string[] = [];
    const seenAtEnd: (KubernetesObject | undefined)[] = [];
    const ref: { controller?: Controller } = {};
    const reconciler = {
      reconcile: async (key: string) => {
        passed.push(key);
        await held;
        // What scale-runtime reads at the end of a pass.
        seenAtEnd.push(ref.controller!.deployment('ns', 'flashsale-a-api'));
        return {};
      },
    };
    const options = {
      kubeConfig: {} as KubeConfig,
      activities: {},
      apps: {},
      reconciler,
      namespaces: ['ns'],
      workers: 1,
      relistMs: 600_000,
      retryBaseMs: 10,
      retryMaxMs: 100,
      metrics: createOperatorMetrics(),
      log: createLogger('test', 'silent'),
      makeInformer: <T extends KubernetesObject>() =>
        new ListedInformer<T>(
          // Both informers list it (no event fires); only the Deployment one is read.
          [deployment as unknown as T],
        ),
    } as unknown as ControllerOptions;
    const controller = new Controller(options);
    ref.controller = controller;
    await controller.start();
    controller.queue.add('ns/a');
    controller.queue.add('ns/b');
    for (let i = 0; i < 100 && passed.length === 0; i += 1) await new Promise((r) => setTimeout(r, 5));
    expect(passed).toEqual(['ns/a']);

    const stopped = controller.stop();
    await new Promise((r) => setTimeout(r, 20));
    release();
    await stopped;
    expect(seenAtEnd).toEqual([deployment]);
    expect(passed).toEqual(['ns/a']);
  });
});
