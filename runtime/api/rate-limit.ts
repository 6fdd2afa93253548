/**
 * Rate limits per buyer and per client address (docs/operator.md "Traffic shaping and
 * eligibility"). Counters are shared by every api replica through Redis (fixed windows of
 * `perSeconds`); once a subject has used its window in Redis, this process blocks it in memory
 * until the window ends, so a flood from one buyer or address costs Redis nothing after that.
 *
 * The order submission's per-buyer point is counted by the reservation's own script call
 * (reserve-9.lua, or soldOutChecks-var.lua on the sold-out fast path): one Redis call per submission.
 * This module only hands the window's figures to the route and acts on the script's count
 * (`submitLimit`). Order codes and registrations count in the same counter through
 * rate-limiter-flexible (the scripts count exactly as its RateLimiterRedis does), so a buyer has
 * one window across the limited routes. The per-address limit stays a call of its own before the
 * body is read and the token verified: it must also stop floods of bad tokens, which never reach a
 * script. If Redis is unreachable, the library's in-memory insurance limiter with the same figures
 * keeps limiting those per process; a submission cannot be reserved without Redis anyway.
 *
 * Only submissions are limited (new orders, order codes, registrations): polling a result is
 * cheap and an honest buyer polls more than they click. A submission answered with a 5xx gives its
 * point back.
 */
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { Router } from 'express';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type { RateLimiterAbstract } from 'rate-limiter-flexible';
import { activityKeys } from '../../core/keys.js';
import type { Logger } from '../../core/logger.js';
import { UNKNOWN_ACTIVITY_LABEL } from '../../core/metrics.js';
import type { Metrics } from '../../core/metrics.js';
import { scriptSource } from '../../core/scripts.js';
import type { RedisClient } from '../../core/scripts.js';
import type { BuyerWindow } from '../../core/reservations.js';
import type { RateLimit, TrafficPolicy } from '../../core/traffic-policy.js';
import type { PolicyCache } from './policy-cache.js';
import { BEARER } from './auth.js';
import { GIVE_BACK, sendProblem } from './problem.js';
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

interface ActiveLimiters {
  activityId: string;
  /** The `activity` label of its refusals: UNKNOWN_ACTIVITY_LABEL for an activity with no policy. */
  label: string;
  /** The policy object these were built from: the same object (cached) needs no comparison. */
  policy: TrafficPolicy;
  signature: string;
  buyer: RateLimiterAbstract | undefined;
  address: RateLimiterAbstract | undefined;
}

/** A per-buyer or per-address limiter on Redis (undefined for a limit of 0: none). Exported for tests. */
export function redisLimiter(
  redis: RedisClient,
  keyPrefix: string,
  limit: RateLimit,
): RateLimiterAbstract | undefined {
  if (limit.requests === 0) return undefined;
  const figures = { points: limit.requests, duration: limit.perSeconds };
  return new RateLimiterRedis({
    storeClient: redis,
    keyPrefix,
    ...figures,
    // Blocked in this process for the rest of the window from the first request Redis refuses, not
    // from the one that took the last point: that one may still fail (5xx) and give its point back,
    // and a block the library set then would refuse the buyer's retry for our failure.
    inMemoryBlockOnConsumed: limit.requests + 1,
    rejectIfRedisNotReady: true,
    // lua/limiterWindow-1.lua: the rule the reservation's scripts count by in the same keys
    // (lua/includes/buyerWindow.lua), so a window shortened mid-sale applies at once on every route.
    customIncrTtlLuaScript: scriptSource('limiterWindow').lua,
    insuranceLimiter: new RateLimiterMemory({ keyPrefix, ...figures }),
  });
}

/** Seconds a refused client should wait: the rest of the window, at least one. */
export function retryAfterSeconds(res: RateLimiterRes): number {
  return Math.max(1, Math.ceil(res.msBeforeNext / 1000));
}

/**
 * The claimed buyer id of a bearer token, read without verifying it (no crypto: a base64url decode
 * and a small JSON.parse), or undefined. Used for one thing only: to refuse at once a buyer this
 * process already knows to be over their limit. A forged token naming such a buyer gets the 429
 * its owner would get instead of a 401; it can neither create nor lift a block.
 */
