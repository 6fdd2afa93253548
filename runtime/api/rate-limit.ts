/**
 * Rate limits per buyer and per client address, before the reservation script (docs/operator.md
 * "Traffic shaping and eligibility"). Counters are shared by every api replica through Redis
 * (rate-limiter-flexible, fixed windows of `perSeconds`); once a subject has used its window in
 * Redis, this process blocks it in memory until the window ends, so a flood from one buyer or
 * address costs Redis nothing after its first refusal. If Redis is unreachable an in-memory
 * insurance limiter with the same figures keeps limiting per process.
 *
 * Only submissions are limited (new orders, order codes, registrations): polling a result is
 * cheap and an honest buyer polls more than they click. A submission answered with a 5xx gives its
 * point back.
 */
import type { RequestHandler } from 'express';
import { Router } from 'express';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type { RateLimiterAbstract } from 'rate-limiter-flexible';
import { activityKeys } from '../../core/keys.js';
import type { Logger } from '../../core/logger.js';
import type { Metrics } from '../../core/metrics.js';
import type { RedisClient } from '../../core/scripts.js';
import type { RateLimit, TrafficPolicy } from '../../core/traffic-policy.js';
import type { PolicyCache } from './policy-cache.js';
import { sendProblem } from './problem.js';
import { servedActivity } from './schemas.js';

export interface RateLimitDeps {
  redis: RedisClient;
  metrics: Metrics;
  policies: PolicyCache;
  logger: Logger;
  /** When set, this api serves only this activity. */
  activityId: string | undefined;
}

/** The routes whose requests count against the limits. */
export const LIMITED_ROUTES = [
  '/v1/activities/:activityId/orders',
  '/v1/activities/:activityId/order-codes',
  '/v1/activities/:activityId/registrations',
];

type Reason = 'buyer' | 'address';

interface ActivityLimiters {
  signature: string;
  buyer: RateLimiterAbstract | undefined;
  address: RateLimiterAbstract | undefined;
}

function limiter(redis: RedisClient, keyPrefix: string, limit: RateLimit): RateLimiterAbstract | undefined {
  if (limit.requests === 0) return undefined;
  const figures = { points: limit.requests, duration: limit.perSeconds };
  return new RateLimiterRedis({
    storeClient: redis,
    keyPrefix,
    ...figures,
    // Blocked in this process for the rest of the window once Redis says the window is used up.
    inMemoryBlockOnConsumed: limit.requests,
    rejectIfRedisNotReady: true,
    insuranceLimiter: new RateLimiterMemory({ keyPrefix, ...figures }),
  });
}

/** Seconds a refused client should wait: the rest of the window, at least one. */
export function retryAfterSeconds(res: RateLimiterRes): number {
  return Math.max(1, Math.ceil(res.msBeforeNext / 1000));
}

/**
 * One stage of the limits. The address stage runs before the body is read and the token verified,
 * so a flood from one address is refused at the least cost; the buyer stage needs the verified
 * buyer id and runs after authentication. A request refused by the address stage does not spend a
 * point of its buyer.
 */
export function rateLimitRouter(deps: RateLimitDeps, stage: Reason): Router {
  const byActivity = new Map<string, ActivityLimiters>();

  const limitersFor = (activityId: string, policy: TrafficPolicy): ActivityLimiters => {
    const signature = JSON.stringify([policy.shaping.perBuyer, policy.shaping.perAddress]);
    const known = byActivity.get(activityId);
    if (known?.signature === signature) return known;
    const k = activityKeys(activityId);
    const built: ActivityLimiters = {
      signature,
      buyer: limiter(deps.redis, k.rateLimitPrefix('buyer'), policy.shaping.perBuyer),
      address: limiter(deps.redis, k.rateLimitPrefix('address'), policy.shaping.perAddress),
    };
    byActivity.set(activityId, built);
    return built;
  };

  const handler: RequestHandler = async (req, res, next) => {
    let activityId: string;
    try {
      activityId = servedActivity(req, deps.activityId);
    } catch (err) {
      // Before authentication, a bad or foreign activity id is left to the later stages, so the
      // answer (401 first, then 400/404) is the same with or without the limiter.
      if (stage === 'address') {
        next();
        return;
      }
      throw err;
    }
    const policy = await deps.policies.get(activityId);
    if (!policy.shaping.enabled) {
      next();
      return;
    }
    const limiters = limitersFor(activityId, policy);
    const l = stage === 'address' ? limiters.address : limiters.buyer;
    if (!l) {
      next();
      return;
    }
    const subject =
      stage === 'address' ? (req.ip ?? req.socket.remoteAddress ?? 'unknown') : String(res.locals.userId);
    try {
      await l.consume(subject);
    } catch (err) {
      if (!(err instanceof RateLimiterRes)) {
        // Both Redis and the insurance failed: not a reason to refuse a buyer.
        deps.logger.warn({ err, activityId, stage }, 'rate limiter failed; request let through');
        next();
        return;
      }
      deps.metrics.rateLimited.inc({ activity: activityId, reason: stage });
      res.setHeader('retry-after', String(retryAfterSeconds(err)));
      sendProblem(
        res,
        'RATE_LIMITED',
        stage === 'buyer' ? 'too many requests from this buyer' : 'too many requests from this address',
      );
      return;
    }
    // A request we failed (5xx: a dependency down, a crash point) gives its point back: a buyer
    // retrying through an outage is not rate-limited for our failure.
    res.once('finish', () => {
      if (res.statusCode >= 500) l.reward(subject, 1).catch(() => undefined);
    });
    next();
  };

  const router = Router();
  router.post(LIMITED_ROUTES, handler);
  return router;
}
