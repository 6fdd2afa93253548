/**
 * The HTTP server every role runs: /healthz, /readyz, /metrics, a trace id per request and the
 * request-duration histogram. The api role mounts its routes on the same app.
 */
import { randomUUID } from 'node:crypto';
import express from 'express';
import type { Express, RequestHandler } from 'express';
import type { Metrics } from '../core/metrics.js';

export interface ServiceAppOptions {
  metrics: Metrics;
  /** Resolves true when the role can do its work (dependencies reachable, not shutting down). */
  ready: () => Promise<boolean>;
  /** Why the process sheds load right now (runtime/api/admission.ts), or undefined. */
  shedding?: () => string | undefined;
}

const TRACE_ID = /^[A-Za-z0-9-]{8,64}$/;

/** Trace id: from `traceparent` (W3C) or `x-request-id`, else a new one; echoed back. */
export const traceId: RequestHandler = (req, res, next) => {
  const parent = /^[\da-f]{2}-([\da-f]{32})-[\da-f]{16}-[\da-f]{2}$/.exec(
    String(req.headers.traceparent ?? ''),
  );
  const given = req.headers['x-request-id'];
  const id =
    parent?.[1] ??
    // randomUUID draws from a cached entropy pool: a fraction of randomBytes(16)'s cost.
    (typeof given === 'string' && TRACE_ID.test(given) ? given : randomUUID().replaceAll('-', ''));
  res.locals.traceId = id;
  res.setHeader('x-request-id', id);
  next();
};

export function createServiceApp(opts: ServiceAppOptions): Express {
  const app = express();
  app.disable('x-powered-by');
  app.set('etag', false);
  app.use(traceId);
  app.use((req, res, next) => {
    const end = opts.metrics.httpDuration.startTimer();
    res.on('finish', () => {
      // The route template, never the raw path: label cardinality stays bounded.
      const route = (req.route as { path?: string } | undefined)?.path ?? 'unmatched';
      end({ route, method: req.method, code: String(res.statusCode) });
    });
    next();
  });
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  app.get('/readyz', async (_req, res) => {
    const shedding = opts.shedding?.();
    if (shedding) {
      // Not ready while shedding, so a load balancer sends new connections elsewhere.
      res.status(503).json({ status: 'shedding', reason: shedding });
      return;
    }
    const ok = await opts.ready().catch(() => false);
    res.status(ok ? 200 : 503).json({ status: ok ? 'ready' : 'not ready' });
  });
  app.get('/metrics', async (_req, res) => {
    res.type(opts.metrics.registry.contentType).send(await opts.metrics.registry.metrics());
  });
  return app;
}
