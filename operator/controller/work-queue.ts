/**
 * A per-key work queue in the manner of client-go's: a key waits at most once in the queue, is
 * never processed by two workers at once (a key added while it is processed runs again after
 * `done`), failed keys come back after a per-key exponential backoff, and a key can be scheduled
 * for an instant (`addAt`): one timer per key holding the earliest requested instant, so schedule
 * times are met exactly and nothing polls.
 */

export interface WorkQueueOptions {
  /** First retry delay after a failure; doubles per consecutive failure. */
  baseDelayMs: number;
  maxDelayMs: number;
  /** Called whenever the number of waiting keys changes. */
  onDepth?: (depth: number) => void;
}

/** setTimeout's limit (about 24.8 days); longer waits are re-armed when the timer fires. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export class WorkQueue {
  private readonly queue: string[] = [];
  private readonly queued = new Set<string>();
  private readonly processing = new Set<string>();
  private readonly dirty = new Set<string>();
  private readonly failures = new Map<string, number>();
  private readonly timers = new Map<string, { at: number; timer: NodeJS.Timeout }>();
  private readonly waiters: ((key: string | undefined) => void)[] = [];
  private shuttingDown = false;

  constructor(private readonly options: WorkQueueOptions) {}

  get depth(): number {
    return this.queue.length;
  }

  /** Keys waiting for an instant (for diagnostics and tests). */
  scheduledAt(key: string): number | undefined {
    return this.timers.get(key)?.at;
  }

  add(key: string): void {
    if (this.shuttingDown) return;
    if (this.processing.has(key)) {
      this.dirty.add(key);
      return;
    }
    if (this.queued.has(key)) return;
    const waiter = this.waiters.shift();
    if (waiter) {
      this.processing.add(key);
      waiter(key);
      return;
    }
    this.queued.add(key);
    this.queue.push(key);
    this.options.onDepth?.(this.queue.length);
  }

  /** Adds the key at `atMs` (epoch ms); an earlier pending instant for the key wins. */
  addAt(key: string, atMs: number, now = Date.now()): void {
    if (this.shuttingDown) return;
    if (atMs <= now) {
      this.add(key);
      return;
    }
    const existing = this.timers.get(key);
    if (existing && existing.at <= atMs) return;
    if (existing) clearTimeout(existing.timer);
    const delay = Math.min(atMs - now, MAX_TIMER_MS);
    const timer = setTimeout(() => {
      this.timers.delete(key);
      if (Date.now() >= atMs) this.add(key);
      else this.addAt(key, atMs);
    }, delay);
    timer.unref?.();
    this.timers.set(key, { at: atMs, timer });
  }

  addAfter(key: string, delayMs: number): void {
    this.addAt(key, Date.now() + Math.max(0, delayMs));
  }

  /** Re-adds a failed key after its backoff: base * 2^(failures-1), capped. Returns the delay. */
  addRateLimited(key: string): number {
    const n = (this.failures.get(key) ?? 0) + 1;
    this.failures.set(key, n);
    const delay = Math.min(this.options.maxDelayMs, this.options.baseDelayMs * 2 ** Math.min(n - 1, 30));
    this.addAfter(key, delay);
    return delay;
  }

  /** Clears the key's failure count (after a successful pass). */
  forget(key: string): void {
    this.failures.delete(key);
  }

  failuresOf(key: string): number {
    return this.failures.get(key) ?? 0;
  }

  /**
   * Waits for the next key; undefined once the queue shuts down, even with keys still queued: a
   * stopping operator's informers are stopping too, and a pass that read their emptied cache would
   * act on runtime Deployments it no longer sees (the next leader relists and passes every key).
   * Call done(key) afterwards.
   */
  get(): Promise<string | undefined> {
    if (this.shuttingDown) return Promise.resolve(undefined);
    const key = this.queue.shift();
    if (key !== undefined) {
      this.queued.delete(key);
      this.processing.add(key);
      this.options.onDepth?.(this.queue.length);
      return Promise.resolve(key);
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  done(key: string): void {
    this.processing.delete(key);
    if (this.dirty.delete(key)) this.add(key);
  }

  /** Forgets a key entirely (its object was deleted). */
  drop(key: string): void {
    const t = this.timers.get(key);
    if (t) clearTimeout(t.timer);
    this.timers.delete(key);
    this.failures.delete(key);
  }

  shutDown(): void {
    this.shuttingDown = true;
    for (const t of this.timers.values()) clearTimeout(t.timer);
    this.timers.clear();
    for (const w of this.waiters.splice(0)) w(undefined);
  }
}
