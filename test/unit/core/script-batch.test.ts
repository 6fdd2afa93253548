// The batcher's own logic (core/script-batch.ts) against a stand-in connection that records the
// calls of the batch script and answers them; the scripts' answers on a real Redis are tested in
// test/integration/invariants/reserve-guards.test.ts.
import { scriptBatch } from '../../../core/script-batch.js';
import type { RedisClient } from '../../../core/scripts.js';

/** A connection whose `fs_soldOutChecks` records each call's keys and answers with `reply`. */
function standIn(reply: (keys: string[]) => unknown) {
  const calls: string[][] = [];
  const redis = {
    defineCommand: () => undefined,
    fs_soldOutChecks: (count: number, ...rest: string[]) => {
      const keys = rest.slice(0, count);
      calls.push(keys);
      return Promise.resolve(reply(keys));
    },
  };
  return { redis: redis as unknown as RedisClient, calls };
}

/** Echoes each call's key as its answer; a key 'bad' is answered with an error, 'throw' breaks. */
const echo = scriptBatch<string, string>({
  script: 'soldOutChecks',
  maxCalls: 3,
  encode: (key, keys) => {
    keys.push(key);
  },
  answer: (reply, i) => {
    const own = String(reply[1 + i]);
    if (own === 'throw') throw new Error('malformed reply');
    return own === 'bad' ? new Error(`refused ${own}`) : own;
  },
});

describe('script batches', () => {
  test('calls of one turn share a call per scope, in order; a full batch goes at once', async () => {
    const { redis, calls } = standIn((keys) => [0, ...keys]);
    const answers = await Promise.all([
      echo(redis, 'a', 'a1'),
      echo(redis, 'b', 'b1'),
      echo(redis, 'a', 'a2'),
      echo(redis, 'a', 'a3'),
      echo(redis, 'a', 'a4'),
    ]);
    expect(answers).toEqual(['a1', 'b1', 'a2', 'a3', 'a4']);
    expect(calls).toEqual([['a1', 'a2', 'a3'], ['b1'], ['a4']]);
    // The next turn is a call of its own.
    expect(await echo(redis, 'a', 'a5')).toBe('a5');
    expect(calls).toHaveLength(4);
  });

  test('each call is answered alone: its error, or a reply it cannot read, fails only it', async () => {
    const { redis } = standIn((keys) => [0, ...keys]);
    const answers = await Promise.allSettled([
      echo(redis, 's', 'ok'),
      echo(redis, 's', 'bad'),
      echo(redis, 's', 'throw'),
    ]);
    expect(answers.map((a) => (a.status === 'fulfilled' ? a.value : (a.reason as Error).message))).toEqual([
      'ok',
      'refused bad',
      'malformed reply',
    ]);
  });

  test('a batch call that fails fails every call it carried', async () => {
    const { redis } = standIn(() => {
      throw new Error('Connection is closed.');
    });
    const answers = await Promise.allSettled([echo(redis, 's', 'x'), echo(redis, 's', 'y')]);
    expect(answers.map((a) => a.status)).toEqual(['rejected', 'rejected']);
  });
});
