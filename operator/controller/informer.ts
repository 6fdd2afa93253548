/**
 * An informer that keeps going. @kubernetes/client-node 1.4's informer stops for good after most
 * errors and its watch can stall silently, so this wrapper (1) restarts it with a backoff after an
 * error, and (2) replaces it with a fresh one (a full relist) every `relistMs`, which re-delivers
 * every object as an `add`. Handlers must only enqueue: the reconcile reads current state itself.
 */
import { makeInformer } from '@kubernetes/client-node';
import type {
  Informer,
  KubeConfig,
  KubernetesListObject,
  KubernetesObject,
  ObjectCache,
} from '@kubernetes/client-node';
import type { Logger } from '../../core/logger.js';

export type InformerEvent = 'add' | 'update' | 'delete';

export interface ResilientInformerOptions<T extends KubernetesObject> {
  name: string;
  kubeConfig: KubeConfig;
  /** Watch path, e.g. /apis/apps/v1/namespaces/ns/deployments. */
  path: string;
  list: () => Promise<KubernetesListObject<T>>;
  labelSelector?: string;
  relistMs: number;
  onEvent: (event: InformerEvent, obj: T) => void;
  log: Logger;
  /** Restart backoff bounds. */
  minRestartMs?: number;
  maxRestartMs?: number;
  /** Builds an informer (tests substitute a fake); default: client-node's makeInformer. */
  make?: (o: ResilientInformerOptions<T>) => Informer<T> & ObjectCache<T>;
}

function defaultMake<T extends KubernetesObject>(
  o: ResilientInformerOptions<T>,
): Informer<T> & ObjectCache<T> {
  return makeInformer<T>(o.kubeConfig, o.path, o.list, o.labelSelector);
}

export class ResilientInformer<T extends KubernetesObject> {
  private current: (Informer<T> & ObjectCache<T>) | undefined;
  private relistTimer: NodeJS.Timeout | undefined;
  private restartTimer: NodeJS.Timeout | undefined;
  private restartDelay: number;
  private stopped = true;
  private syncedOnce = false;
  /** When the informer in use was taken (listed); undefined once it failed. */
  private takenAt: number | undefined;
  private readonly syncWaiters: (() => void)[] = [];
  /** Incremented on every (re)start; events from older informers are ignored. */
  private epoch = 0;

  constructor(private readonly options: ResilientInformerOptions<T>) {
    this.restartDelay = options.minRestartMs ?? 500;
  }

  get name(): string {
    return this.options.name;
  }

  /** True once a list has succeeded (the cache has been filled at least once). */
  get hasSynced(): boolean {
    return this.syncedOnce;
  }

  /**
   * Resolves once a list has filled the cache (client-go's WaitForCacheSync), or once stopped: a
   * pass that read an unfilled cache would take every object for absent.
   */
  whenSynced(): Promise<void> {
    if (this.syncedOnce || this.stopped) return Promise.resolve();
    return new Promise((resolve) => this.syncWaiters.push(resolve));
  }

  private releaseSyncWaiters(): void {
    for (const resolve of this.syncWaiters.splice(0)) resolve();
  }

  get(name: string, namespace?: string): T | undefined {
    return this.current?.get(name, namespace);
  }

  list(namespace?: string): readonly T[] {
    return this.current?.list(namespace) ?? [];
  }

  async start(): Promise<void> {
    this.stopped = false;
    await this.replace('start');
    this.relistTimer = setInterval(() => {
      void this.replace('relist');
    }, this.options.relistMs);
    this.relistTimer.unref?.();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.relistTimer) clearInterval(this.relistTimer);
    if (this.restartTimer) clearTimeout(this.restartTimer);
    this.epoch += 1;
    this.releaseSyncWaiters();
    const old = this.current;
    this.current = undefined;
    if (old) await old.stop().catch(() => undefined);
  }

  private async replace(why: 'start' | 'relist' | 'restart'): Promise<void> {
    if (this.stopped) return;
    const epoch = ++this.epoch;
    const informer = (this.options.make ?? defaultMake)(this.options);
    let failed = false;
    let retired = false;
    // The informer in use stays live while a replacement lists or waits for its restart (a failed
    // relist): its watch still reports what changes, deletes included. Duplicates are harmless
    // (handlers only enqueue).
    const live = (): boolean =>
      !retired && (epoch === this.epoch || informer === this.current) && !this.stopped;
    informer.on('add', (obj) => live() && this.options.onEvent('add', obj));
    informer.on('update', (obj) => live() && this.options.onEvent('update', obj));
    informer.on('delete', (obj) => live() && this.options.onEvent('delete', obj));
    informer.on('error', (err: unknown) => {
      failed = true;
      if (!live()) return; // the old informer reporting its own stop
      this.options.log.warn({ informer: this.options.name, err: String(err) }, 'informer failed; restarting');
      this.scheduleRestart();
    });
    // The informer being replaced keeps answering `get` and `list` until this one has listed: a
    // reconcile in between must find the objects, if a little stale, never none (a Deployment
    // missing from the cache reads as "not there yet" and would be applied again).
    const old = this.current;
    // start() resolves after the list and once the watch is open (or after reporting an error).
    await informer.start().catch((err: unknown) => {
      failed = true;
      if (live()) {
        this.options.log.warn({ informer: this.options.name, err: String(err) }, 'informer start failed');
        this.scheduleRestart();
      }
    });
    if (!failed && live()) {
      this.current = informer;
      this.syncedOnce = true;
      this.takenAt = Date.now();
      this.releaseSyncWaiters();
      this.options.log.debug({ informer: this.options.name, why }, 'informer listed and watching');
      if (old) {
        // Objects deleted while no watch ran (between the old informer's last event and this list)
        // get no event from a fresh informer; client-go's Replace reports them as deletes too.
        for (const o of old.list()) {
          const { name, namespace } = o.metadata ?? {};
          if (name !== undefined && informer.get(name, namespace) === undefined)
            this.options.onEvent('delete', o);
        }
        await old.stop().catch(() => undefined);
      }
      return;
    }
    // Not taken: it failed (a restart is scheduled; the previous cache answers until one lists),
    // or the wrapper was stopped or another replacement began meanwhile.
    retired = true;
    await informer.stop().catch(() => undefined);
  }

  private scheduleRestart(): void {
    if (this.stopped || this.restartTimer) return;
    // The backoff starts over only after an informer ran for the longest delay without failing
    // (client-go's reflector resets its backoff after a healthy period too). Not on `connect`:
    // client-node reports it before each list, so a list or watch refused for good (429s, a
    // missing `watch` right) would be retried every minRestartMs, each a full LIST.
    const maxDelay = this.options.maxRestartMs ?? 30_000;
    if (this.takenAt !== undefined && Date.now() - this.takenAt >= maxDelay)
      this.restartDelay = this.options.minRestartMs ?? 500;
    this.takenAt = undefined;
    const delay = this.restartDelay;
    this.restartDelay = Math.min(maxDelay, this.restartDelay * 2);
    this.restartTimer = setTimeout(() => {
      this.restartTimer = undefined;
      void this.replace('restart');
    }, delay);
    this.restartTimer.unref?.();
  }
}
