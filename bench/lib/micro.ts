/**
 * In-process micro-benchmarks of the pieces one order request pays for, and of the candidate
 * replacements proposed in the report. Variants of one group run interleaved, round after round,
 * and the median CPU time per operation is kept (process.cpuUsage, which includes the libuv
 * threads WebCrypto jobs run on): on a shared machine that is far steadier than req/s.
 */
import {
  createHmac,
  createSecretKey,
  randomBytes,
  randomUUID,
  timingSafeEqual,
  webcrypto,
} from 'node:crypto';
import type { KeyObject } from 'node:crypto';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { jwtVerify } from 'jose';
import { Partitioners } from 'kafkajs';
import type { Message } from 'kafkajs';
import type * as Errors from '../../core/errors.js';
import type * as MetricsModule from '../../core/metrics.js';
import type * as Schemas from '../../runtime/api/schemas.js';
import type * as Http from '../../runtime/http.js';
import type { Ctx } from './context.js';
import {
  encodeProduce,
  groupMessagesPerPartition,
  partitionMetadata,
  relayMessages,
} from './patched-packages.js';
import type { GroupPerPartition } from './patched-packages.js';
import { log, median } from './util.js';

export interface MicroResult {
  group: string;
  name: string;
  /** Median CPU microseconds per operation. */
  cpuUs: number;
  /** Median wall microseconds per operation. */
  wallUs: number;
}

interface Case {
  group: string;
  name: string;
  /** Runs `n` calls, each of `perCall` operations (default 1). */
  run: (n: number) => Promise<void> | void;
  /** Operations one call makes (a send of 2,000 messages is 2,000): the figures are per operation. */
  perCall?: number;
}

/**
 * The HS256 verifier proposed for runtime/api/auth.ts: the signature checked synchronously with
 * node:crypto (constant-time), then the claims jose checks by default (alg, crit, exp, nbf, iat,
 * and iss / aud when configured). Returns the subject, or undefined for any invalid token.
 */
export function hs256Verifier(
  key: KeyObject,
  opts: { issuer?: string; audience?: string } = {},
): (token: string) => string | undefined {
  const json = (s: string): unknown => JSON.parse(Buffer.from(s, 'base64url').toString('utf8'));
  return (token) => {
    const parts = token.split('.');
    if (parts.length !== 3) return undefined;
    const [h, p, sig] = parts as [string, string, string];
    let header: Record<string, unknown>;
    let claims: Record<string, unknown>;
    try {
      header = json(h) as Record<string, unknown>;
      claims = json(p) as Record<string, unknown>;
    } catch {
      return undefined;
    }
    if (!header || typeof header !== 'object' || header.alg !== 'HS256' || header.crit !== undefined) {
      return undefined;
    }
    const expected = createHmac('sha256', key).update(`${h}.${p}`).digest();
    const given = Buffer.from(sig, 'base64url');
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return undefined;
    if (!claims || typeof claims !== 'object' || Array.isArray(claims)) return undefined;
    const now = Math.floor(Date.now() / 1000);
    const { exp, nbf, iat, iss, aud, sub } = claims;
    if (exp !== undefined && (typeof exp !== 'number' || exp <= now)) return undefined;
    if (nbf !== undefined && (typeof nbf !== 'number' || nbf > now)) return undefined;
    if (iat !== undefined && typeof iat !== 'number') return undefined;
    if (opts.issuer !== undefined && iss !== opts.issuer) return undefined;
    if (opts.audience !== undefined && !(Array.isArray(aud) ? aud : [aud]).includes(opts.audience))
      return undefined;
    return typeof sub === 'string' ? sub : undefined;
  };
}

function token(secret: string, sub: string): string {
  const b64 = (o: unknown): string => Buffer.from(JSON.stringify(o)).toString('base64url');
  const input = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub, exp: Math.floor(Date.now() / 1000) + 3600 })}`;
  return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`;
}

/** `n` async operations, `concurrency` at a time (as 50 connections would have them in flight). */
async function concurrent(n: number, concurrency: number, op: () => Promise<unknown>): Promise<void> {
  for (let done = 0; done < n; done += concurrency) {
    await Promise.all(Array.from({ length: Math.min(concurrency, n - done) }, op));
  }
}

