// The guard of core/kafkajs-idle-loop.ts against kafkajs' own RequestQueue: no timer for an idle
// queue, the original scheduling whenever a request waits or a throttle is in force.
import { createRequire } from 'node:module';
import { jest } from '@jest/globals';
import { fixKafkajsIdleLoop } from '../../../core/kafkajs-idle-loop.js';

interface Queue {
  pending: unknown[];
  throttledUntil: number;
  throttleCheckTimeoutId: NodeJS.Timeout | null;
  scheduleCheckPendingRequests(): void;
}

const RequestQueue = createRequire(import.meta.url)('kafkajs/src/network/requestQueue/index.js') as {
  prototype: Queue;
};

function queue(pending: unknown[], throttledUntil: number): Queue {
  const q = Object.create(RequestQueue.prototype) as Queue;
  q.pending = pending;
  q.throttledUntil = throttledUntil;
  q.throttleCheckTimeoutId = null;
  return q;
}

function scheduled(q: Queue): boolean {
  q.scheduleCheckPendingRequests();
  const armed = q.throttleCheckTimeoutId !== null;
  if (q.throttleCheckTimeoutId) clearTimeout(q.throttleCheckTimeoutId);
  return armed;
}

describe('kafkajs request queue idle loop', () => {
  test('unfixed, kafkajs arms a timer for an empty, unthrottled queue (the loop this fixes)', () => {
    // Guards the premise: if a kafkajs upgrade stops doing this, the fix can go. Jest's timers:
    // upstream arms its timer with a negative delay here, which Node's own timers report on the
    // run's output as a TimeoutNegativeWarning.
    const before = RequestQueue.prototype.scheduleCheckPendingRequests;
    jest.useFakeTimers();
    try {
      expect(scheduled(queue([], -1))).toBe(true);
    } finally {
      jest.useRealTimers();
    }
    expect(RequestQueue.prototype.scheduleCheckPendingRequests).toBe(before);
  });

  test('fixed: an empty, unthrottled queue arms no timer', () => {
    expect(fixKafkajsIdleLoop()).toBe(true);
    expect(scheduled(queue([], -1))).toBe(false);
  });

  test('fixed: a waiting request or a throttle still schedules the check', () => {
    fixKafkajsIdleLoop();
    expect(scheduled(queue([{}], -1))).toBe(true);
    expect(scheduled(queue([], Date.now() + 60_000))).toBe(true);
    expect(scheduled(queue([{}], Date.now() + 60_000))).toBe(true);
  });

  test('installing twice wraps once', () => {
    fixKafkajsIdleLoop();
    const once = RequestQueue.prototype.scheduleCheckPendingRequests;
    expect(fixKafkajsIdleLoop()).toBe(true);
    expect(RequestQueue.prototype.scheduleCheckPendingRequests).toBe(once);
  });
});