export function claimedBuyer(authorization: string | undefined): string | undefined {
  const token = BEARER.exec(authorization ?? '')?.[1];
  const payload = token?.split('.')[1];
  if (!payload || payload.length > 4096) return undefined;
  try {
    const sub = (JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as { sub?: unknown }).sub;
    return typeof sub === 'string' ? sub : undefined;
  } catch {
    return undefined;
  }
}

/** Buyers this process refused, until their window ends (absolute ms). Bounded by sweeping. */
class BlockedBuyers {
  private readonly until = new Map<string, number>();

  block(activityId: string, buyer: string, untilMs: number): void {
    if (this.until.size >= 100_000) this.sweep(Date.now());
    this.until.set(`${activityId}\n${buyer}`, untilMs);
  }

  get size(): number {
    return this.until.size;
  }

  /** Milliseconds the buyer stays blocked, or 0. */
  remainingMs(activityId: string, buyer: string, now = Date.now()): number {
    const key = `${activityId}\n${buyer}`;
    const until = this.until.get(key);
    if (until === undefined) return 0;
    if (until > now) return until - now;
    this.until.delete(key);
    return 0;
  }

  /** Lifts every block of the activity: its limits changed, and a block was for the old ones. */
  forget(activityId: string): void {
    const prefix = `${activityId}\n`;
    for (const k of this.until.keys()) if (k.startsWith(prefix)) this.until.delete(k);
  }

  private sweep(now: number): void {
    for (const [k, until] of this.until) if (until <= now) this.until.delete(k);
  }
}

export interface RateLimitStages {
  /**
   * Before the body is read and the token verified: the per-address limit, and buyers this process
   * already refused in their current window (by the token's claimed id). A flood from one address
   * or one known bot is refused at the least cost.
   */
  beforeAuth: Router;
  /** After authentication: the per-buyer limit, by the verified buyer id. */
  afterAuth: Router;
  /** The same two stages as handlers, for a route that mounts them in its own handler stack. */
  beforeAuthHandler: RequestHandler;
  afterAuthHandler: RequestHandler;
  /** The order submission's per-buyer limit, counted by its script call. */
  submit: SubmitLimit;
}

/**
 * The per-buyer limit of the order submission, whose point the reservation's script counts
 * (core/reservations.ts): this side finds the window's figures and acts on the script's answer.
 */
export interface SubmitLimit {
  /** After authentication, instead of `afterAuthHandler`: finds the buyer's window, no Redis call. */
  afterAuthHandler: RequestHandler;
  /** The window the submission counts in, or undefined when the buyer is not limited. */
  windowOf(res: Response): BuyerWindow | undefined;
  /** The script counted the submission: give the point back if the request ends in a 5xx. */
  counted(res: Response): void;
  /** The script refused the submission (RATE_LIMITED): 429 with Retry-After, block in memory. */
  refuse(res: Response, activityId: string, buyer: string, ttlMs: number): void;
}

/**
 * Activities whose limiters one process keeps (like PolicyCache's entries): an api serving every
 * activity meets made-up ids, each of which would otherwise keep its limiters forever. The least
 * recently used go first; one evicted is built again on its next request (its counters are in
 * Redis, so only this process' in-memory block of the window is forgotten).
 */
export const MAX_ACTIVITY_LIMITERS = 10_000;

