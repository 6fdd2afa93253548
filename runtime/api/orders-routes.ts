/** The buyer API: submit, poll, order codes. Handlers validate, call the core, map the outcome. */
import { Router } from 'express';
import type { Request, RequestHandler, Response } from 'express';
import { issueOrderCode, readMeta, skuExists } from '../../core/activity-cache.js';
import { FlashSaleError, dependencyOutage } from '../../core/errors.js';
import type { ErrorCode } from '../../core/errors.js';
import type { Pool } from '../../core/db/pool.js';
import { UNKNOWN_ACTIVITY_LABEL } from '../../core/metrics.js';
import type { Metrics } from '../../core/metrics.js';
import { answerUnloadedSubmission, lookupOrder } from '../../core/order-view.js';
import { localAck } from '../../core/durable-ack.js';
import type { ReservationAck } from '../../core/durable-ack.js';
import {
  countedBeforeFailure,
  retryAfterMs,
  reservationIdFor,
  reserve,
  soldOutCheck,
  stockLeftOf,
} from '../../core/reservations.js';
import { crashPoint } from '../../core/crash.js';
import type { RedisClient } from '../../core/scripts.js';
import {
  orderCodeBody,
  parse,
  parseSubmitOrder,
  requestIdQuery,
  reservationParam,
  servedActivity,
} from './schemas.js';
import { sendProblem } from './problem.js';
import type { SoldOutFlags } from './sold-out.js';
import type { PolicyCache } from './policy-cache.js';
import type { SubmitLimit } from './rate-limit.js';

export interface OrdersDeps {
  redis: RedisClient;
  pool: Pool;
  metrics: Metrics;
  soldOut: SoldOutFlags;
  /** When set, this api serves only this activity. */
  activityId: string | undefined;
  orderCodeTtlSeconds: number;
  /** When a reservation counts as acknowledged (core/durable-ack.ts); default: on the primary. */
  reservationAck?: ReservationAck | undefined;
  /** The activities' traffic policies (rate limits, eligibility; core/traffic-policy.ts). */
  policies: PolicyCache;
  /** The per-buyer limit the submission's script call counts (runtime/api/rate-limit.ts). */
  limit?: SubmitLimit | undefined;
}

const resultLabel: Partial<Record<ErrorCode, string>> = {
  SOLD_OUT: 'sold_out',
  LIMIT_REACHED: 'limit_reached',
  NOT_STARTED: 'not_started',
  ENDED: 'ended',
  PAUSED: 'paused',
  INVALID_ORDER_CODE: 'invalid_order_code',
  UNKNOWN_SKU: 'unknown_sku',
  CANCELLED: 'cancelled',
  IDEMPOTENCY_CONFLICT: 'idempotency_conflict',
  NOT_FOUND: 'unknown_activity',
  NOT_LOADED: 'not_started',
  NOT_REPLICATED: 'not_replicated',
  BUYER_DENIED: 'denied',
  NOT_REGISTERED: 'not_registered',
};

/**
 * flashsale_reservations_total children by activity and result, looked up by one string key
 * instead of a label object built, hashed and validated per request. Bounded like the metric: an
 * unknown activity is counted under one shared label value.
 */
function reservationCounter(metrics: Metrics): (activity: string, result: string) => void {
  const children = new Map<string, { inc: () => void }>();
  return (activity, result) => {
    const key = `${activity}\n${result}`;
    let child = children.get(key);
    if (!child) {
      child = metrics.reservations.labels(activity, result);
      children.set(key, child);
    }
    child.inc();
  };
}

function answer202(res: Response, activityId: string, reservationId: string, payload: string): void {
  // Written directly: res.location() / res.json() / res.send() add nothing here (the ids come
  // from safe alphabets, there is no ETag and no content negotiation).
  res.writeHead(202, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(payload),
    location: `/v1/activities/${activityId}/orders/${reservationId}`,
  });
  res.end(payload);
}

/** Answers a RATE_LIMITED from a script call (429, Retry-After); false for any other error. */
function refusedByScript(
  limit: SubmitLimit | undefined,
  res: Response,
  activityId: string,
  userId: string,
  err: unknown,
): boolean {
  if (!(err instanceof FlashSaleError) || err.code !== 'RATE_LIMITED' || !limit) return false;
  limit.refuse(res, activityId, userId, retryAfterMs(err));
  return true;
}

