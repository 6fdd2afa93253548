/** The api role: the buyer HTTP API on top of the service app. */
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Express, NextFunction, Request, RequestHandler, Router } from 'express';
import { FlashSaleError } from '../../core/errors.js';
import type { Logger } from '../../core/logger.js';
import { createServiceApp } from '../http.js';
import type { ServiceAppOptions } from '../http.js';
import { bearerAuth } from './auth.js';
import type { AuthConfig } from './auth.js';
import { jsonBody } from './json-body.js';
import { ordersRoutes, SUBMIT_ROUTE } from './orders-routes.js';
import type { OrdersDeps } from './orders-routes.js';
import { problemHandler, sendProblem } from './problem.js';
import type { AdmissionControl } from './admission.js';
import { PolicyCache } from './policy-cache.js';
import { rateLimitStages } from './rate-limit.js';
import { REFUND_PATH } from './refund-routes.js';
import { REGISTRATION_PATH, registrationRouter } from './registration-routes.js';

export interface ApiOptions extends ServiceAppOptions, Omit<OrdersDeps, 'policies'> {
  /** Traffic policies per activity; by default read from Redis every second. */
  policies?: PolicyCache;
  auth: AuthConfig;
  bodyLimit: string;
  logger: Logger;
  /** Extra routers mounted behind authentication (e.g. cancellation, payments). */
  extraRouters?: Router[];
  /** Routers mounted without buyer authentication (e.g. signed payment notifications). */
  publicRouters?: Router[];
  /** Load shedding; mounted after the health and metrics routes so they stay answerable. */
  admission?: AdmissionControl;
  /** Express `trust proxy`: which proxy hops may name the client address (docs/operator.md). */
  trustProxy?: boolean | number | string[];
}

function findOpenApi(): string | undefined {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 5; i += 1) {
    const candidate = join(dir, 'runtime', 'api', 'openapi.yaml');
    if (existsSync(candidate)) return candidate;
    const here = join(dir, 'openapi.yaml');
    if (existsSync(here)) return here;
    dir = dirname(dir);
  }
  return undefined;
}

const refuseMediaType = (): FlashSaleError =>
  new FlashSaleError('UNSUPPORTED_MEDIA_TYPE', 'send application/json');

/** res.locals key: the request's media type was checked already (an optional-body route). */
const MEDIA_TYPE_CHECKED = 'mediaTypeChecked';

/**
 * `application/json`, with or without parameters: not `application/json-patch+json` or
 * `application/json-seq`, which body-parser leaves unread (the route would see no body at all).
 */
const JSON_MEDIA_TYPE = /^application\/json\s*(?:;|$)/i;

/** Only JSON bodies are read; anything else on a write is refused before authentication work. */
const jsonOnly: RequestHandler = (req, res, next) => {
  if (
    res.locals[MEDIA_TYPE_CHECKED] !== true &&
    (req.method === 'POST' || req.method === 'PUT' || req.method === 'DELETE') &&
    req.headers['content-length'] !== '0'
  ) {
    const type = req.headers['content-type'] ?? '';
    if (req.method !== 'DELETE' && !JSON_MEDIA_TYPE.test(type)) {
      next(refuseMediaType());
      return;
    }
  }
  next();
};

/**
 * Routes that read no body, or an optional one: an absent body (neither Content-Length nor
 * Transfer-Encoding, as `curl -X POST` sends it) and an empty chunked one are no body, like
 * `Content-Length: 0`, whatever the Content-Type. A body that is there must be JSON.
 */
const BODY_OPTIONAL_ROUTES = [REGISTRATION_PATH, REFUND_PATH];

/**
 * Waits for the first byte of a chunked body of another type than JSON: none (the body ends
 * empty) is no body; a byte is refused with UNSUPPORTED_MEDIA_TYPE, the rest read off unread.
 */
function noBodyOrRefuse(req: Request, next: NextFunction): void {
  let settled = false;
  const settle = (err?: unknown): void => {
    if (settled) return;
    settled = true;
    req.off('data', onData);
    req.off('end', onEnd);
    req.off('error', onGone);
    req.off('close', onGone);
    if (err !== undefined) req.resume();
    next(err);
  };
  const onData = (chunk: Buffer): void => {
    if (chunk.length > 0) settle(refuseMediaType());
  };
  const onEnd = (): void => settle();
  // The client went away before the end: answered (to nobody) as body-parser does.
  const onGone = (): void =>
    settle(Object.assign(new Error('request aborted'), { status: 400, type: 'request.aborted' }));
  req.on('data', onData);
  req.on('end', onEnd);
  req.on('error', onGone);
  req.on('close', onGone);
}

const jsonOrNoBody: RequestHandler = (req, res, next) => {
  res.locals[MEDIA_TYPE_CHECKED] = true;
  const h = req.headers;
  if (JSON_MEDIA_TYPE.test(h['content-type'] ?? '')) {
    next();
    return;
  }
  if (h['transfer-encoding'] === undefined) {
    // No body at all, or a declared length: only an empty one is no body.
    const length = h['content-length'];
    if (length === undefined || Number(length) === 0) next();
    else next(refuseMediaType());
    return;
  }
  noBodyOrRefuse(req, next);
};

export async function createApiApp(opts: ApiOptions): Promise<Express> {
  const app = createServiceApp(opts);
  if (opts.trustProxy !== undefined) app.set('trust proxy', opts.trustProxy);
  if (opts.admission) app.use(opts.admission.middleware());
  const deps = { ...opts, policies: opts.policies ?? new PolicyCache(opts.redis, 1000, opts.logger) };
  const limits = rateLimitStages(deps);
  // A request with a body counts in flight once the body is read (admission.ts).
  const body = opts.admission
    ? [jsonBody(opts.bodyLimit), opts.admission.bodyRead()]
    : [jsonBody(opts.bodyLimit)];
  const auth = await bearerAuth(opts.auth);
  const orders = ordersRoutes({ ...deps, limit: limits.submit });
  // The order submission, most of a sale's requests, is one route with its whole handler stack:
  // the same stages in the same order as the layers below (media type, address limit, body,
  // token, buyer limit), without walking and matching every layer of the app for each request.
  // Mounted right after admission control: the routes below it are never matched against it.
  // Its buyer limit is counted by the reservation's own script call (one Redis call).
  app.post(
    SUBMIT_ROUTE,
    jsonOnly,
    limits.beforeAuthHandler,
    ...body,
    auth,
    limits.submit.afterAuthHandler,
    orders.submit,
  );
  const openapiPath = findOpenApi();
  const openapi = openapiPath ? readFileSync(openapiPath, 'utf8') : undefined;
  app.get('/openapi.yaml', (_req, res) => {
    if (!openapi) {
      sendProblem(res, 'NOT_FOUND', 'the OpenAPI document is not bundled');
      return;
    }
    res.type('application/yaml').send(openapi);
  });
  for (const r of opts.publicRouters ?? []) app.use(r);
  app.post(BODY_OPTIONAL_ROUTES, jsonOrNoBody);
  app.use('/v1', jsonOnly);
  app.use(limits.beforeAuth);
  app.use('/v1', body);
  app.use('/v1', auth);
  app.use(limits.afterAuth);
  app.use(orders.router);
  app.use(registrationRouter(opts));
  for (const r of opts.extraRouters ?? []) app.use(r);
  app.use((_req, res) => {
    sendProblem(res, 'NOT_FOUND', 'no such route');
  });
  app.use(problemHandler(opts.logger));
  return app;
}
