/** The one catch point that turns errors into `application/problem+json`. */
import type { ErrorRequestHandler, Response } from 'express';
import { dependencyOutage, ErrorCodes, FlashSaleError } from '../../core/errors.js';
import type { ErrorCode } from '../../core/errors.js';
import type { Logger } from '../../core/logger.js';

/**
 * res.locals key of the function that returns the request's rate-limit points
 * (runtime/api/rate-limit.ts): a request answered with a 5xx was our failure, not the buyer's.
 */
export const GIVE_BACK = 'rateLimitGiveBack';

const problemTypes = new Map<string, string>();
const problemType = (code: ErrorCode): string => {
  let t = problemTypes.get(code);
  if (t === undefined) {
    t = `https://flashsale.io/problems/${code.toLowerCase().replace(/_/g, '-')}`;
    problemTypes.set(code, t);
  }
  return t;
};

const problemJson = (code: ErrorCode, detail: string, extra: Readonly<Record<string, unknown>>): string => {
  const { status, title } = ErrorCodes[code];
  return JSON.stringify({ type: problemType(code), title, status, code, detail, ...extra });
};

const NO_EXTRA: Readonly<Record<string, unknown>> = Object.freeze({});

/**
 * Bodies without extra fields, by code and detail: the same few (SOLD_OUT above all) answer most
 * requests of a sale. Bounded: details that vary (they name an activity, a limit) stop being
 * remembered once it is full and are built per answer.
 */
const plainBodies = new Map<string, string>();
const PLAIN_BODIES_MAX = 512;
const plainBody = (code: ErrorCode, detail: string): string => {
  const key = `${code}\n${detail}`;
  let body = plainBodies.get(key);
  if (body === undefined) {
    body = problemJson(code, detail, NO_EXTRA);
    if (plainBodies.size < PLAIN_BODIES_MAX) plainBodies.set(key, body);
  }
  return body;
};

/**
 * Answers with a problem+json body. Written with writeHead-level calls, not res.status().type()
 * .json(): the same status, headers and body (`application/problem+json; charset=utf-8`) without
 * express' content-type lookup and send() machinery, on the path most requests of a sale take
 * (SOLD_OUT). Headers set before (retry-after, x-request-id) are kept; a 503 without one gets
 * `retry-after: 1`.
 */
export function sendProblem(
  res: Response,
  code: ErrorCode,
  detail?: string,
  extra: Readonly<Record<string, unknown>> = NO_EXTRA,
): void {
  const { status, title } = ErrorCodes[code];
  if (status >= 500) {
    const giveBack = res.locals[GIVE_BACK] as (() => void) | undefined;
    res.locals[GIVE_BACK] = undefined;
    giveBack?.();
    // A client told nothing retries at once, every one of them, into the outage (RFC 9110 §10.2.3).
    if (status === 503 && !res.hasHeader('retry-after')) res.setHeader('retry-after', '1');
  }
  const body =
    extra === NO_EXTRA ? plainBody(code, detail ?? title) : problemJson(code, detail ?? title, extra);
  res.statusCode = status;
  res.setHeader('content-type', 'application/problem+json; charset=utf-8');
  res.setHeader('content-length', Buffer.byteLength(body));
  res.end(body);
}

/** Fields of FlashSaleError.extra a client may see; anything else (script data) stays inside. */
const PUBLIC_EXTRAS = ['errors', 'reservationId'] as const;

/**
 * Body-parser and framework errors carry a `type` / `status`; map them to stable codes, each with
 * an accurate detail. Body-parser's own 415s (a charset other than UTF-8, a Content-Encoding it
 * cannot decode) stay 415s; the router's 400 for a path it cannot percent-decode is said so.
 */
