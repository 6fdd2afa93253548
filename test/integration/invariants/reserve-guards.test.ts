// Every guard of the Lua scripts at its boundary, with explicit expected answers, on the real Redis
// through core/reservations.ts and core/activity-cache.ts: quantities at and above each limit,
// several units in one request, each refusal condition alone. The model-based test
// (scripts-model.test.ts) explores sequences; this file pins the rules a reader can check by eye.
// Each describe block is named by a mutant in test/faults/mutants/ (docs/mutants-report.md).
import { Redis } from 'ioredis';
import { RateLimiterRedis } from 'rate-limiter-flexible';
import { LOAD_CHUNK, loadActivity, readStock, setGate } from '../../../core/activity-cache.js';
import { FlashSaleError } from '../../../core/errors.js';
import { activityKeys } from '../../../core/keys.js';
import type { CatalogItem, GateState } from '../../../core/model.js';
import {
  cancelBeforeReserve,
  confirmPaid,
  locateReservation,
  retryAfterMs,
  readReservation,
  release,
  RESERVATIONS_PER_CALL,
  reservationIdFor,
  reserve,
  soldOutCheck,
} from '../../../core/reservations.js';
import type { BuyerWindow } from '../../../core/reservations.js';
import { registerScripts, runScript } from '../../../core/scripts.js';
import { MAX_CHECKS_PER_CALL } from '../../../core/sold-out-checks.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';

const TIMEOUT_MS = 60_000;