async function measure(cases: Case[], rounds: number, targetMs: number): Promise<MicroResult[]> {
  // Calibrate each case to about targetMs per round, and warm it up.
  const sizes = new Map<Case, number>();
  for (const c of cases) {
    let n = 16;
    for (;;) {
      const t = performance.now();
      await c.run(n);
      const ms = performance.now() - t;
      if (ms > targetMs / 4 || n > 1 << 20) {
        sizes.set(c, Math.max(16, Math.round((n * targetMs) / Math.max(ms, 0.01))));
        break;
      }
      n *= 4;
    }
  }
  const cpu = new Map<Case, number[]>();
  const wall = new Map<Case, number[]>();
  for (let r = 0; r < rounds; r += 1) {
    const order = r % 2 === 0 ? cases : [...cases].reverse();
    for (const c of order) {
      const n = sizes.get(c)!;
      const c0 = process.cpuUsage();
      const t0 = performance.now();
      await c.run(n);
      const dt = (performance.now() - t0) * 1000;
      const dc = process.cpuUsage(c0);
      const ops = n * (c.perCall ?? 1);
      (cpu.get(c) ?? cpu.set(c, []).get(c)!).push((dc.user + dc.system) / ops);
      (wall.get(c) ?? wall.set(c, []).get(c)!).push(dt / ops);
    }
  }
  return cases.map((c) => ({
    group: c.group,
    name: c.name,
    cpuUs: median(cpu.get(c)!),
    wallUs: median(wall.get(c)!),
  }));
}

/**
 * The relay's sends through kafkajs' grouping by partition: RELAY_BATCH_SIZE messages (2,000) keyed
 * by buyer, over the bench's 4 partitions and over 1; an operation is one message.
 */
function kafkaGroupingCases(): Case[] {
  const partitioner = Partitioners.DefaultPartitioner();
  const messages: Message[] = Array.from({ length: 2_000 }, (_, i) => ({
    key: `buyer-${i}`,
    value: '{}',
  }));
  const cases: Case[] = [];
  for (const partitions of [4, 1]) {
    const metadata = partitionMetadata(partitions);
    const group = `relay: kafkajs groups a send of 2,000 messages by partition (${partitions} partition${partitions > 1 ? 's' : ''}), per message`;
    const run = (f: GroupPerPartition) => (n: number) => {
      for (let i = 0; i < n; i += 1)
        f({ topic: 'orders', partitionMetadata: metadata, messages, partitioner });
    };
    cases.push(
      {
        group,
        perCall: messages.length,
        name: 'kafkajs 2.2.4 upstream (the partition array copied per message)',
        run: run(groupMessagesPerPartition('upstream')),
      },
      {
        group,
        perCall: messages.length,
        name: 'as installed, patches/kafkajs+2.2.4.patch (appended)',
        run: run(groupMessagesPerPartition('installed')),
      },
    );
  }
  return cases;
}

/**
 * The relay's sends through kafkajs' encoders: the produce request of RELAY_BATCH_SIZE messages
 * (2,000, as the relay makes them from outbox entries: buyer key, the order's JSON, trace and
 * reservation id headers) over the bench's 4 partitions, encoded to its bytes; an operation is one
 * message.
 */
function kafkaEncodingCases(): Case[] {
  const group =
    'relay: kafkajs encodes the produce request of a send of 2,000 messages (4 partitions), per message';
  const messages = relayMessages(2_000);
  const partitions = [0, 1, 2, 3].map((partition) => ({
    partition,
    firstSequence: 0,
    messages: messages.filter((_, i) => i % 4 === partition),
  }));
  const run = (which: 'installed' | 'upstream') => async (n: number) => {
    for (let i = 0; i < n; i += 1) {
      const bytes = await encodeProduce(which, partitions);
      if (bytes.length === 0) throw new Error('kafkajs encoded an empty request');
    }
  };
  return [
    {
      group,
      perCall: messages.length,
      name: 'kafkajs 2.2.4 upstream (a zero-filled 512-byte buffer per record and per header; varints through arrays)',
      run: run('upstream'),
    },
    {
      group,
      perCall: messages.length,
      name: 'as installed, patches/kafkajs+2.2.4.patch (buffers sized and pooled, varints written in place)',
      run: run('installed'),
    },
  ];
}