/** The order submission's route: mounted by runtime/api/app.ts with its own handler stack. */
export const SUBMIT_ROUTE = '/v1/activities/:activityId/orders';

export interface OrdersRoutes {
  /** POST SUBMIT_ROUTE, after authentication and the rate limits. */
  submit: RequestHandler;
  /** Polling and order codes. */
  router: Router;
}

export function ordersRoutes(deps: OrdersDeps): OrdersRoutes {
  const router = Router();
  const count = reservationCounter(deps.metrics);
  const ack = deps.reservationAck ?? localAck;

  const activityOf = (req: Request): string => servedActivity(req, deps.activityId);
  // An attempt a dependency could not serve (503: Redis full, failing over or unreachable,
  // PostgreSQL down) is an attempt too: counted, so that the reservations panel shows the outage
  // and FlashSaleNoTraffic, which reads "no attempt of any result", does not blame the route.
  const countFailure = (activityId: string, err: unknown): void =>
    count(activityId, dependencyOutage(err) ? 'unavailable' : 'error');

  const submit: RequestHandler = async (req: Request, res: Response) => {
    const activityId = activityOf(req);
    const body = parseSubmitOrder(req.body);
    const userId = res.locals.userId as string;
    const limit = deps.limit;
    // The window the script calls count this submission in: one Redis call per submission.
    let window = limit?.windowOf(res);
    if (deps.soldOut.isSoldOut(activityId, body.skuId)) {
      // A retry of a submission that did reserve (its answer lost to a crash or a timeout) must
      // get its reservation back, not SOLD_OUT: it goes on to the script, which replays it. One
      // call checks that and counts the submission in the buyer's window (soldOutChecks-var.lua).
      let check;
      try {
        check = await soldOutCheck(deps.redis, {
          activityId,
          userId,
          skuId: body.skuId,
          requestId: body.requestId,
          window,
        });
      } catch (err) {
        if (refusedByScript(limit, res, activityId, userId, err)) return;
        // A bucketed SKU's point, counted before its bucket's check failed: given back on the 5xx.
        if (countedBeforeFailure(err)) limit?.counted(res);
        countFailure(activityId, err);
        throw err;
      }
      if (check.counted) {
        limit?.counted(res);
        window = undefined;
      }
      if (check.kind === 'sold-out') {
        // The answer most requests of a sale get: no reserve script, no Error (its stack trace), no
        // trip through express' error handlers. Same problem+json as the script's SOLD_OUT.
        count(activityId, 'sold_out');
        sendProblem(res, 'SOLD_OUT', 'sold out');
        return;
      }
    }
    try {
      const outcome = await reserve(deps.redis, {
        activityId,
        userId,
        skuId: body.skuId,
        quantity: body.quantity,
        requestId: body.requestId,
        traceId: res.locals.traceId as string,
        orderCode: body.orderCode,
        window,
      });
      if (outcome.counted) limit?.counted(res);
      crashPoint('api-after-reserve');
      const status =
        outcome.kind === 'reserved' || outcome.state === 'RESERVED' || outcome.state === 'PAID'
          ? 'QUEUED'
          : 'FAILED';
      // The default (acknowledged on the primary) has nothing to wait for: no promise to await.
      if (status === 'QUEUED' && ack !== localAck) {
        await ack.confirm(activityId, outcome.reservationId, outcome.kind === 'replayed', outcome.scope);
      }
      count(activityId, outcome.kind === 'reserved' ? 'ok' : 'duplicate');
      if (status === 'FAILED') {
        // A replay of a released or cancelled reservation, whose order may exist (cancelled,
        // timed out): the buyer is told what a poll says (CLOSED with its order and reason), not
        // FAILED ("no order was or will be created"). Rare; one PostgreSQL read.
        // PostgreSQL unreachable: Redis' own answer, as before (released, no order said).
        const view = await lookupOrder(deps, {
          activityId,
          userId,
          reservationId: outcome.reservationId,
        }).catch((): { status: 'FAILED' } => ({ status: 'FAILED' }));
        answer202(
          res,
          activityId,
          outcome.reservationId,
          JSON.stringify({ reservationId: outcome.reservationId, ...view, replayed: true }),
        );
        return;
      }
      // The ids come from safe alphabets: no escaping needed, no JSON.stringify of an object.
      answer202(
        res,
        activityId,
        outcome.reservationId,
        `{"reservationId":"${outcome.reservationId}","status":"${status}","replayed":${outcome.kind === 'replayed'}}`,
      );
      return;
    } catch (err) {
      if (refusedByScript(limit, res, activityId, userId, err)) return;
      // Counted by a call before the one that failed (a bucket's claim), or by the failing script
      // itself, which counts before it reads the cache: either way once, given back on a 5xx.
      if (countedBeforeFailure(err)) limit?.counted(res);
      else if (err instanceof FlashSaleError && err.code === 'NOT_LOADED' && window && window.requests > 0)
        limit?.counted(res);
      if (!(err instanceof FlashSaleError) || err.code !== 'NOT_LOADED') {
        if (err instanceof FlashSaleError) {
          count(activityId, resultLabel[err.code] ?? 'error');
          // Only a SKU with nothing left answers everyone without the script: a buyer who asked
          // for more units than are left must not turn the others away.
          if (err.code === 'SOLD_OUT' && stockLeftOf(err) === 0)
            deps.soldOut.markSoldOut(activityId, body.skuId);
        } else countFailure(activityId, err);
        // Unanswered is not refused: a timed-out or cut-off call may have reserved (a stalled
        // Redis runs it when it wakes; ioredis sends it again after a reconnect). Told "nothing
        // was done", a buyer would submit anew and meet LIMIT_REACHED or a second order.
        if (dependencyOutage(err) === 'unanswered') {
          throw new FlashSaleError(
            'UNAVAILABLE',
            'no answer in time: the reservation may have been made; retry with the same requestId',
            { reservationId: reservationIdFor(activityId, userId, body.requestId), cause: err },
          );
        }
        throw err;
      }
    }
    // No cache (not loaded yet, or cleaned up after the sale): a replay gets its order back,
    // anything else the answer of the registered sale window (core/order-view.ts).
    let answer;
    try {
      answer = await answerUnloadedSubmission(deps, {
        activityId,
        userId,
        requestId: body.requestId,
        skuId: body.skuId,
        quantity: body.quantity,
      });
    } catch (err) {
      if (err instanceof FlashSaleError) {
        // An activity nobody registered gets one shared label value: an api serving every
        // activity must not grow a metric series per made-up id.
        const activity = err.code === 'NOT_FOUND' ? UNKNOWN_ACTIVITY_LABEL : activityId;
        count(activity, resultLabel[err.code] ?? 'error');
      } else countFailure(activityId, err);
      throw err;
    }
    count(activityId, 'duplicate');
    answer202(
      res,
      activityId,
      answer.reservationId,
      JSON.stringify({ reservationId: answer.reservationId, ...answer.view, replayed: true }),
    );
  };

  router.get('/v1/activities/:activityId/orders/:reservationId', async (req: Request, res: Response) => {
    const activityId = activityOf(req);
    const reservationId = parse(reservationParam, req.params.reservationId);
    const view = await lookupOrder(deps, { activityId, userId: res.locals.userId as string, reservationId });
    res.json({ reservationId, ...view });
  });

  /** Lets a buyer who never saw the 202 find their reservation without submitting again. */
  router.get('/v1/activities/:activityId/orders', async (req: Request, res: Response) => {
    const activityId = activityOf(req);
    const requestId = parse(requestIdQuery, req.query.requestId);
    const userId = res.locals.userId as string;
    const reservationId = reservationIdFor(activityId, userId, requestId);
    const view = await lookupOrder(deps, { activityId, userId, reservationId });
    res.json({ reservationId, ...view });
  });

  router.post('/v1/activities/:activityId/order-codes', async (req: Request, res: Response) => {
    const activityId = activityOf(req);
    const body = parse(orderCodeBody, req.body);
    const meta = await readMeta(deps.redis, activityId);
    if (!meta) throw new FlashSaleError('UNKNOWN_ACTIVITY');
    if (!meta.requireOrderCode) throw new FlashSaleError('ORDER_CODES_DISABLED');
    if (!(await skuExists(deps.redis, activityId, body.skuId))) throw new FlashSaleError('UNKNOWN_SKU');
    const policy = await deps.policies.get(activityId);
    const code = await issueOrderCode(
      deps.redis,
      activityId,
      res.locals.userId as string,
      body.skuId,
      deps.orderCodeTtlSeconds,
      policy.eligibility.orderCodesPerBuyerPerSku,
    );
    res.status(201).json({ orderCode: code, expiresInSeconds: deps.orderCodeTtlSeconds });
  });

  return { submit, router };
}
