/**
 * The HTTP servers every role runs. The service app (HTTP_PORT): /healthz, /readyz, a trace id
 * per request and the request-duration histogram; the api role mounts its routes on it. The
 * metrics app (METRICS_PORT): /metrics, with /healthz and /readyz again. /metrics is never on the
 * service port, so the buyer Service in front of the api cannot expose it.
 */
import { randomFillSync } from 'node:crypto';
import express from 'express';
import type { Express, RequestHandler, Response } from 'express';
import type { Metrics } from '../core/metrics.js';

/** Readiness with the state of each dependency or part (`ok`, or what is wrong). */
export interface Readiness {
  ready: boolean;
  checks: Record<string, string>;
}

export interface ServiceAppOptions {
  metrics: Metrics;
  /** Whether the role can do its work (dependencies reachable, not shutting down), with details. */
  ready: () => Promise<boolean | Readiness>;
  /** Why the process sheds load right now (runtime/api/admission.ts), or undefined. */
  shedding?: () => string | undefined;
}

/**
 * /readyz on either port: whether the role can do its work. Shedding is said (`shedding`: why) but
 * does not make it unready: a sale's opening loads every replica at once, and a readiness that
 * failed with the load would take them all out of the Service together (new connections refused
 * instead of a fast 503 OVERLOADED with Retry-After, then flapping as the load moves).
 */
function readyz(opts: ServiceAppOptions): RequestHandler {
  return async (_req, res) => {
    const shedding = opts.shedding?.();
    const r = await opts.ready().catch(() => false);
    const ok = typeof r === 'boolean' ? r : r.ready;
    res.status(ok ? 200 : 503).json({
      status: ok ? 'ready' : 'not ready',
      ...(shedding ? { shedding } : {}),
      ...(typeof r === 'boolean' ? {} : { checks: r.checks }),
    });
  };
}

const HEALTHY = '{"status":"ok"}';

/** Liveness: the process answers. Written directly (a probe hits it every few seconds per pod). */
const healthz: RequestHandler = (_req, res) => {
  res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'content-length': HEALTHY.length });
  res.end(HEALTHY);
};

const TRACE_ID = /^[A-Za-z0-9-]{8,64}$/;

/** Trace id: from `traceparent` (W3C) or `x-request-id`, else a new one; echoed back. */
const TRACEPARENT = /^[\da-f]{2}-([\da-f]{32})-[\da-f]{16}-[\da-f]{2}$/;

/** Random bytes for new trace ids, drawn in blocks: one fill per 256 ids. */
const traceIdPool = Buffer.allocUnsafe(16 * 256);
let traceIdOffset = traceIdPool.length;

/** A new W3C trace id: 16 random bytes as 32 hex digits. */
export function newTraceId(): string {
  if (traceIdOffset === traceIdPool.length) {
    randomFillSync(traceIdPool);
    traceIdOffset = 0;
  }
  const id = traceIdPool.toString('hex', traceIdOffset, traceIdOffset + 16);
  traceIdOffset += 16;
  return id;
}

export const traceId: RequestHandler = (req, res, next) => {
  const header = req.headers.traceparent;
  const parent = header === undefined ? null : TRACEPARENT.exec(String(header));
  const given = req.headers['x-request-id'];
  const id = parent?.[1] ?? (typeof given === 'string' && TRACE_ID.test(given) ? given : newTraceId());
  res.locals.traceId = id;
  res.setHeader('x-request-id', id);
  next();
};

/** When a response's request arrived (performance.now()). */
const STARTED = Symbol('started');
type TimedResponse = Response & { [STARTED]?: number };

export function createServiceApp(opts: ServiceAppOptions): Express {
  const app = express();
  app.disable('x-powered-by');
  app.set('etag', false);
  // Liveness first: a probe is not buyer traffic, it needs neither a trace id nor a sample in the
  // request histogram, and answers at about the cost of a bare node:http server (bench floors).
  app.get('/healthz', healthz);
  // One labelled child per route, method and status, looked up by a string key: prom-client's
  // startTimer() + end(labels) builds and validates a label object on every request.
  const children = new Map<string, { observe: (seconds: number) => void }>();
  // The histogram's 'finish' listener: one function for all responses, no closure per request.
  // The route template, never the raw path: label cardinality stays bounded. A route declared with
  // several paths (the rate limiter's) has an array here: its label is the list, as prom-client has
  // always rendered it.
  function observeDuration(this: TimedResponse): void {
    const { req, statusCode } = this;
    const path = (req.route as { path?: unknown } | undefined)?.path;
    const route = path === undefined ? 'unmatched' : String(path);
    const key = `${route} ${req.method} ${statusCode}`;
    let child = children.get(key);
    if (!child) {
      child = opts.metrics.httpDuration.labels(route, req.method, String(statusCode));
      children.set(key, child);
    }
    child.observe((performance.now() - this[STARTED]!) / 1000);
  }
  // The trace id and the duration histogram in one layer: every request walks express' layers.
  app.use((req, res, next) => {
    (res as TimedResponse)[STARTED] = performance.now();
    res.on('finish', observeDuration);
    traceId(req, res, next);
  });
  app.get('/readyz', readyz(opts));
  return app;
}

/** The metrics port's app: /metrics, /healthz and /readyz only. */
export function createMetricsApp(opts: ServiceAppOptions): Express {
  const app = express();
  app.disable('x-powered-by');
  app.set('etag', false);
  app.get('/metrics', async (_req, res) => {
    res.type(opts.metrics.registry.contentType).send(await opts.metrics.registry.metrics());
  });
  app.get('/healthz', healthz);
  app.get('/readyz', readyz(opts));
  app.use((_req, res) => {
    res.status(404).json({ status: 'not found' });
  });
  return app;
}
