/**
 * The sold-out fast path's checks (lua/soldOutChecks-var.lua), those of one turn of the event loop
 * in one scope in one call (core/script-batch.ts). Once a SKU is sold out, most of an api's
 * requests are that answer, and each still needs Redis (the replay rule and the buyer's window,
 * core/reservations.ts soldOutCheck). Each check is answered alone: a replay, SOLD_OUT with its
 * window count, or its own RATE_LIMITED.
 */
import { scriptError } from './errors.js';
import { scriptBatch } from './script-batch.js';

/** Checks per call at most: a bound on one call's keys and on its time in Redis. */
export const MAX_CHECKS_PER_CALL = 128;

/**
 * One check's answer: 2 replay (or the scope's cache is going or gone: reserve() answers it, as
 * not loaded), 1 sold out; with the window's points (0: none counted) and rest. */
export interface CheckAnswer {
  code: 1 | 2;
  consumed: number;
  ttlMs: number;
}

export interface SoldOutCheckCall {
  /** The scope's meta hash: the same for every check of one call (one scope). */
  metaKey: string;
  reservationKey: string;
  counterKey: string;
  /** Requests per window; 0 counts nothing. */
  requests: number;
  perSeconds: number;
}

/**
 * Queues one check for this turn's call in `scope` (the key prefix both keys share: one slot on a
 * cluster).
 */
export const checkSoldOut = scriptBatch<SoldOutCheckCall, CheckAnswer>({
  script: 'soldOutChecks',
  maxCalls: MAX_CHECKS_PER_CALL,
  encode: (c, keys, args) => {
    keys.push(c.reservationKey, c.counterKey);
    args.push(c.requests, c.perSeconds);
  },
  // Every check of one call is in one scope: its meta hash is read once.
  trailingKeys: (calls) => [calls[0]!.metaKey],
  answer: (reply, i) => {
    // This check's own Redis error (a refused write), as its own call's ReplyError would be.
    if (String(reply[1 + 3 * i]) === 'ERR')
      return Object.assign(new Error(String(reply[2 + 3 * i])), { name: 'ReplyError' });
    const code = Number(reply[1 + 3 * i]);
    const consumed = Number(reply[2 + 3 * i]);
    const ttlMs = Number(reply[3 + 3 * i]);
    if (code === 1 || code === 2) return { code, consumed, ttlMs };
    return scriptError('soldOutChecks', code, [ttlMs]);
  },
});
