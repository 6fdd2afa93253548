import { jest } from '@jest/globals';
import type { Informer, KubernetesObject, ObjectCache } from '@kubernetes/client-node';
import { createLogger } from '../../../core/logger.js';
import { ResilientInformer } from '../../../operator/controller/informer.js';
import type { InformerEvent, ResilientInformerOptions } from '../../../operator/controller/informer.js';

type Callback = (arg: unknown) => void;

/** A stand-in for client-node's informer: records callbacks, lets the test fire them. */
class FakeInformer implements Informer<KubernetesObject>, ObjectCache<KubernetesObject> {
  readonly callbacks = new Map<string, Callback[]>();
  started = 0;
  stopped = 0;
  constructor(public startFails: boolean) {}
  on(verb: string, cb: (arg: never) => void): void {
    this.callbacks.set(verb, [...(this.callbacks.get(verb) ?? []), cb as unknown as Callback]);
  }
  off(): void {}
  /** When set, start() waits for it: the list still running. */
  listing: Promise<void> | undefined;
  async start(): Promise<void> {
    this.started += 1;
    // client-node's ListWatch reports `connect` before it lists, whatever the list then answers.
    this.fire('connect', undefined);
    await this.listing;
    if (this.startFails) this.fire('error', new Error('list failed'));
    else {
      this.store.set('d', obj('d'));
      this.listed = true;
    }
  }
  async stop(): Promise<void> {
    this.stopped += 1;
    this.fire('error', new Error('aborted')); // what client-node does when stopped
  }
  fire(verb: string, arg: unknown): void {
    for (const cb of this.callbacks.get(verb) ?? []) cb(arg);
  }
  /** What this informer's list found (its cache once started). */
  readonly store = new Map<string, KubernetesObject>();
  listed = false;
  get(name: string): KubernetesObject | undefined {
    return this.listed ? this.store.get(name) : undefined;
  }
  list(): readonly KubernetesObject[] {
    return this.listed ? [...this.store.values()] : [];
  }
}

const obj = (name: string): KubernetesObject => ({ metadata: { name, namespace: 'ns' } });
const flush = async (): Promise<void> => {
  for (let i = 0; i < 5; i += 1) await Promise.resolve();
};

