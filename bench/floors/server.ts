/**
 * The floors the api's CPU per request is measured against (docs/benchmarks.md, "Floors"): the
 * least a server must do to answer the same `POST /v1/activities/{id}/orders` with the same
 * outcome, on the same machine, in the same run.
 *
 *   FLOOR_KIND=node-http  a bare node:http server
 *   FLOOR_KIND=express    one express 5 route, the body read from the stream (no body-parser)
 *
 * Both verify the bearer token with the api's own createTokenVerifier() and make the api's
 * reserve call (core/reservations.ts reserve(): one EVALSHA of the reserve script on an
 * auto-pipelining ioredis client), both loaded from the measured build (FLOOR_DIST), so the
 * difference to the api is what the api adds on top: routing, middleware, validation, limits,
 * metrics. `GET /healthz` answers `{"status":"ok"}`. Started by bench/lib/floors.ts; prints
 * `listening <port>` once it accepts connections.
 */
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import express from 'express';
import type * as Auth from '../../runtime/api/auth.js';
import type * as RedisModule from '../../core/redis.js';
import type * as Reservations from '../../core/reservations.js';
import type * as Scripts from '../../core/scripts.js';

const env = (name: string): string => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is required`);
  return v;
};

const kind = env('FLOOR_KIND');
const dist = env('FLOOR_DIST');
const load = async <T>(rel: string): Promise<T> => (await import(pathToFileURL(join(dist, rel)).href)) as T;
const auth = await load<typeof Auth>('runtime/api/auth.js');
const redisModule = await load<typeof RedisModule>('core/redis.js');
const reservations = await load<typeof Reservations>('core/reservations.js');
const scripts = await load<typeof Scripts>('core/scripts.js');

// The api's client options (runtime/main.ts).
const redis = redisModule.createRedis(
  { url: env('REDIS_URL'), sentinels: [] },
  { enableAutoPipelining: false, maxRetriesPerRequest: 3 },
);
scripts.registerScripts(redis);
const verify = await auth.createTokenVerifier({
  JWT_HS256_SECRET: env('JWT_HS256_SECRET'),
  JWT_MAX_TOKEN_AGE_SECONDS: Number(process.env.JWT_MAX_TOKEN_AGE_SECONDS ?? 3600),
});
const BODY_LIMIT = 8 * 1024;
const ORDERS = /^\/v1\/activities\/([A-Za-z0-9][A-Za-z0-9._-]{0,62})\/orders$/;
const BEARER = /^Bearer ([A-Za-z0-9._-]+)$/;

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > BODY_LIMIT) reject(new Error('too large'));
      else chunks.push(c);
    });
    req.on('end', () =>
      resolve(chunks.length === 1 ? chunks[0]!.toString() : Buffer.concat(chunks).toString()),
    );
    req.on('error', reject);
  });
}

function answer(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

/** Token, body, reserve, 202: the work every floor and the api share. */
async function order(req: IncomingMessage, res: ServerResponse, activityId: string): Promise<void> {
  const m = BEARER.exec(req.headers.authorization ?? '');
  let userId: string;
  try {
    if (!m) throw new Error('no token');
    userId = await verify(m[1]!);
  } catch {
    answer(res, 401, '{"code":"UNAUTHORIZED"}');
    return;
  }
  const body = JSON.parse(await readBody(req)) as { skuId: string; quantity: number; requestId: string };
  try {
    const outcome = await reservations.reserve(redis, {
      activityId,
      userId,
      skuId: body.skuId,
      quantity: body.quantity,
      requestId: body.requestId,
      traceId: randomUUID().replaceAll('-', ''),
    });
    const payload = JSON.stringify({
      reservationId: outcome.reservationId,
      status: 'QUEUED',
      replayed: outcome.kind === 'replayed',
    });
    res.writeHead(202, {
      'content-type': 'application/json; charset=utf-8',
      'content-length': Buffer.byteLength(payload),
      location: `/v1/activities/${activityId}/orders/${outcome.reservationId}`,
    });
    res.end(payload);
  } catch (err) {
    answer(res, 409, JSON.stringify({ code: (err as { code?: string }).code ?? 'ERROR' }));
  }
}

const fail = (res: ServerResponse) => (): void => {
  if (!res.headersSent) answer(res, 500, '{"code":"INTERNAL"}');
};

let server;
if (kind === 'node-http') {
  server = createServer((req, res) => {
    const url = req.url ?? '';
    if (req.method === 'GET' && url === '/healthz') {
      answer(res, 200, '{"status":"ok"}');
      return;
    }
    const m = req.method === 'POST' ? ORDERS.exec(url) : null;
    if (!m) {
      answer(res, 404, '{"code":"NOT_FOUND"}');
      return;
    }
    order(req, res, m[1]!).catch(fail(res));
  });
} else if (kind === 'express') {
  const app = express();
  app.disable('x-powered-by');
  app.set('etag', false);
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  app.post('/v1/activities/:activityId/orders', (req, res) => {
    order(req, res, req.params.activityId).catch(fail(res));
  });
  server = createServer(app);
} else {
  throw new Error(`FLOOR_KIND: node-http or express, got ${kind}`);
}
server.keepAliveTimeout = 65_000;
server.listen(Number(env('PORT')), '127.0.0.1', () => {
  process.stdout.write(`listening ${env('PORT')}\n`);
});
process.on('SIGTERM', () => {
  server.close();
  redis.disconnect();
  process.exit(0);
});
