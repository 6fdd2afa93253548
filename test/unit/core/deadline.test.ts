import { DeadlineExceededError, settlesWithin, within } from '../../../core/deadline.js';

const never = new Promise<number>(() => undefined);

describe('deadlines on waits that may never end', () => {
  test('within: the answer when it comes in time, its error as it is', async () => {
    await expect(within(Promise.resolve(7), 50, 'x')).resolves.toBe(7);
    await expect(within(Promise.reject(new Error('refused')), 50, 'x')).rejects.toThrow('refused');
  });

  test('within: a DeadlineExceededError naming the wait when no answer comes', async () => {
    const err = await within(never, 20, 'Kafka lag a.b').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DeadlineExceededError);
    expect((err as Error).message).toBe('Kafka lag a.b: no answer in 20 ms');
  });

  test('settlesWithin: true for an answer or an error in time, false for none', async () => {
    expect(await settlesWithin(Promise.resolve(), 50)).toBe(true);
    expect(await settlesWithin(Promise.reject(new Error('gone')), 50)).toBe(true);
    expect(await settlesWithin(never, 20)).toBe(false);
  });
});