export async function microBenchmarks(ctx: Ctx): Promise<MicroResult[]> {
  const load = async <T>(rel: string): Promise<T> =>
    (await import(pathToFileURL(join(ctx.cfg.distDir, rel)).href)) as T;
  const errors = await load<typeof Errors>('core/errors.js');
  const schemas = await load<typeof Schemas>('runtime/api/schemas.js');
  const metricsModule = await load<typeof MetricsModule>('core/metrics.js');
  const http = await load<typeof Http>('runtime/http.js');
  const metrics = metricsModule.createMetrics('bench-micro');

  const secret = randomBytes(32).toString('hex');
  const raw = new TextEncoder().encode(secret);
  const cryptoKey = await webcrypto.subtle.importKey('raw', raw, { name: 'HMAC', hash: 'SHA-256' }, false, [
    'verify',
  ]);
  const verifySync = hs256Verifier(createSecretKey(Buffer.from(secret)));
  const jwt = token(secret, 'buyer-123456');
  const opts = { algorithms: ['HS256'] };
  if (verifySync(jwt) !== 'buyer-123456') throw new Error('the HS256 prototype rejects a valid token');
  if (verifySync(token(`${secret}x`, 'b')) !== undefined)
    throw new Error('the HS256 prototype accepts a bad signature');

  const body = { skuId: 'hot', quantity: 1, requestId: 'q123456' };
  const rid = ctx.core.reservations.reservationIdFor;
  const labels = { route: '/v1/activities/:activityId/orders', method: 'POST', code: '202' };
  const child = metrics.httpDuration.labels(labels);
  // An error thrown from a stack about as deep as an express handler's.
  const deep = (d: number, f: () => void): void => (d === 0 ? f() : deep(d - 1, f));

  const cases: Case[] = [
    {
      group: 'JWT HS256 verify',
      name: 'jose jwtVerify, secret as Uint8Array (current: WebCrypto importKey + verify job per call)',
      run: (n) => concurrent(n, 50, () => jwtVerify(jwt, raw, opts)),
    },
    {
      group: 'JWT HS256 verify',
      name: 'jose jwtVerify, CryptoKey imported once',
      run: (n) => concurrent(n, 50, () => jwtVerify(jwt, cryptoKey, opts)),
    },
    {
      group: 'JWT HS256 verify',
      name: 'node:crypto HMAC + claim checks, synchronous (proposed)',
      run: (n) => {
        for (let i = 0; i < n; i += 1) verifySync(jwt);
      },
    },
    {
      group: 'trace id',
      name: "randomBytes(16).toString('hex') (before 2026-12-01)",
      run: (n) => {
        for (let i = 0; i < n; i += 1) randomBytes(16).toString('hex');
      },
    },
    {
      group: 'trace id',
      name: "randomUUID().replaceAll('-', '') (before 2026-12-02)",
      run: (n) => {
        for (let i = 0; i < n; i += 1) randomUUID().replaceAll('-', '');
      },
    },
    {
      group: 'trace id',
      name: 'newTraceId(): hex of a block of random bytes filled every 256 ids (current)',
      run: (n) => {
        for (let i = 0; i < n; i += 1) http.newTraceId();
      },
    },
    {
      group: 'sold-out answer',
      name: 'throw new FlashSaleError from 25 frames deep, caught (current)',
      run: (n) => {
        for (let i = 0; i < n; i += 1) {
          try {
            deep(25, () => {
              throw new errors.FlashSaleError('SOLD_OUT', 'sold out', { reservationId: 'x' });
            });
          } catch {
            // expected
          }
        }
      },
    },
    {
      group: 'sold-out answer',
      name: 'problem object built directly, no Error (proposed)',
      run: (n) => {
        for (let i = 0; i < n; i += 1) {
          deep(25, () => void JSON.stringify({ code: 'SOLD_OUT', status: 409, reservationId: 'x' }));
        }
      },
    },
    {
      group: 'per-request helpers',
      name: 'reservationIdFor (sha256)',
      run: (n) => {
        for (let i = 0; i < n; i += 1) rid('activity', 'buyer-123456', `q${i}`);
      },
    },
    {
      group: 'per-request helpers',
      name: 'zod submitOrderBody.safeParse',
      run: (n) => {
        for (let i = 0; i < n; i += 1) schemas.submitOrderBody.safeParse(body);
      },
    },
    {
      group: 'per-request helpers',
      name: 'request histogram: startTimer + end(labels) (current)',
      run: (n) => {
        for (let i = 0; i < n; i += 1) metrics.httpDuration.startTimer()(labels);
      },
    },
    {
      group: 'per-request helpers',
      name: 'request histogram: cached labelled child observe',
      run: (n) => {
        for (let i = 0; i < n; i += 1) child.observe(0.001);
      },
    },
    ...kafkaGroupingCases(),
    ...kafkaEncodingCases(),
  ];
  const results: MicroResult[] = [];
  const groups = [...new Set(cases.map((c) => c.group))];
  for (const g of groups)
    results.push(
      ...(await measure(
        cases.filter((c) => c.group === g),
        7,
        40,
      )),
    );
  for (const r of results) log(`micro ${r.group}: ${r.name}: ${r.cpuUs.toFixed(2)} µs CPU/op`);
  return results;
}
