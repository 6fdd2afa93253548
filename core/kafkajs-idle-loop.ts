/**
 * kafkajs 2.2.4's request queue re-arms a timer after every answer, even when nothing is pending
 * and no throttle is in force: the delay (throttledUntil − now, negative) becomes 1 ms, so every
 * broker connection polls its empty queue about a thousand times a second for as long as it is
 * open (tulios/kafkajs#1704 and #1751; Node 24 warns "TimeoutNegativeWarning" on the first one).
 * Measured on the test machine: a producer and an admin idle for 10 s cost 5.7 % of a core, 0.5 %
 * with this fix. Upstream has proposed the same guard (tulios/kafkajs#1768) but no release.
 *
 * The fix skips the timer only when the queue is empty and no throttle is in force. Nothing can
 * wait on it then: a request queued later schedules its own check (push() calls
 * scheduleCheckPendingRequests() with pending > 0), an answer checks the queue itself, and a
 * throttle still schedules its check at its end.
 */
import { createRequire } from 'node:module';

interface RequestQueuePrototype {
  pending?: unknown[];
  throttledUntil?: number;
  scheduleCheckPendingRequests(this: RequestQueuePrototype): void;
}

const FIXED = Symbol.for('flashsale.kafkajs-idle-loop-fixed');

type RequestQueueModule = { prototype: RequestQueuePrototype & { [FIXED]?: true } };

/**
 * Installs the guard on kafkajs' RequestQueue (idempotent): the installed one's, or the one given
 * (a test's copy of upstream's). Returns false, changing nothing, when the installed kafkajs has no
 * such method (a version that reorganised it).
 */
export function fixKafkajsIdleLoop(given?: { prototype: object }): boolean {
  let requestQueue: RequestQueueModule;
  try {
    requestQueue = (given ??
      createRequire(import.meta.url)('kafkajs/src/network/requestQueue/index.js')) as RequestQueueModule;
  } catch {
    return false;
  }
  const proto = requestQueue.prototype;
  if (proto[FIXED]) return true;
  const original = proto.scheduleCheckPendingRequests;
  if (typeof original !== 'function') return false;
  proto.scheduleCheckPendingRequests = function scheduleCheckPendingRequests(
    this: RequestQueuePrototype,
  ): void {
    const idle = (this.pending?.length ?? 0) === 0 && !((this.throttledUntil ?? -1) > Date.now());
    if (idle) return;
    original.call(this);
  };
  proto[FIXED] = true;
  return true;
}
