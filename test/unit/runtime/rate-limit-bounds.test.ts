// The rate limiters of an api serving every activity (the after-sale role, no ACTIVITY_ID) meet
// made-up activity ids: the limiters kept per activity are bounded (least recently used evicted)
// and refusals for an activity with no policy count under one shared metric label.
import type { NextFunction, Request, Response } from 'express';
import { createLogger } from '../../../core/logger.js';
import { createMetrics, UNKNOWN_ACTIVITY_LABEL } from '../../../core/metrics.js';
import type { RedisClient } from '../../../core/scripts.js';
import { DEFAULT_TRAFFIC_POLICY } from '../../../core/traffic-policy.js';
import { PolicyCache } from '../../../runtime/api/policy-cache.js';
import { MAX_ACTIVITY_LIMITERS, rateLimitStages } from '../../../runtime/api/rate-limit.js';

/**
 * A Redis client that is not connected: no policy is readable except the live activities' ones,
 * and the limiters fall back to their in-memory insurance. Each limiter built defines its script
 * once (rate-limiter-flexible's RateLimiterRedis constructor): `built` counts the limiters.
 */
function fakeRedis(live: Set<string>): { client: RedisClient; built: () => number } {
  let defined = 0;
  const client = {
    status: 'end',
    defineCommand: () => {
      defined += 1;
    },
    get: async (key: string) =>
      [...live].some((id) => key.includes(`{${id}}`)) ? JSON.stringify(DEFAULT_TRAFFIC_POLICY) : null,
  };
  return { client: client as unknown as RedisClient, built: () => defined };
}

function setUp(live: string[] = [], activityId?: string) {
  const redis = fakeRedis(new Set(live));
  const logger = createLogger('rate-limit-test', 'silent');
  const metrics = createMetrics('rate-limit-test');
  const stages = rateLimitStages({
    redis: redis.client,
    metrics,
    logger,
    policies: new PolicyCache(redis.client, 60_000, logger),
    activityId,
  });
  const run = (
    handler: (req: Request, res: Response, next: NextFunction) => unknown,
    req: Request,
    res: Response,
  ): Promise<boolean> =>
    new Promise<boolean>((resolve, reject) => {
      let nexted = false;
      const r = handler(req, res, (err?: unknown) => {
        nexted = true;
        if (err) reject(err as Error);
        else resolve(true);
      });
      Promise.resolve(r).then(() => {
        if (!nexted) resolve(false);
      }, reject);
    });
  /** One limited request of `buyer` for `activity`: true when let through, false when refused. */
  const request = async (activity: string, buyer = 'b-1'): Promise<boolean> => {
    const req = {
      params: { activityId: activity },
      headers: {},
      ip: '127.0.0.1',
      socket: {},
    } as unknown as Request;
    const res = {
      locals: { userId: buyer },
      statusCode: 200,
      setHeader: () => undefined,
      end: () => undefined,
    } as unknown as Response;
    return (await run(stages.beforeAuthHandler, req, res)) && run(stages.afterAuthHandler, req, res);
  };
  const labels = async (): Promise<string[]> =>
    (await metrics.rateLimited.get()).values.map((v) => String(v.labels.activity)).sort();
  return { request, built: redis.built, labels };
}

describe('rate limiters of an api serving every activity', () => {
  test(`at most ${MAX_ACTIVITY_LIMITERS} activities keep limiters; the least recently used go first`, async () => {
    const { request, built } = setUp();
    await request('keep');
    await request('old');
    expect(built()).toBe(2);
    for (let i = 0; i < MAX_ACTIVITY_LIMITERS - 2; i += 1) await request(`made-up-${i}`);
    expect(built()).toBe(MAX_ACTIVITY_LIMITERS);
    // Full: using `keep` again makes `old` the least recently used, which the next new id evicts.
    await request('keep');
    expect(built()).toBe(MAX_ACTIVITY_LIMITERS);
    await request('one-more');
    expect(built()).toBe(MAX_ACTIVITY_LIMITERS + 1);
    await request('keep');
    expect(built()).toBe(MAX_ACTIVITY_LIMITERS + 1);
    // `old` was dropped: its next request builds its limiters again (and evicts the next oldest).
    await request('old');
    expect(built()).toBe(MAX_ACTIVITY_LIMITERS + 2);
    await request('old');
    expect(built()).toBe(MAX_ACTIVITY_LIMITERS + 2);
  });

  test('refusals for activities with no policy share one metric label; a live activity keeps its own', async () => {
    const { request, labels } = setUp(['live-1']);
    const limit = DEFAULT_TRAFFIC_POLICY.shaping.perBuyer.requests;
    for (const activity of ['made-up-a', 'made-up-b', 'live-1']) {
      for (let i = 0; i < limit; i += 1) expect(await request(activity)).toBe(true);
      expect(await request(activity)).toBe(false);
    }
    expect(await labels()).toEqual([UNKNOWN_ACTIVITY_LABEL, 'live-1']);
  });

  test('an api bound to one activity labels its refusals with it, policy or not', async () => {
    const { request, labels } = setUp([], 'sale-1');
    const limit = DEFAULT_TRAFFIC_POLICY.shaping.perBuyer.requests;
    for (let i = 0; i < limit; i += 1) expect(await request('sale-1')).toBe(true);
    expect(await request('sale-1')).toBe(false);
    expect(await labels()).toEqual(['sale-1']);
  });
});
