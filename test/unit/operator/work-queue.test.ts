import { jest } from '@jest/globals';
import { WorkQueue } from '../../../operator/controller/work-queue.js';

describe('WorkQueue', () => {
  beforeEach(() => {
    jest.useFakeTimers({ now: new Date('2030-01-01T00:00:00Z') });
  });
  afterEach(() => {
    jest.useRealTimers();
  });

  const queue = (depths: number[] = []): WorkQueue =>
    new WorkQueue({ baseDelayMs: 100, maxDelayMs: 1_000, onDepth: (d) => depths.push(d) });

  it('keeps a key once however often it is added, and reports the depth', async () => {
    const depths: number[] = [];
    const q = queue(depths);
    q.add('a');
    q.add('b');
    q.add('a');
    expect(q.depth).toBe(2);
    expect(await q.get()).toBe('a');
    expect(await q.get()).toBe('b');
    expect(q.depth).toBe(0);
    expect(depths).toEqual([1, 2, 1, 0]);
  });

  it('never hands a key to two workers: a key added while processed runs again after done', async () => {
    const q = queue();
    q.add('a');
    const key = await q.get();
    expect(key).toBe('a');
    q.add('a'); // an event arrives while a worker holds the key
    expect(q.depth).toBe(0);
    let second: string | undefined = 'none';
    void q.get().then((k) => {
      second = k;
    });
    await Promise.resolve();
    expect(second).toBe('none');
    q.done('a');
    await Promise.resolve();
    expect(second).toBe('a');
  });

  it('hands a key added later to a waiting worker', async () => {
    const q = queue();
    const waiting = q.get();
    q.add('x');
    await expect(waiting).resolves.toBe('x');
  });

  it('requeues at an instant, exactly, and the earliest requested instant wins', async () => {
    const q = queue();
    const now = Date.now();
    q.addAt('a', now + 5_000);
    q.addAt('a', now + 2_000);
    q.addAt('a', now + 9_000);
    expect(q.scheduledAt('a')).toBe(now + 2_000);
    jest.advanceTimersByTime(1_999);
    expect(q.depth).toBe(0);
    jest.advanceTimersByTime(1);
    expect(q.depth).toBe(1);
    expect(await q.get()).toBe('a');
    q.done('a');
    jest.advanceTimersByTime(10_000);
    expect(q.depth).toBe(0); // the later instants were folded into the earlier one
  });

  it('adds at once when the instant has passed', () => {
    const q = queue();
    q.addAt('a', Date.now() - 1);
    expect(q.depth).toBe(1);
  });

  it('re-arms instants beyond the setTimeout limit instead of firing early', () => {
    const q = queue();
    const far = Date.now() + 40 * 24 * 3600 * 1000; // 40 days
    q.addAt('a', far);
    jest.advanceTimersByTime(2 ** 31 - 1);
    expect(q.depth).toBe(0);
    expect(q.scheduledAt('a')).toBe(far);
    jest.advanceTimersByTime(far - Date.now());
    expect(q.depth).toBe(1);
  });

  it('backs off exponentially per key, capped, and forgets after a success', () => {
    const q = queue();
    expect([1, 2, 3, 4, 5].map(() => q.addRateLimited('a'))).toEqual([100, 200, 400, 800, 1000]);
    expect(q.addRateLimited('b')).toBe(100);
    expect(q.failuresOf('a')).toBe(5);
    q.forget('a');
    expect(q.failuresOf('a')).toBe(0);
    expect(q.addRateLimited('a')).toBe(100);
  });

  it('releases waiting workers and refuses new keys after shutdown', async () => {
    const q = queue();
    const waiting = q.get();
    q.addAfter('later', 1_000);
    q.shutDown();
    await expect(waiting).resolves.toBeUndefined();
    q.add('a');
    jest.advanceTimersByTime(2_000);
    expect(q.depth).toBe(0);
    await expect(q.get()).resolves.toBeUndefined();
  });

  it('hands out no queued key after shutdown: only the passes in flight finish', async () => {
    const q = queue();
    q.add('a');
    q.add('b');
    expect(await q.get()).toBe('a');
    q.shutDown();
    await expect(q.get()).resolves.toBeUndefined();
  });

  it('drop() cancels a key timer and its failures', () => {
    const q = queue();
    q.addRateLimited('a');
    q.drop('a');
    expect(q.failuresOf('a')).toBe(0);
    jest.advanceTimersByTime(5_000);
    expect(q.depth).toBe(0);
  });
});
