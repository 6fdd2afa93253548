/**
 * The sold-out fast path's checks, one script call per scope and turn of the event loop
 * (lua/soldOutChecks-var.lua). Once a SKU is sold out, most of an api's requests are that answer,
 * and each still needs Redis (the replay rule and the buyer's window, core/reservations.ts
 * soldOutCheck). A call per request costs the api a command to encode, a socket write and a reply
 * to parse, about what a reservation costs it; the checks that arrive in one turn of the event
 * loop (the requests Node read in one poll phase) share one call instead, sent from the check
 * phase right after that poll phase, so no request waits for a timer or for later requests.
 *
 * Each check is answered alone: a replay, SOLD_OUT with its window count, or its own
 * RATE_LIMITED (mapped by core/errors.ts like any script's code). A call that fails (a refusing or
 * unreachable Redis) fails every check it carried, as their own calls would have.
 */
import { scriptError } from './errors.js';
import type { RedisClient } from './scripts.js';
import { runScript } from './scripts.js';

/** Checks per call at most: a bound on one call's keys and on its time in Redis. */
export const MAX_CHECKS_PER_CALL = 128;

/** One check's answer: 2 replay, 1 sold out; with the window's points (0: none counted) and rest. */
export interface CheckAnswer {
  code: 1 | 2;
  consumed: number;
  ttlMs: number;
}

interface Check {
  reservationKey: string;
  counterKey: string;
  requests: number;
  perSeconds: number;
  resolve: (answer: CheckAnswer) => void;
  reject: (err: unknown) => void;
}

/** Checks waiting for this turn's call, by connection and then by scope (one slot per scope). */
const waiting = new Map<RedisClient, Map<string, Check[]>>();
let flushScheduled = false;

function send(redis: RedisClient, checks: Check[]): void {
  const keys: string[] = [];
  const args: number[] = [];
  for (const c of checks) {
    keys.push(c.reservationKey, c.counterKey);
    args.push(c.requests, c.perSeconds);
  }
  runScript(redis, 'soldOutChecks', keys, args).then(
    (reply) => {
      checks.forEach((c, i) => {
        const code = Number(reply[1 + 3 * i]);
        const consumed = Number(reply[2 + 3 * i]);
        const ttlMs = Number(reply[3 + 3 * i]);
        if (code === 1 || code === 2) c.resolve({ code, consumed, ttlMs });
        else c.reject(scriptError('soldOutChecks', code, [ttlMs]));
      });
    },
    (err: unknown) => {
      for (const c of checks) c.reject(err);
    },
  );
}

function flush(): void {
  flushScheduled = false;
  const batches = [...waiting];
  waiting.clear();
  for (const [redis, byScope] of batches) for (const checks of byScope.values()) send(redis, checks);
}

/**
 * Queues one check for this turn's call in `scope` (the key prefix both keys share: one slot on a
 * cluster). `requests` 0 counts nothing.
 */
export function checkSoldOut(
  redis: RedisClient,
  scope: string,
  check: { reservationKey: string; counterKey: string; requests: number; perSeconds: number },
): Promise<CheckAnswer> {
  return new Promise<CheckAnswer>((resolve, reject) => {
    let byScope = waiting.get(redis);
    if (!byScope) waiting.set(redis, (byScope = new Map()));
    let checks = byScope.get(scope);
    if (!checks) byScope.set(scope, (checks = []));
    checks.push({ ...check, resolve, reject });
    if (checks.length === MAX_CHECKS_PER_CALL) {
      byScope.delete(scope);
      send(redis, checks);
    } else if (!flushScheduled) {
      flushScheduled = true;
      setImmediate(flush);
    }
  });
}