describe('script guards at their boundaries (real Redis)', () => {
  let redis: Redis;
  /** The window's rest the last RATE_LIMITED carried. */
  let lastRetryMs = 0;
  beforeAll(() => {
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 2 });
  });
  afterAll(async () => {
    await redis.quit();
  });

  const item = (skuId: string, stock: number, limitPerUser: number): CatalogItem => ({
    skuId,
    name: `item ${skuId}`,
    price: '10.00',
    stock,
    limitPerUser,
  });

  /** An activity definition (a fresh id, `generation` 1) whose sale window is open now. */
  const definition = (items: CatalogItem[], reopenOnRelease = true) => ({
    id: uniqueId('guard'),
    generation: 1,
    startAt: new Date(Date.now() - 60_000),
    endAt: new Date(Date.now() + 3_600_000),
    requireOrderCode: false,
    reopenOnRelease,
    items,
  });

  /** A loaded activity with its gate open; `generation` 1. */
  async function activity(items: CatalogItem[], gate: GateState = 'open', reopenOnRelease = true) {
    const def = definition(items, reopenOnRelease);
    const id = def.id;
    await loadActivity(redis, def);
    if (gate !== 'pending') await setGate(redis, id, gate);
    const buy = (userId: string, requestId: string, skuId: string, quantity: number) =>
      outcome(() => reserve(redis, { activityId: id, userId, skuId, quantity, requestId, traceId: 't' }));
    const rid = (userId: string, requestId: string) => reservationIdFor(id, userId, requestId);
    const rel = (userId: string, requestId: string, skuId: string) =>
      outcome(() =>
        release(redis, {
          activityId: id,
          reservationId: rid(userId, requestId),
          userId,
          skuId,
          reason: 'TEST',
        }),
      );
    const stock = async (skuId: string) => Number(await redis.hget(activityKeys(id).sku(skuId), 'stock'));
    const cancel = (userId: string, requestId: string) =>
      outcome(() => cancelBeforeReserve(redis, { activityId: id, userId, requestId, reason: 'CANCELLED' }));
    return { id, def, buy, rid, rel, stock, cancel };
  }

  /**
   * A connection of its own whose calls of a batched `-var` script are counted where the client
   * sends them: `calls` gets each call's number of submissions (its keys / `keysPerCall`).
   */
  function countingCalls(
    script: string,
    keysPerCall: number,
    keysPerBatch = 0,
  ): { own: Redis; calls: number[] } {
    const own = redis.duplicate();
    registerScripts(own);
    const calls: number[] = [];
    const commands = own as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
    const invoke = commands[`fs_${script}`]!;
    commands[`fs_${script}`] = (...args: unknown[]) => {
      calls.push((Number(args[0]) - keysPerBatch) / keysPerCall);
      return invoke.apply(own, args);
    };
    return { own, calls };
  }

  /** `ok:<kind>` or the error code: what the caller of the script sees. */
  async function outcome(call: () => Promise<{ kind: string }>): Promise<string> {
    try {
      return `ok:${(await call()).kind}`;
    } catch (err) {
      if (err instanceof FlashSaleError) {
        if (err.code === 'RATE_LIMITED') lastRetryMs = retryAfterMs(err);
        return err.code;
      }
      throw err;
    }
  }

  describe('per-buyer limit counted in units', () => {
    test(
      'limit 3: two units then two more is refused (4 > 3); then exactly the limit (2 + 1) is taken',
      async () => {
        const a = await activity([item('s', 10, 3)]);
        expect(await a.buy('u', 'r1', 's', 2)).toBe('ok:reserved');
        expect(await a.buy('u', 'r2', 's', 2)).toBe('LIMIT_REACHED');
        expect(await a.stock('s')).toBe(8);
        expect(await a.buy('u', 'r3', 's', 1)).toBe('ok:reserved');
        expect(await a.buy('u', 'r4', 's', 1)).toBe('LIMIT_REACHED');
        expect(await a.stock('s')).toBe(7);
      },
      TIMEOUT_MS,
    );

    test(
      'one request for the whole limit is taken; one unit above it is refused and changes nothing',
      async () => {
        const a = await activity([item('s', 10, 3)]);
        expect(await a.buy('u1', 'r', 's', 3)).toBe('ok:reserved');
        expect(await a.buy('u2', 'r', 's', 4)).toBe('LIMIT_REACHED');
        expect(await redis.exists(activityKeys(a.id).reservation(a.rid('u2', 'r')))).toBe(0);
        expect(await a.stock('s')).toBe(7);
      },
      TIMEOUT_MS,
    );

    test(
      'limit 1: the first unit is taken (at the limit), a second request is refused; other buyers and skus are apart',
      async () => {
        const a = await activity([item('s', 10, 1), item('t', 10, 1)]);
        expect(await a.buy('u', 'r1', 's', 1)).toBe('ok:reserved');
        expect(await a.buy('u', 'r2', 's', 1)).toBe('LIMIT_REACHED');
        expect(await a.buy('u', 'r3', 't', 1)).toBe('ok:reserved');
        expect(await a.buy('v', 'r1', 's', 1)).toBe('ok:reserved');
      },
      TIMEOUT_MS,
    );

    test(
      'limit 12: slots 1 to 12 in order, released slots taken again, no thirteenth',
      async () => {
        const a = await activity([item('s', 20, 12)]);
        const buyerKey = activityKeys(a.id).buyer('u');
        const slotOf = async (): Promise<Record<string, string>> => {
          const fields = await redis.hgetall(buyerKey);
          return Object.fromEntries(Object.entries(fields).filter(([f]) => f.startsWith('s:slot:')));
        };
        for (let i = 1; i <= 12; i += 1) expect(await a.buy('u', `r${i}`, 's', 1)).toBe('ok:reserved');
        expect(await a.buy('u', 'r13', 's', 1)).toBe('LIMIT_REACHED');
        const taken = await slotOf();
        for (let i = 1; i <= 12; i += 1) expect(taken[`s:slot:${i}`]).toBe(a.rid('u', `r${i}`));
        expect(Object.keys(taken)).toHaveLength(12);
        expect(await a.rel('u', 'r3', 's')).toBe('ok:released');
        expect(await a.rel('u', 'r10', 's')).toBe('ok:released');
        expect(await a.buy('u', 'r14', 's', 1)).toBe('ok:reserved');
        expect(await a.buy('u', 'r15', 's', 1)).toBe('ok:reserved');
        expect(await a.buy('u', 'r16', 's', 1)).toBe('LIMIT_REACHED');
        const again = await slotOf();
        expect(again['s:slot:3']).toBe(a.rid('u', 'r14'));
        expect(again['s:slot:10']).toBe(a.rid('u', 'r15'));
        expect(Object.keys(again)).toHaveLength(12);
        expect(await a.stock('s')).toBe(8);
      },
      TIMEOUT_MS,
    );

    test(
      'a release gives the units back with reopenOnRelease, and does not without it',
      async () => {
        const open = await activity([item('s', 10, 2)]);
        expect(await open.buy('u', 'r1', 's', 2)).toBe('ok:reserved');
        expect(await open.rel('u', 'r1', 's')).toBe('ok:released');
        expect(await open.buy('u', 'r2', 's', 2)).toBe('ok:reserved');
        const shut = await activity([item('s', 10, 2)], 'open', false);
        expect(await shut.buy('u', 'r1', 's', 2)).toBe('ok:reserved');
        expect(await shut.rel('u', 'r1', 's')).toBe('ok:released');
        expect(await shut.buy('u', 'r2', 's', 1)).toBe('LIMIT_REACHED');
      },
      TIMEOUT_MS,
    );
  });

  describe('per-buyer rate limit counted by the reserve script', () => {
    const window: BuyerWindow = { requests: 3, perSeconds: 600 };
    /** A submission counted in the buyer's window, as the api's submit route sends it. */
    const submit = (id: string, userId: string, requestId: string, skuId: string, quantity = 1) =>
      outcome(() =>
        reserve(redis, { activityId: id, userId, skuId, quantity, requestId, traceId: 't', window }),
      );
    const counter = (id: string, userId: string) => activityKeys(id).rateLimitKey('buyer', userId);

    test(
      'every new submission counts whatever its answer; the one past the limit is RATE_LIMITED and changes nothing',
      async () => {
        const a = await activity([item('s', 10, 1)]);
        expect(await submit(a.id, 'u', 'r1', 's')).toBe('ok:reserved');
        expect(await submit(a.id, 'u', 'r2', 's')).toBe('LIMIT_REACHED');
        expect(await submit(a.id, 'u', 'r3', 'nope')).toBe('UNKNOWN_SKU');
        lastRetryMs = 0;
        expect(await submit(a.id, 'u', 'r4', 's')).toBe('RATE_LIMITED');
        expect(lastRetryMs).toBeGreaterThan(0);
        expect(lastRetryMs).toBeLessThanOrEqual(600_000);
        // Counted past the limit, as rate-limiter-flexible counts; the window has a TTL.
        expect(await redis.get(counter(a.id, 'u'))).toBe('4');
        const ttl = await redis.pttl(counter(a.id, 'u'));
        expect(ttl).toBeGreaterThan(0);
        expect(ttl).toBeLessThanOrEqual(600_000);
        expect(await redis.exists(activityKeys(a.id).reservation(a.rid('u', 'r4')))).toBe(0);
        expect(await a.stock('s')).toBe(9);
        // Other buyers have their own window.
        expect(await submit(a.id, 'v', 'r1', 's')).toBe('ok:reserved');
      },
      TIMEOUT_MS,
    );

    test(
      'the limit comes before the gate and before sold-out: a bot cannot hammer either for free',
      async () => {
        const closed = await activity([item('s', 10, 1)], 'pending');
        for (const r of ['r1', 'r2', 'r3'])
          expect(await submit(closed.id, 'bot', r, 's')).toBe('NOT_STARTED');
        expect(await submit(closed.id, 'bot', 'r4', 's')).toBe('RATE_LIMITED');
        const gone = await activity([item('s', 1, 1)]);
        expect(await submit(gone.id, 'u', 'r1', 's')).toBe('ok:reserved');
        for (const r of ['r1', 'r2', 'r3']) expect(await submit(gone.id, 'bot', r, 's')).toBe('SOLD_OUT');
        expect(await submit(gone.id, 'bot', 'r4', 's')).toBe('RATE_LIMITED');
      },
      TIMEOUT_MS,
    );

    test(
      'a replay is answered first and counts nothing, even with the window used up',
      async () => {
        const a = await activity([item('s', 10, 2)]);
        expect(await submit(a.id, 'u', 'r1', 's')).toBe('ok:reserved');
        expect(await submit(a.id, 'u', 'r2', 's')).toBe('ok:reserved');
        expect(await submit(a.id, 'u', 'r3', 's')).toBe('LIMIT_REACHED');
        expect(await submit(a.id, 'u', 'r4', 's')).toBe('RATE_LIMITED');
        expect(await submit(a.id, 'u', 'r1', 's')).toBe('ok:replayed');
        expect(await submit(a.id, 'u', 'r2', 's')).toBe('ok:replayed');
        expect(await redis.get(counter(a.id, 'u'))).toBe('4');
      },
      TIMEOUT_MS,
    );

    test(
      'a resubmission refused as CANCELLED or IDEMPOTENCY_CONFLICT counts like any refusal; a replay still counts nothing',
      async () => {
        const a = await activity([item('s', 10, 2), item('t', 10, 2)]);
        // A cancellation that arrived before its submission: the submission, sent again and again
        // under the cancelled id, spends the window as a sold-out SKU would.
        expect(await a.cancel('bot', 'x')).toBe('ok:marked');
        for (let i = 0; i < 3; i += 1) expect(await submit(a.id, 'bot', 'x', 's')).toBe('CANCELLED');
        expect(await submit(a.id, 'bot', 'x', 's')).toBe('RATE_LIMITED');
        expect(await redis.get(counter(a.id, 'bot'))).toBe('4');
        // An id reused for another SKU or quantity.
        expect(await submit(a.id, 'k', 'y', 's')).toBe('ok:reserved');
        expect(await submit(a.id, 'k', 'y', 't')).toBe('IDEMPOTENCY_CONFLICT');
        expect(await submit(a.id, 'k', 'y', 's', 2)).toBe('IDEMPOTENCY_CONFLICT');
        expect(await submit(a.id, 'k', 'y', 't')).toBe('RATE_LIMITED');
        expect(await submit(a.id, 'k', 'y', 's')).toBe('ok:replayed');
        expect(await redis.get(counter(a.id, 'k'))).toBe('4');
        expect(await a.stock('s')).toBe(9);
      },
      TIMEOUT_MS,
    );

    test(
      'the reserved outcome carries the window; the last point of the window says so',
      async () => {
        const a = await activity([item('s', 10, 3)]);
        const first = await reserve(redis, {
          activityId: a.id,
          userId: 'u',
          skuId: 's',
          quantity: 1,
          requestId: 'r1',
          traceId: 't',
          window,
        });
        expect(first.counted?.consumed).toBe(1);
        await reserve(redis, {
          activityId: a.id,
          userId: 'u',
          skuId: 's',
          quantity: 1,
          requestId: 'r2',
          traceId: 't',
          window,
        });
        const last = await reserve(redis, {
          activityId: a.id,
          userId: 'u',
          skuId: 's',
          quantity: 1,
          requestId: 'r3',
          traceId: 't',
          window,
        });
        expect(last.counted?.consumed).toBe(3);
        expect(last.counted?.ttlMs).toBeGreaterThan(0);
        // Without a window nothing is counted (shaping off, or counted elsewhere).
        const other = await reserve(redis, {
          activityId: a.id,
          userId: 'v',
          skuId: 's',
          quantity: 1,
          requestId: 'r1',
          traceId: 't',
        });
        expect(other.counted).toBeUndefined();
        expect(await redis.exists(counter(a.id, 'v'))).toBe(0);
      },
      TIMEOUT_MS,
    );

    test(
      'one window with rate-limiter-flexible: the library (order codes, registrations) and the script share the counter',
      async () => {
        const a = await activity([item('s', 10, 3)]);
        const library = new RateLimiterRedis({
          storeClient: redis,
          keyPrefix: activityKeys(a.id).rateLimitPrefix('buyer'),
          points: window.requests,
          duration: window.perSeconds,
        });
        await library.consume('u');
        await library.consume('u');
        expect(await submit(a.id, 'u', 'r1', 's')).toBe('ok:reserved');
        expect(await submit(a.id, 'u', 'r2', 's')).toBe('RATE_LIMITED');
        await expect(library.consume('u')).rejects.toMatchObject({ consumedPoints: 5 });
        // Points given back by the library (a 5xx) are points for the script: 5 - 3 = 2 used.
        await library.reward('u', 3);
        expect(await submit(a.id, 'u', 'r3', 's')).toBe('ok:reserved');
      },
      TIMEOUT_MS,
    );

    test(
      'the sold-out check: a replay first and free, then one point, then RATE_LIMITED',
      async () => {
        const a = await activity([item('s', 1, 1)]);
        const check = (userId: string, requestId: string) =>
          outcome(() => soldOutCheck(redis, { activityId: a.id, userId, skuId: 's', requestId, window }));
        expect(await submit(a.id, 'u', 'r1', 's')).toBe('ok:reserved');
        expect(await check('u', 'r1')).toBe('ok:replay');
        expect(await redis.get(counter(a.id, 'u'))).toBe('1');
        expect(await check('u', 'r2')).toBe('ok:sold-out');
        expect(await check('u', 'r3')).toBe('ok:sold-out');
        expect(await check('u', 'r4')).toBe('RATE_LIMITED');
        // Still the replay, window used up or not.
        expect(await check('u', 'r1')).toBe('ok:replay');
        expect(await redis.get(counter(a.id, 'u'))).toBe('4');
        // Without a window: only the replay check, no counter written.
        expect(
          await outcome(() =>
            soldOutCheck(redis, { activityId: a.id, userId: 'w', skuId: 's', requestId: 'r' }),
          ),
        ).toBe('ok:sold-out');
        expect(await redis.exists(counter(a.id, 'w'))).toBe(0);
      },
      TIMEOUT_MS,
    );

    test(
      'sold-out checks of one turn share one script call, each answered as its own call would be',
      async () => {
        const a = await activity([item('s', 1, 1)]);
        expect(await submit(a.id, 'u', 'r1', 's')).toBe('ok:reserved');
        // Two keys per check, and the scope's meta hash once per call.
        const { own, calls } = countingCalls('soldOutChecks', 2, 1);
        try {
          const check = (userId: string, requestId: string, w: BuyerWindow = window) =>
            outcome(() => soldOutCheck(own, { activityId: a.id, userId, skuId: 's', requestId, window: w }));
          // Started in one turn: one call, answered in order (v's four count 1, 2, 3, 4 > 3).
          lastRetryMs = 0;
          const answers = await Promise.all([
            check('u', 'r1'),
            check('v', 'a'),
            check('v', 'b'),
            check('w', 'x', { requests: 0, perSeconds: 0 }),
            check('v', 'c'),
            check('v', 'd'),
          ]);
          expect(answers).toEqual([
            'ok:replay',
            'ok:sold-out',
            'ok:sold-out',
            'ok:sold-out',
            'ok:sold-out',
            'RATE_LIMITED',
          ]);
          expect(lastRetryMs).toBeGreaterThan(0);
          expect(calls).toEqual([6]);
          expect(await redis.get(counter(a.id, 'u'))).toBe('1');
          expect(await redis.get(counter(a.id, 'v'))).toBe('4');
          expect(await redis.exists(counter(a.id, 'w'))).toBe(0);
          // More than one call holds: MAX_CHECKS_PER_CALL each, every check answered.
          calls.length = 0;
          const many = await Promise.all(
            Array.from({ length: MAX_CHECKS_PER_CALL + 2 }, (_, i) => check(`m${i}`, 'r')),
          );
          expect(many.filter((x) => x === 'ok:sold-out')).toHaveLength(MAX_CHECKS_PER_CALL + 2);
          expect(calls).toEqual([MAX_CHECKS_PER_CALL, 2]);
          // A call that fails fails every check it carried (none left waiting).
          await own.quit();
          const failed = await Promise.allSettled([check('x', 'a'), check('y', 'a')]);
          expect(failed.map((f) => f.status)).toEqual(['rejected', 'rejected']);
        } finally {
          if (own.status !== 'end') own.disconnect();
        }
      },
      TIMEOUT_MS,
    );

    test(
      'reservations of one turn share one script call, each answered as its own call would be',
      async () => {
        const a = await activity([item('s', 3, 2), item('t', 200, 1)]);
        const { own, calls } = countingCalls('reserveMany', 9);
        try {
          const buy = (userId: string, requestId: string, skuId = 's', w: BuyerWindow | undefined = window) =>
            outcome(() =>
              reserve(own, {
                activityId: a.id,
                userId,
                skuId,
                quantity: 1,
                requestId,
                traceId: 't',
                window: w,
              }),
            );
          // A buyer whose hash is of the wrong type: its own reservation fails, no other.
          await redis.set(activityKeys(a.id).buyer('broken'), 'x');
          lastRetryMs = 0;
          const answers = await Promise.allSettled([
            buy('u', 'r1'),
            buy('u', 'r1'),
            buy('u', 'r2'),
            buy('broken', 'r1'),
            buy('u', 'r3'),
            buy('v', 'r1'),
            buy('w', 'r1', 's', { requests: 0, perSeconds: 0 }),
            buy('u', 'r4', 't'),
          ]);
          expect(answers.map((x) => (x.status === 'fulfilled' ? x.value : String(x.reason)))).toEqual([
            'ok:reserved',
            'ok:replayed',
            'ok:reserved',
            expect.stringMatching(/^ReplyError: WRONGTYPE /),
            'LIMIT_REACHED',
            'ok:reserved',
            'SOLD_OUT',
            'RATE_LIMITED',
          ]);
          expect(calls).toEqual([8]);
          expect(lastRetryMs).toBeGreaterThan(0);
          // As one call after another: u counted 4 (the replay free), v 1, w not at all.
          expect(await redis.get(counter(a.id, 'u'))).toBe('4');
          expect(await redis.get(counter(a.id, 'v'))).toBe('1');
          expect(await redis.exists(counter(a.id, 'w'))).toBe(0);
          expect(await a.stock('s')).toBe(0);
          const s = await readStock(redis, a.id);
          expect([s.reserved, s.reservations]).toEqual([3, 3]);
          expect(await redis.xlen(activityKeys(a.id).outbox)).toBe(3);
          // More than one call holds: RESERVATIONS_PER_CALL each, every reservation answered.
          calls.length = 0;
          const many = await Promise.all(
            Array.from({ length: RESERVATIONS_PER_CALL + 2 }, (_, i) => buy(`m${i}`, 'r', 't')),
          );
          expect(many.filter((x) => x === 'ok:reserved')).toHaveLength(RESERVATIONS_PER_CALL + 2);
          expect(calls).toEqual([RESERVATIONS_PER_CALL, 2]);
          expect(await a.stock('t')).toBe(200 - RESERVATIONS_PER_CALL - 2);
          // A call that fails fails every reservation it carried (none left waiting).
          await own.quit();
          const failed = await Promise.allSettled([buy('x', 'a', 't'), buy('y', 'a', 't')]);
          expect(failed.map((f) => f.status)).toEqual(['rejected', 'rejected']);
        } finally {
          if (own.status !== 'end') own.disconnect();
        }
      },
      TIMEOUT_MS,
    );

    test(
      "a bucketed SKU counts once in the activity's counter (its own call), replays and refills included",
      async () => {
        const a = await activity([{ ...item('hot', 6, 1), buckets: 3 }]);
        expect(await submit(a.id, 'u', 'r1', 'hot')).toBe('ok:reserved');
        expect(await redis.get(counter(a.id, 'u'))).toBe('1');
        expect(await submit(a.id, 'u', 'r2', 'hot')).toBe('LIMIT_REACHED');
        expect(await submit(a.id, 'u', 'r3', 'hot')).toBe('LIMIT_REACHED');
        expect(await submit(a.id, 'u', 'r4', 'hot')).toBe('RATE_LIMITED');
        expect(await redis.get(counter(a.id, 'u'))).toBe('4');
        // Buyers drain every bucket (refills move units between buckets): one point each.
        for (let i = 0; i < 5; i += 1) expect(await submit(a.id, `b${i}`, 'r', 'hot')).toBe('ok:reserved');
        expect(await submit(a.id, 'late', 'r', 'hot')).toBe('SOLD_OUT');
        for (const b of ['b0', 'b1', 'b2', 'b3', 'b4', 'late'])
          expect(await redis.get(counter(a.id, b))).toBe('1');
      },
      TIMEOUT_MS,
    );
  });

  describe('stock never oversold', () => {
    test(
      'a request for exactly the stock left is taken; one unit more is SOLD_OUT and changes nothing',
      async () => {
        const a = await activity([item('s', 3, 5)]);
        expect(await a.buy('u1', 'r', 's', 4)).toBe('SOLD_OUT');
        expect(await a.stock('s')).toBe(3);
        expect(await a.buy('u1', 'r2', 's', 3)).toBe('ok:reserved');
        expect(await a.stock('s')).toBe(0);
        expect(await a.buy('u2', 'r', 's', 1)).toBe('SOLD_OUT');
        const s = await readStock(redis, a.id);
        expect([s.remaining, s.reserved, s.reservations]).toEqual([0, 3, 1]);
      },
      TIMEOUT_MS,
    );

    test(
      'two units against one left: SOLD_OUT, not a negative stock',
      async () => {
        const a = await activity([item('s', 1, 3)]);
        expect(await a.buy('u', 'r', 's', 2)).toBe('SOLD_OUT');
        expect(await a.stock('s')).toBe(1);
      },
      TIMEOUT_MS,
    );
  });

  describe('half message with every reservation', () => {
    test(
      'each reservation appends exactly one outbox entry naming it, with price and name from the activity',
      async () => {
        const a = await activity([item('s', 5, 3)]);
        expect(await a.buy('u', 'r1', 's', 2)).toBe('ok:reserved');
        expect(await a.buy('u', 'r1', 's', 2)).toBe('ok:replayed');
        expect(await a.buy('u', 'r2', 's', 9)).toBe('LIMIT_REACHED');
        const entries = await redis.xrange(activityKeys(a.id).outbox, '-', '+');
        expect(entries).toHaveLength(1);
        const fields = entries[0]![1];
        const m = JSON.parse(fields[fields.indexOf('m') + 1]!) as Record<string, unknown>;
        expect(m).toMatchObject({
          reservationId: a.rid('u', 'r1'),
          userId: 'u',
          skuId: 's',
          quantity: 2,
          unitPrice: '10.00',
          itemName: 'item s',
        });
      },
      TIMEOUT_MS,
    );
  });

  describe('requestId idempotency', () => {
    test(
      'the same call again is a replay (nothing taken twice); another sku or quantity is IDEMPOTENCY_CONFLICT',
      async () => {
        const a = await activity([item('s', 5, 3), item('t', 5, 3)]);
        expect(await a.buy('u', 'r', 's', 1)).toBe('ok:reserved');
        expect(await a.buy('u', 'r', 's', 1)).toBe('ok:replayed');
        expect(await a.buy('u', 'r', 's', 2)).toBe('IDEMPOTENCY_CONFLICT');
        expect(await a.buy('u', 'r', 't', 1)).toBe('IDEMPOTENCY_CONFLICT');
        expect([await a.stock('s'), await a.stock('t')]).toEqual([4, 5]);
      },
      TIMEOUT_MS,
    );
  });

  describe('requestId idempotency across stock buckets', () => {
    test(
      'a requestId that reserved in one scope is IDEMPOTENCY_CONFLICT in every other; a refused one claims nothing',
      async () => {
        const bucketed = (skuId: string, stock: number, buckets: number): CatalogItem => ({
          ...item(skuId, stock, 3),
          buckets,
        });
        const a = await activity([item('tea', 5, 3), bucketed('hot', 8, 4), bucketed('warm', 2, 2)]);
        // Submissions counted in the buyer's window, as the api counts them by default.
        const window: BuyerWindow = { requests: 100, perSeconds: 60 };
        const buy = (userId: string, requestId: string, skuId: string, quantity: number) =>
          outcome(() =>
            reserve(redis, { activityId: a.id, userId, skuId, quantity, requestId, traceId: 't', window }),
          );
        // Bucketed first: an ordinary SKU, another bucketed one, or another quantity under the id.
        expect(await buy('u1', 'r1', 'hot', 1)).toBe('ok:reserved');
        expect(await buy('u1', 'r1', 'tea', 1)).toBe('IDEMPOTENCY_CONFLICT');
        expect(await buy('u1', 'r1', 'warm', 1)).toBe('IDEMPOTENCY_CONFLICT');
        expect(await buy('u1', 'r1', 'hot', 2)).toBe('IDEMPOTENCY_CONFLICT');
        expect(await buy('u1', 'r1', 'hot', 1)).toBe('ok:replayed');
        // Ordinary first.
        expect(await buy('u2', 'r2', 'tea', 1)).toBe('ok:reserved');
        expect(await buy('u2', 'r2', 'hot', 1)).toBe('IDEMPOTENCY_CONFLICT');
        expect(await a.stock('tea')).toBe(4);
        // The claim is no reservation: the buyer's own reads and cancellation find the bucket's.
        expect((await readReservation(redis, a.id, a.rid('u1', 'r1'), { userId: 'u1' }))?.state).toBe(
          'RESERVED',
        );
        expect(await a.cancel('u1', 'r1')).toBe('ok:exists');
        // A submission refused in its bucket takes its claim back: the id stays free.
        expect(await buy('u3', 'w1', 'warm', 1)).toBe('ok:reserved');
        expect(await buy('u4', 'w2', 'warm', 1)).toBe('ok:reserved');
        expect(await buy('u5', 'r5', 'warm', 1)).toBe('SOLD_OUT');
        expect(await buy('u5', 'r5', 'tea', 1)).toBe('ok:reserved');
        expect(await a.stock('tea')).toBe(3);
      },
      TIMEOUT_MS,
    );
  });

  describe('a claim under racing attempts of one requestId', () => {
    test(
      'a refused attempt never takes back the claim of one that reserved, whichever ends first',
      async () => {
        const a = await activity([item('tea', 5, 3), { ...item('hot', 8, 3), buckets: 4 }]);
        const own = activityKeys(a.id);
        const window: BuyerWindow = { requests: 100, perSeconds: 60 };
        const claim = (userId: string, requestId: string) =>
          runScript(
            redis,
            'claimRequest',
            [own.reservation(a.rid(userId, requestId)), own.rateLimitKey('buyer', userId)],
            [userId, 'hot', 1, 100, 60],
          );
        const unclaim = (userId: string, requestId: string) =>
          runScript(redis, 'unclaimRequest', [own.reservation(a.rid(userId, requestId))], []);
        // Attempts A and B of one submission claim in turn; B is refused in the bucket (a paused
        // gate, a full limit) before A reserves there, then B gives its attempt back.
        expect((await claim('u1', 'r1'))[0]).toBe(1);
        expect((await claim('u1', 'r1'))[0]).toBe(1);
        expect(await unclaim('u1', 'r1')).toEqual([0]);
        expect(
          await outcome(() =>
            reserve(redis, {
              activityId: a.id,
              userId: 'u1',
              skuId: 'hot',
              quantity: 1,
              requestId: 'r1',
              traceId: 't',
              window,
            }),
          ),
        ).toBe('ok:reserved');
        // The claim held: the id reused for another SKU is refused, not reserved a second time.
        expect(
          await outcome(() =>
            reserve(redis, {
              activityId: a.id,
              userId: 'u1',
              skuId: 'tea',
              quantity: 1,
              requestId: 'r1',
              traceId: 't',
              window,
            }),
          ),
        ).toBe('IDEMPOTENCY_CONFLICT');
        expect(await a.stock('tea')).toBe(5);
        // Both attempts refused: the claim goes with the last, and the id is free again.
        await claim('u2', 'r2');
        await claim('u2', 'r2');
        expect(await unclaim('u2', 'r2')).toEqual([0]);
        expect(await unclaim('u2', 'r2')).toEqual([1]);
        expect(await redis.exists(own.reservation(a.rid('u2', 'r2')))).toBe(0);
        // A claim the cache restore wrote for a rebuilt reservation is never taken back.
        await redis.hset(own.reservation(a.rid('u3', 'r3')), {
          state: 'ELSEWHERE',
          user: 'u3',
          sku: 'hot',
          qty: 1,
          held: 1,
        });
        expect(await unclaim('u3', 'r3')).toEqual([0]);
        expect(await redis.hget(own.reservation(a.rid('u3', 'r3')), 'state')).toBe('ELSEWHERE');
      },
      TIMEOUT_MS,
    );
  });

  describe('a cancellation crossing a bucketed submission', () => {
    /** The first step of a cancellation by requestId: only the activity's scope is marked. */
    const markActivityScope = (activityId: string, userId: string, rid: string) => {
      const own = activityKeys(activityId);
      return runScript(
        redis,
        'cancelBeforeReserve',
        [own.meta, own.reservation(rid), own.buyer(userId)],
        [userId, 'CANCELLED', 60, 16],
      );
    };
    const reserveHot = (activityId: string, userId: string, requestId: string, window?: BuyerWindow) =>
      outcome(() =>
        reserve(redis, { activityId, userId, skuId: 'hot', quantity: 1, requestId, traceId: 't', window }),
      );

    test(
      'the marker in the activity scope refuses the submission in an unmarked bucket when its claim meets it',
      async () => {
        const a = await activity([{ ...item('hot', 8, 3), buckets: 4 }]);
        expect(await markActivityScope(a.id, 'u1', a.rid('u1', 'r1'))).toEqual([1, expect.any(Number)]);
        expect(await reserveHot(a.id, 'u1', 'r1', { requests: 100, perSeconds: 60 })).toBe('CANCELLED');
        expect((await readStock(redis, a.id)).skus.map((x) => x.remaining)).toEqual([8]);
        // A reservation made before the marker (uncounted, so unclaimed) is still replayed.
        expect(await reserveHot(a.id, 'u2', 'r2')).toBe('ok:reserved');
        expect(await markActivityScope(a.id, 'u2', a.rid('u2', 'r2'))).toEqual([1, expect.any(Number)]);
        expect(await reserveHot(a.id, 'u2', 'r2', { requests: 100, perSeconds: 60 })).toBe('ok:replayed');
      },
      TIMEOUT_MS,
    );

    test(
      'a cancellation that stopped after the activity scope is completed by its retry: every scope marked',
      async () => {
        const a = await activity([{ ...item('hot', 8, 3), buckets: 4 }]);
        await markActivityScope(a.id, 'u1', a.rid('u1', 'r1'));
        expect(await a.cancel('u1', 'r1')).toBe('ok:marked');
        // Without the buyer's window (no claim) the bucket's own marker is what refuses.
        expect(await reserveHot(a.id, 'u1', 'r1')).toBe('CANCELLED');
        expect(await a.cancel('u1', 'r1')).toBe('ok:exists');
      },
      TIMEOUT_MS,
    );

    test(
      'per-buyer limit off: the reservation in the bucket, not the marker in the activity scope, is what every reader finds',
      async () => {
        const a = await activity([{ ...item('hot', 8, 3), buckets: 4 }]);
        // No window, so no claim: the submission reserves in the bucket the cancellation has not
        // reached yet, which the cancellation then finds (exists) and closes in its next round.
        const rid = a.rid('u1', 'r1');
        await markActivityScope(a.id, 'u1', rid);
        expect(await reserveHot(a.id, 'u1', 'r1')).toBe('ok:reserved');
        expect(await a.cancel('u1', 'r1')).toBe('ok:exists');
        expect((await readReservation(redis, a.id, rid, { userId: 'u1' }))?.state).toBe('RESERVED');
        const found = await locateReservation(redis, a.id, rid);
        expect([
          found?.record.state,
          found?.record.skuId,
          found?.scope.prefix === activityKeys(a.id).prefix,
        ]).toEqual(['RESERVED', 'hot', false]);
        // Without a reservation anywhere the marker is still what is found.
        const lone = a.rid('u2', 'r2');
        expect(await a.cancel('u2', 'r2')).toBe('ok:marked');
        expect((await readReservation(redis, a.id, lone, { userId: 'u2' }))?.state).toBe('CANCELLED');
        expect((await locateReservation(redis, a.id, lone))?.record.state).toBe('CANCELLED');
      },
      TIMEOUT_MS,
    );
  });

  describe('cancellation before the reservation', () => {
    test(
      'leaves an owned marker: the late reservation is refused with CANCELLED and takes nothing',
      async () => {
        const a = await activity([item('s', 5, 1)]);
        expect(await a.cancel('u', 'r')).toBe('ok:marked');
        expect(await a.buy('u', 'r', 's', 1)).toBe('CANCELLED');
        expect(await a.stock('s')).toBe(5);
        expect((await readReservation(redis, a.id, a.rid('u', 'r')))?.state).toBe('CANCELLED');
        // Releasing a missing reservation writes nothing: only UNKNOWN_RESERVATION.
        expect(await a.rel('u', 'other', 's')).toBe('UNKNOWN_RESERVATION');
        // A cancellation of a submission that did reserve cannot release it: the reservation exists.
        expect(await a.buy('v', 'r', 's', 1)).toBe('ok:reserved');
        expect(await a.cancel('v', 'r')).toBe('ok:exists');
        expect(await a.stock('s')).toBe(4);
      },
      TIMEOUT_MS,
    );
  });

  describe('stock back at most once', () => {
    test(
      'a second release (and a cancellation after it) changes nothing',
      async () => {
        const a = await activity([item('s', 5, 3)]);
        expect(await a.buy('u', 'r', 's', 3)).toBe('ok:reserved');
        expect(await a.rel('u', 'r', 's')).toBe('ok:released');
        expect(await a.stock('s')).toBe(5);
        expect(await a.rel('u', 'r', 's')).toBe('ok:already-released');
        expect(await a.cancel('u', 'r')).toBe('ok:exists');
        expect(await a.stock('s')).toBe(5);
        const s = await readStock(redis, a.id);
        expect([s.reserved, s.released]).toEqual([3, 3]);
      },
      TIMEOUT_MS,
    );
  });

  describe('paid reservations keep their stock', () => {
    test(
      'a paid reservation is never released; a released one can never be paid',
      async () => {
        const a = await activity([item('s', 5, 3)]);
        expect(await a.buy('u', 'r1', 's', 2)).toBe('ok:reserved');
        await expect(confirmPaid(redis, a.id, a.rid('u', 'r1'))).resolves.toBe('paid');
        await expect(confirmPaid(redis, a.id, a.rid('u', 'r1'))).resolves.toBe('already-paid');
        expect(await a.rel('u', 'r1', 's')).toBe('ALREADY_PAID');
        expect(await a.stock('s')).toBe(3);
        expect(await a.buy('u', 'r2', 's', 1)).toBe('ok:reserved');
        expect(await a.rel('u', 'r2', 's')).toBe('ok:released');
        expect(await outcome(async () => ({ kind: await confirmPaid(redis, a.id, a.rid('u', 'r2')) }))).toBe(
          'RELEASED',
        );
        expect((await readReservation(redis, a.id, a.rid('u', 'r2')))?.state).toBe('RELEASED');
      },
      TIMEOUT_MS,
    );
  });

  describe('frozen cache', () => {
    test(
      'after the freeze: no release, no payment mark, no sale, and the gate never moves again',
      async () => {
        const a = await activity([item('s', 5, 3)]);
        expect(await a.buy('u', 'r', 's', 1)).toBe('ok:reserved');
        await setGate(redis, a.id, 'frozen');
        expect(await a.rel('u', 'r', 's')).toBe('FROZEN');
        expect(await a.cancel('u', 'new')).toBe('FROZEN');
        expect(await outcome(async () => ({ kind: await confirmPaid(redis, a.id, a.rid('u', 'r')) }))).toBe(
          'FROZEN',
        );
        expect(await a.buy('u', 'r2', 's', 1)).toBe('ENDED');
        for (const g of ['open', 'paused', 'closed', 'pending'] as const) {
          expect(await outcome(async () => ({ kind: await setGate(redis, a.id, g) }))).toBe('FROZEN');
        }
        expect(await redis.hget(activityKeys(a.id).meta, 'gate')).toBe('frozen');
        expect(await a.stock('s')).toBe(4);
      },
      TIMEOUT_MS,
    );
  });

  describe('a release names its buyer and sku', () => {
    test(
      "another buyer's or another sku's release is MISMATCH and returns nothing anywhere",
      async () => {
        const a = await activity([item('s', 5, 3), item('t', 5, 3)]);
        expect(await a.buy('u', 'r', 's', 2)).toBe('ok:reserved');
        const other = await outcome(() =>
          release(redis, {
            activityId: a.id,
            reservationId: a.rid('u', 'r'),
            userId: 'v',
            skuId: 's',
            reason: 'X',
          }),
        );
        expect(other).toBe('MISMATCH');
        expect(await a.rel('u', 'r', 't')).toBe('MISMATCH');
        expect([await a.stock('s'), await a.stock('t')]).toEqual([3, 5]);
      },
      TIMEOUT_MS,
    );
  });

  describe('cache loading fenced by generation', () => {
    test(
      'a repeated load of the same generation changes nothing; a newer one adds only the difference; a decrease or an older generation is refused',
      async () => {
        const a = await activity([item('s', 5, 3)]);
        expect(await a.buy('u', 'r', 's', 2)).toBe('ok:reserved');
        const again = await loadActivity(redis, a.def);
        expect(again).toEqual({ created: 0, topped: 0, skipped: 1, stockAdded: 0 });
        expect(await a.stock('s')).toBe(3);
        const more = await loadActivity(redis, { ...a.def, generation: 2, items: [item('s', 7, 3)] });
        expect(more).toEqual({ created: 0, topped: 1, skipped: 0, stockAdded: 2 });
        expect(await a.stock('s')).toBe(5);
        const less = () => loadActivity(redis, { ...a.def, generation: 3, items: [item('s', 6, 3)] });
        await expect(less()).rejects.toMatchObject({ code: 'STOCK_DECREASE' });
        await expect(loadActivity(redis, { ...a.def, generation: 1 })).rejects.toMatchObject({
          code: 'STALE_GENERATION',
        });
        expect(await a.stock('s')).toBe(5);
        const s = await readStock(redis, a.id);
        expect([s.initial, s.remaining + s.reserved - s.released]).toEqual([7, 7]);
      },
      TIMEOUT_MS,
    );

    test(
      'a load resumed after a crash part-way (chunks loaded, a chunk half loaded, chunks not reached) creates only the missing SKUs and keeps live stock',
      async () => {
        // LOAD_CHUNK SKUs per script call: the first chunk is loaded, the second only in part,
        // the third not at all, as if the operator had been killed between calls.
        const sku = (i: number) => `s${String(i).padStart(5, '0')}`;
        const all = Array.from({ length: 2 * LOAD_CHUNK + 100 }, (_, i) => item(sku(i), 4, 2));
        const partial = all.slice(0, LOAD_CHUNK + LOAD_CHUNK / 2);
        const a = await activity(partial);
        expect(await a.buy('u1', 'r1', sku(1), 2)).toBe('ok:reserved');
        expect(await a.buy('u2', 'r2', sku(LOAD_CHUNK + 7), 1)).toBe('ok:reserved');
        const resumed = await loadActivity(redis, { ...a.def, items: all });
        expect(resumed).toEqual({
          created: all.length - partial.length,
          topped: 0,
          skipped: partial.length,
          stockAdded: 4 * (all.length - partial.length),
        });
        expect([
          await a.stock(sku(1)),
          await a.stock(sku(LOAD_CHUNK + 7)),
          await a.stock(sku(all.length - 1)),
        ]).toEqual([2, 3, 4]);
        expect(await redis.scard(activityKeys(a.id).skuIndex)).toBe(all.length);
        const s = await readStock(redis, a.id);
        expect([s.initial, s.remaining, s.reserved]).toEqual([4 * all.length, 4 * all.length - 3, 3]);
        // Once more: every chunk is found loaded, nothing changes.
        expect(await loadActivity(redis, { ...a.def, items: all })).toEqual({
          created: 0,
          topped: 0,
          skipped: all.length,
          stockAdded: 0,
        });
        expect(await a.stock(sku(1))).toBe(2);
      },
      TIMEOUT_MS,
    );

    test.each([
      ['a fractional stock', 2.5, 1],
      ['a negative stock', -1, 1],
      ['a stock in exponent form', 1e21, 1],
      ['a fractional limit', 5, 1.5],
    ])(
      '%s is refused (BAD_ARGUMENT) before any SKU of the chunk is written',
      async (_label, stock, limitPerUser) => {
        const def = definition([item('good', 5, 1), item('bad', stock, limitPerUser)]);
        await expect(loadActivity(redis, def)).rejects.toMatchObject({ code: 'BAD_ARGUMENT' });
        const k = activityKeys(def.id);
        expect(await redis.exists(k.sku('good'), k.sku('bad'), k.skuIndex, k.counters)).toBe(0);
        // The same activity with the bad SKU corrected loads whole.
        const fixed = await loadActivity(redis, { ...def, items: [item('good', 5, 1), item('bad', 3, 1)] });
        expect(fixed).toEqual({ created: 2, topped: 0, skipped: 0, stockAdded: 8 });
        expect(await redis.hgetall(k.sku('bad'))).toMatchObject({
          stock: '3',
          initial: '3',
          limit: '1',
          gen: '1',
        });
      },
      TIMEOUT_MS,
    );
  });

  describe('gate and sale window', () => {
    test.each([
      ['pending', 'NOT_STARTED'],
      ['paused', 'PAUSED'],
      ['closed', 'ENDED'],
      ['frozen', 'ENDED'],
    ] as const)(
      'gate %s alone refuses with %s and takes nothing',
      async (gate, code) => {
        const a = await activity([item('s', 5, 3)], gate);
        expect(await a.buy('u', 'r', 's', 1)).toBe(code);
        expect(await a.stock('s')).toBe(5);
      },
      TIMEOUT_MS,
    );

    test(
      'an open gate outside the sale window refuses (before start, at the end); an unloaded activity is NOT_LOADED',
      async () => {
        const early = await activity([item('s', 5, 3)]);
        await loadActivity(redis, { ...early.def, generation: 2, startAt: new Date(Date.now() + 3_600_000) });
        expect(await early.buy('u', 'r', 's', 1)).toBe('NOT_STARTED');
        const late = await activity([item('s', 5, 3)]);
        await loadActivity(redis, { ...late.def, generation: 2, endAt: new Date(Date.now() - 1) });
        expect(await late.buy('u', 'r', 's', 1)).toBe('ENDED');
        const none = uniqueId('guard');
        expect(
          await outcome(() =>
            reserve(redis, {
              activityId: none,
              userId: 'u',
              skuId: 's',
              quantity: 1,
              requestId: 'r',
              traceId: 't',
            }),
          ),
        ).toBe('NOT_LOADED');
      },
      TIMEOUT_MS,
    );
  });
});