function frameworkProblem(err: unknown): { code: ErrorCode; detail: string } | undefined {
  const e = (err ?? {}) as { type?: unknown; status?: unknown };
  switch (e.type) {
    case 'entity.too.large':
      return { code: 'PAYLOAD_TOO_LARGE', detail: 'the body exceeds the limit' };
    case 'entity.parse.failed':
      return { code: 'VALIDATION_ERROR', detail: 'malformed JSON body' };
    case 'charset.unsupported':
      return {
        code: 'UNSUPPORTED_MEDIA_TYPE',
        detail: 'unsupported charset; send application/json in UTF-8',
      };
    case 'encoding.unsupported':
      return {
        code: 'UNSUPPORTED_MEDIA_TYPE',
        detail: 'unsupported Content-Encoding; send identity, gzip, deflate or br',
      };
    case 'request.size.invalid':
      return { code: 'VALIDATION_ERROR', detail: 'the body does not match its Content-Length' };
  }
  if (e.status !== 400) return undefined;
  // router's decodeParam: decodeURIComponent's URIError with status 400.
  if (err instanceof URIError)
    return { code: 'VALIDATION_ERROR', detail: 'malformed percent-encoding in the path' };
  return { code: 'VALIDATION_ERROR', detail: 'the request body could not be read' };
}

/**
 * Logs a dependency outage's failed requests at most once per `intervalMs`, each line counting the
 * ones left out since the last: a Redis that refuses every write (out of memory, a failed save)
 * fails thousands of requests a second, and a line with a stack for each would cost more CPU than
 * the requests and bury everything else in the log. The first failure after a quiet interval is
 * logged at once; the others of the interval are written as one line (the last of them, with the
 * count) when it ends, so a burst that ends within its second is counted in full right away.
 */
export function outageLog(
  logger: Logger,
  intervalMs = 1000,
  message = 'a dependency is unavailable',
): (fields: Record<string, unknown>) => void {
  let lastMs = -Infinity;
  // The interval's failures not written yet: the last one's fields, and how many.
  let lastLeftOut: Record<string, unknown> | undefined;
  let leftOut = 0;
  let timer: NodeJS.Timeout | undefined;
  const write = (fields: Record<string, unknown>, unloggedSinceLast: number): void => {
    logger.error({ ...fields, unloggedSinceLast }, message);
    lastMs = Date.now();
  };
  const flush = (): void => {
    timer = undefined;
    if (!lastLeftOut) return;
    write(lastLeftOut, leftOut - 1);
    lastLeftOut = undefined;
    leftOut = 0;
  };
  return (fields) => {
    const now = Date.now();
    if (now - lastMs >= intervalMs && !lastLeftOut) {
      write(fields, 0);
      return;
    }
    lastLeftOut = fields;
    leftOut += 1;
    // Never keeps the process alive: a stopping api loses at most one interval's count.
    timer ??= setTimeout(flush, Math.max(0, lastMs + intervalMs - now)).unref();
  };
}

export function problemHandler(logger: Logger): ErrorRequestHandler {
  const logOutage = outageLog(logger);
  // A 503 of ours (NOT_REPLICATED while a failover runs, UNAVAILABLE, BUCKETED, NOT_WRITTEN_BACK)
  // is a passing state that every request meets while it lasts: logged like an outage, once a
  // second per code.
  const retryLater = new Map<string, (fields: Record<string, unknown>) => void>();
  const logRetryLater = (code: string, fields: Record<string, unknown>): void => {
    let log = retryLater.get(code);
    if (!log) {
      log = outageLog(logger, 1000, 'a request was answered 503; retry');
      retryLater.set(code, log);
    }
    log({ ...fields, code });
  };
  return (err: unknown, req, res, _next) => {
    if (res.headersSent) return;
    if (err instanceof FlashSaleError) {
      const extra: Record<string, unknown> = {};
      for (const field of PUBLIC_EXTRAS) if (err.extra[field] !== undefined) extra[field] = err.extra[field];
      if (err.status === 503) logRetryLater(err.code, { err, traceId: res.locals.traceId, path: req.path });
      else if (err.status >= 500) logger.error({ err, traceId: res.locals.traceId }, 'request failed');
      sendProblem(res, err.code, err.message, extra);
      return;
    }
    const framework = frameworkProblem(err);
    if (framework) {
      sendProblem(res, framework.code, framework.detail);
      return;
    }
    const outage = dependencyOutage(err);
    if (outage) {
      logOutage({ err, outage, traceId: res.locals.traceId, path: req.path });
      sendProblem(res, 'UNAVAILABLE', 'a dependency is unavailable; retry');
      return;
    }
    logger.error({ err, traceId: res.locals.traceId, path: req.path }, 'unhandled error');
    sendProblem(res, 'INTERNAL', 'internal error');
  };
}
