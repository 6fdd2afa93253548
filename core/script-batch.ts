/**
 * Calls of one script that arrive in one turn of the event loop, sent as one call of its batch
 * script per connection and scope. Under load the api reads several requests per poll phase; a
 * call per request costs it a command to encode, a socket write and a reply to parse, about what
 * the request's own work costs it. The calls queued in one turn go out together from the check
 * phase right after that poll phase (`setImmediate`), so no call waits for a timer or for later
 * requests, and a full batch goes out at once.
 *
 * Each call is answered alone, by the batch's `answer`: its reply, or its own error (mapped by
 * core/errors.ts like any script's code). A batch call that fails (a refusing or unreachable
 * Redis) fails every call it carried, as their own calls would have.
 */
import type { RedisClient, ScriptReply } from './scripts.js';
import { runScript } from './scripts.js';

export interface ScriptBatchSpec<Call, Answer> {
  /** The `-var` script that takes the batch (its keys and arguments, call after call). */
  script: string;
  /** Calls per batch call at most: a bound on one call's keys and on its time in Redis. */
  maxCalls: number;
  /** Arguments that come before every call's own (for example the number of calls). */
  leadingArgs?: (calls: readonly Call[]) => (string | number)[];
  /** Appends one call's keys and arguments. */
  encode: (call: Call, keys: string[], args: (string | number)[]) => void;
  /** Keys that come after every call's own (for example the scope's meta hash, read once). */
  trailingKeys?: (calls: readonly Call[]) => string[];
  /** The answer of the call at `index` in the batch script's reply, or the error it fails with. */
  answer: (reply: ScriptReply, index: number) => Answer | Error;
}

interface Queued<Call, Answer> {
  call: Call;
  resolve: (answer: Answer) => void;
  reject: (err: unknown) => void;
}

/**
 * A function that queues one call in `scope` (the key prefix all its keys share: one slot on a
 * cluster) for this turn's batch call on `redis`.
 */
export function scriptBatch<Call, Answer>(
  spec: ScriptBatchSpec<Call, Answer>,
): (redis: RedisClient, scope: string, call: Call) => Promise<Answer> {
  /** Calls waiting for this turn's batch, by connection and then by scope. */
  const waiting = new Map<RedisClient, Map<string, Queued<Call, Answer>[]>>();
  let flushScheduled = false;

  function send(redis: RedisClient, queued: Queued<Call, Answer>[]): void {
    const keys: string[] = [];
    const args: (string | number)[] = spec.leadingArgs?.(queued.map((q) => q.call)) ?? [];
    for (const q of queued) spec.encode(q.call, keys, args);
    if (spec.trailingKeys) keys.push(...spec.trailingKeys(queued.map((q) => q.call)));
    runScript(redis, spec.script, keys, args).then(
      (reply) => {
        queued.forEach((q, i) => {
          // A reply not of the script's shape fails its calls, never leaves one waiting.
          try {
            const answer = spec.answer(reply, i);
            if (answer instanceof Error) q.reject(answer);
            else q.resolve(answer);
          } catch (err) {
            q.reject(err);
          }
        });
      },
      (err: unknown) => {
        for (const q of queued) q.reject(err);
      },
    );
  }

  function flush(): void {
    flushScheduled = false;
    const batches = [...waiting];
    waiting.clear();
    for (const [redis, byScope] of batches) for (const queued of byScope.values()) send(redis, queued);
  }

  return (redis, scope, call) =>
    new Promise<Answer>((resolve, reject) => {
      let byScope = waiting.get(redis);
      if (!byScope) waiting.set(redis, (byScope = new Map()));
      let queued = byScope.get(scope);
      if (!queued) byScope.set(scope, (queued = []));
      queued.push({ call, resolve, reject });
      if (queued.length === spec.maxCalls) {
        byScope.delete(scope);
        send(redis, queued);
      } else if (!flushScheduled) {
        flushScheduled = true;
        setImmediate(flush);
      }
    });
}