describe('ResilientInformer', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  function setup(failFirst: number, configure?: (f: FakeInformer, index: number) => void) {
    const made: FakeInformer[] = [];
    const events: [InformerEvent, string][] = [];
    const informer = new ResilientInformer<KubernetesObject>({
      name: 'test',
      kubeConfig: undefined as unknown as ResilientInformerOptions<KubernetesObject>['kubeConfig'],
      path: '/x',
      list: async () => ({ apiVersion: 'v1', kind: 'List', items: [], metadata: {} }),
      relistMs: 60_000,
      onEvent: (e, o) => events.push([e, o.metadata?.name ?? '']),
      log: createLogger('test', 'silent'),
      minRestartMs: 100,
      maxRestartMs: 400,
      make: () => {
        const f = new FakeInformer(made.length < failFirst);
        configure?.(f, made.length);
        made.push(f);
        return f;
      },
    });
    return { informer, made, events };
  }

  it('restarts a failed informer with a growing backoff until it lists', async () => {
    const { informer, made } = setup(3);
    await informer.start();
    expect(informer.hasSynced).toBe(false);
    expect(made).toHaveLength(1);
    await jest.advanceTimersByTimeAsync(100);
    expect(made).toHaveLength(2);
    await jest.advanceTimersByTimeAsync(199);
    expect(made).toHaveLength(2); // second delay is 200 ms
    await jest.advanceTimersByTimeAsync(1);
    expect(made).toHaveLength(3);
    await jest.advanceTimersByTimeAsync(400);
    expect(made).toHaveLength(4);
    expect(informer.hasSynced).toBe(true);
    expect(made.slice(0, 3).every((f) => f.stopped === 1)).toBe(true);
    await informer.stop();
  });

  it('replaces the informer every relist period and ignores events of replaced ones', async () => {
    const { informer, made, events } = setup(0);
    await informer.start();
    made[0]?.fire('add', obj('a'));
    await jest.advanceTimersByTimeAsync(60_000);
    await flush();
    expect(made).toHaveLength(2);
    expect(made[0]?.stopped).toBe(1);
    made[0]?.fire('update', obj('stale')); // a late event of the replaced informer
    made[1]?.fire('add', obj('a'));
    made[1]?.fire('delete', obj('b'));
    expect(events).toEqual([
      ['add', 'a'],
      ['add', 'a'],
      ['delete', 'b'],
    ]);
    await informer.stop();
    expect(made[1]?.stopped).toBe(1);
    await jest.advanceTimersByTimeAsync(120_000);
    expect(made).toHaveLength(2); // no relist after stop
  });

  it('keeps answering from the replaced cache while the new informer lists, and after it fails', async () => {
    let finishList: () => void = () => undefined;
    const relisting = new Promise<void>((resolve) => (finishList = resolve));
    // The relist's informer (the second) lists slowly, then fails.
    const { informer, made } = setup(0, (f, index) => {
      if (index === 1) Object.assign(f, { listing: relisting, startFails: true });
    });
    await informer.start();
    expect(informer.get('d')?.metadata?.name).toBe('d');
    await jest.advanceTimersByTimeAsync(60_000);
    expect(made).toHaveLength(2);
    expect(informer.get('d')?.metadata?.name).toBe('d'); // still listing: the old cache answers
    expect(informer.list()).toHaveLength(1);
    finishList();
    await flush();
    expect(made[1]?.stopped).toBe(1); // the failed one is dropped
    expect(made[0]?.stopped).toBe(0);
    expect(informer.get('d')?.metadata?.name).toBe('d'); // the old cache answers until one lists
    await jest.advanceTimersByTimeAsync(100); // the restart lists
    expect(made).toHaveLength(3);
    expect(made[0]?.stopped).toBe(1);
    expect(informer.get('d')?.metadata?.name).toBe('d');
    await informer.stop();
  });

  it('starts the backoff over only after an informer ran for the longest delay without failing', async () => {
    const { informer, made } = setup(2);
    await informer.start();
    await jest.advanceTimersByTimeAsync(100 + 200); // two restarts: the third lists
    expect(made).toHaveLength(3);
    expect(informer.hasSynced).toBe(true);
    // Its watch breaks at once: the delay goes on growing (400), not back to 100.
    made[2]?.fire('error', new Error('watch refused'));
    await jest.advanceTimersByTimeAsync(399);
    expect(made).toHaveLength(3);
    await jest.advanceTimersByTimeAsync(1);
    expect(made).toHaveLength(4);
    // This one runs for longer than the longest delay, then breaks: the backoff starts over.
    await jest.advanceTimersByTimeAsync(400);
    made[3]?.fire('error', new Error('watch broke'));
    await jest.advanceTimersByTimeAsync(100);
    expect(made).toHaveLength(5);
    await informer.stop();
  });

  it('says when its cache was first filled, or that it stopped before', async () => {
    const { informer } = setup(1);
    let synced = false;
    await informer.start();
    void informer.whenSynced().then(() => (synced = true));
    await flush();
    expect(synced).toBe(false);
    await jest.advanceTimersByTimeAsync(100);
    expect(synced).toBe(true);
    await informer.whenSynced(); // at once once synced
    await informer.stop();

    const never = setup(99).informer;
    await never.start();
    const waiting = never.whenSynced();
    await never.stop();
    await waiting; // a stopped informer releases its waiters
  });

  it('reports a delete for an object the new list lacks: deleted while no watch ran (a relist, a restart)', async () => {
    const { informer, made, events } = setup(0, (f, index) => {
      if (index === 0) f.store.set('gone', obj('gone'));
    });
    await informer.start();
    expect(informer.get('gone')).toBeDefined();
    // The relist's list: `gone` was deleted between two watches; no watch event said so.
    await jest.advanceTimersByTimeAsync(60_000);
    await flush();
    expect(made).toHaveLength(2);
    expect(events).toEqual([['delete', 'gone']]);
    expect(informer.get('gone')).toBeUndefined();
    await informer.stop();
  });

  it('reports the events of the informer in use while a replacement fails and waits for its restart', async () => {
    // The relist's informer (the second) fails its list; the first keeps watching meanwhile.
    const { informer, made, events } = setup(0, (f, index) => {
      if (index === 1) f.startFails = true;
    });
    await informer.start();
    await jest.advanceTimersByTimeAsync(60_000);
    await flush();
    expect(made).toHaveLength(2);
    made[0]?.fire('delete', obj('d'));
    expect(events).toEqual([['delete', 'd']]);
    await informer.stop();
  });

  it('restarts after a watch error once it was running', async () => {
    const { informer, made } = setup(0);
    await informer.start();
    made[0]?.fire('error', new Error('watch broke'));
    await jest.advanceTimersByTimeAsync(100);
    expect(made).toHaveLength(2);
    await informer.stop();
  });
});