export function rateLimitStages(deps: RateLimitDeps): RateLimitStages {
  /** In least recently used order (a Map iterates in insertion order). */
  const byActivity = new Map<string, ActiveLimiters>();
  /** The activity used last: using it again (an api serving one activity: always) moves nothing. */
  let lastUsed: string | undefined;
  const blocked = new BlockedBuyers();

  /**
   * A metric series per activity id a client makes up would grow without bound: an activity with
   * no policy in Redis (the operator writes one for each it runs) counts under one shared label,
   * as the submission's own metric does (orders-routes.ts). An api bound to one activity refuses
   * the others before any limit.
   */
  const labelFor = (activityId: string, policy: TrafficPolicy): string =>
    deps.activityId === undefined && policy === deps.policies.fallback ? UNKNOWN_ACTIVITY_LABEL : activityId;

  const limitersFor = (activityId: string, policy: TrafficPolicy): ActiveLimiters => {
    const known = byActivity.get(activityId);
    if (known !== undefined && lastUsed !== activityId) {
      byActivity.delete(activityId);
      byActivity.set(activityId, known);
      lastUsed = activityId;
    }
    if (known?.policy === policy) return known;
    const signature = JSON.stringify([policy.shaping.perBuyer, policy.shaping.perAddress]);
    if (known?.signature === signature) {
      known.policy = policy;
      known.label = labelFor(activityId, policy);
      return known;
    }
    // New limits (an edit of spec.trafficShaping during the sale): a buyer this process refused
    // under the old ones is judged by the new ones from the next request (their counters in Redis).
    if (known !== undefined) blocked.forget(activityId);
    const k = activityKeys(activityId);
    const built: ActiveLimiters = {
      activityId,
      label: labelFor(activityId, policy),
      policy,
      signature,
      buyer: redisLimiter(deps.redis, k.rateLimitPrefix('buyer'), policy.shaping.perBuyer),
      address: redisLimiter(deps.redis, k.rateLimitPrefix('address'), policy.shaping.perAddress),
    };
    if (known === undefined && byActivity.size >= MAX_ACTIVITY_LIMITERS) {
      const oldest = byActivity.keys().next().value;
      if (oldest !== undefined) byActivity.delete(oldest);
    }
    byActivity.set(activityId, built);
    lastUsed = activityId;
    return built;
  };

  /** The metric label of a refusal for `activityId` (whose limiters this request found, if any). */
  const labelOf = (res: Response, activityId: string): string => {
    const active = res.locals.rateLimits as ActiveLimiters | null | undefined;
    if (active?.activityId === activityId) return active.label;
    return deps.activityId === undefined ? UNKNOWN_ACTIVITY_LABEL : activityId;
  };

  const refuse = (res: Response, activityId: string, reason: Reason, retryAfter: number): void => {
    deps.metrics.rateLimited.inc({ activity: labelOf(res, activityId), reason });
    res.setHeader('retry-after', String(retryAfter));
    sendProblem(
      res,
      'RATE_LIMITED',
      reason === 'buyer' ? 'too many requests from this buyer' : 'too many requests from this address',
    );
  };

  /** Consumes a point; answers 429 and returns false when the subject is over its limit. */
  const consume = async (
    res: Response,
    activityId: string,
    reason: Reason,
    l: RateLimiterAbstract,
    subject: string,
  ): Promise<boolean> => {
    try {
      await l.consume(subject);
    } catch (err) {
      if (!(err instanceof RateLimiterRes)) {
        // Both Redis and the insurance failed: not a reason to refuse a buyer.
        deps.logger.warn({ err, activityId, reason }, 'rate limiter failed; request let through');
        return true;
      }
      if (reason === 'buyer') blocked.block(activityId, subject, Date.now() + err.msBeforeNext);
      refuse(res, activityId, reason, retryAfterSeconds(err));
      return false;
    }
    // A request we failed (5xx: a dependency down, a crash point) gives its point back: a buyer
    // retrying through an outage is not rate-limited for our failure. Every 5xx of these routes
    // is written by sendProblem() (runtime/api/problem.ts), which calls this; a 'finish' listener
    // per request would cost every successful request for the rare failed one.
    const earlier = res.locals[GIVE_BACK] as (() => void) | undefined;
    res.locals[GIVE_BACK] = (): void => {
      earlier?.();
      l.reward(subject, 1).catch(() => undefined);
    };
    return true;
  };

  const activeFor = (activityId: string, policy: TrafficPolicy): ActiveLimiters | null =>
    policy.shaping.enabled ? limitersFor(activityId, policy) : null;

  /**
   * The activity's limiters, or null when shaping is off or the activity id is not valid. Without
   * a promise when the policy is known (PolicyCache.known): nearly every request.
   */
  const activeLimiters = (req: Request): ActiveLimiters | null | Promise<ActiveLimiters | null> => {
    let activityId: string;
    try {
      activityId = servedActivity(req, deps.activityId);
    } catch {
      // A bad or foreign activity id is left to the routes, so the answer (401 first, then
      // 400/404) is the same with or without the limiter.
      return null;
    }
    const policy = deps.policies.known(activityId);
    if (policy) return activeFor(activityId, policy);
    return deps.policies.get(activityId).then((p) => activeFor(activityId, p));
  };

  /** What beforeAuth found (null: not limited), for the stages after it: one policy lookup. */
  const knownLimiters = (
    req: Request,
    res: Response,
  ): ActiveLimiters | null | Promise<ActiveLimiters | null> => {
    const known = res.locals.rateLimits as ActiveLimiters | null | undefined;
    return known === undefined ? activeLimiters(req) : known;
  };

  const beforeAuthWith = (
    active: ActiveLimiters | null,
    req: Request,
    res: Response,
    next: NextFunction,
  ): void | Promise<void> => {
    res.locals.rateLimits = active;
    if (!active) {
      next();
      return;
    }
    const { activityId } = active;
    // Decoding the token's claims costs a base64 decode and a JSON.parse: only worth it when
    // somebody is blocked at all.
    const claimed = blocked.size === 0 ? undefined : claimedBuyer(req.headers.authorization);
    const ms = claimed === undefined ? 0 : blocked.remainingMs(activityId, claimed);
    if (ms > 0) {
      refuse(res, activityId, 'buyer', Math.max(1, Math.ceil(ms / 1000)));
      return;
    }
    if (!active.address) {
      next();
      return;
    }
    const address = req.ip ?? req.socket.remoteAddress ?? 'unknown';
    return consume(res, activityId, 'address', active.address, address).then((ok) => {
      if (ok) next();
    });
  };

  // The stages return a promise only when they wait (express 5 passes its rejection to next).
  const beforeAuth: RequestHandler = (req, res, next) => {
    const active = activeLimiters(req);
    return active instanceof Promise
      ? active.then((a) => beforeAuthWith(a, req, res, next))
      : beforeAuthWith(active, req, res, next);
  };

  const afterAuthWith = (
    active: ActiveLimiters | null,
    res: Response,
    next: NextFunction,
  ): void | Promise<void> => {
    if (!active?.buyer) {
      next();
      return;
    }
    return consume(res, active.activityId, 'buyer', active.buyer, String(res.locals.userId)).then((ok) => {
      if (ok) next();
    });
  };

  const afterAuth: RequestHandler = (req, res, next) => {
    const active = knownLimiters(req, res);
    return active instanceof Promise
      ? active.then((a) => afterAuthWith(a, res, next))
      : afterAuthWith(active, res, next);
  };

  const submitAfterAuthWith = (active: ActiveLimiters | null, res: Response, next: NextFunction): void => {
    res.locals.buyerWindow = active?.buyer ? active.policy.shaping.perBuyer : undefined;
    next();
  };

  const submitAfterAuth: RequestHandler = (req, res, next) => {
    const active = knownLimiters(req, res);
    return active instanceof Promise
      ? active.then((a) => submitAfterAuthWith(a, res, next))
      : submitAfterAuthWith(active, res, next);
  };

  const submit: SubmitLimit = {
    afterAuthHandler: submitAfterAuth,
    windowOf: (res) => res.locals.buyerWindow as BuyerWindow | undefined,
    counted: (res) => {
      // Blocking in memory waits for the first refusal (`refuse`), not the window's last point as
      // the library's inMemoryBlockOnConsumed does: a replay, which the script answers without
      // counting, stays answerable until then (one more Redis call per process and window).
      const l = (res.locals.rateLimits as ActiveLimiters | null | undefined)?.buyer;
      if (!l) return;
      const buyer = String(res.locals.userId);
      const earlier = res.locals[GIVE_BACK] as (() => void) | undefined;
      res.locals[GIVE_BACK] = (): void => {
        earlier?.();
        // The same counter (ActivityKeys.rateLimitKey): the library's reward keeps its TTL.
        l.reward(buyer, 1).catch(() => undefined);
      };
    },
    refuse: (res, activityId, buyer, ttlMs) => {
      blocked.block(activityId, buyer, Date.now() + ttlMs);
      refuse(res, activityId, 'buyer', Math.max(1, Math.ceil(ttlMs / 1000)));
    },
  };

  const before = Router();
  before.post(LIMITED_ROUTES, beforeAuth);
  const after = Router();
  after.post(LIMITED_ROUTES, afterAuth);
  return {
    beforeAuth: before,
    afterAuth: after,
    beforeAuthHandler: beforeAuth,
    afterAuthHandler: afterAuth,
    submit,
  };
}
