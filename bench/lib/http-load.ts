/**
 * HTTP load with autocannon (keep-alive, HTTP/1.1, no pipelining). Order submissions use distinct
 * buyers: every request takes the next buyer of a pool of pre-signed HS256 tokens (signed here
 * with node:crypto, exactly what `jose` verifies) and a fresh requestId, so no request is a replay
 * or runs into the per-buyer limit.
 */
import { createHmac } from 'node:crypto';
import autocannon from 'autocannon';
import { log } from './util.js';

const b64url = (s: string | Buffer): string => Buffer.from(s).toString('base64url');

/**
 * Order load signs ahead this many tokens per second of a run (more than any server here answers),
 * so that no token is signed while a run is measured.
 */
export const PRESIGN_PER_SECOND = 20_000;

export class Buyers {
  private readonly header = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  /** Signed tokens not taken yet: tokens[i] is buyer first + i. */
  private tokens: string[] = [];
  private first = 0;
  private next = 0;
  private signedLate = 0;
  private readonly iat = Math.floor(Date.now() / 1000);
  private readonly exp = this.iat + 6 * 3600;

  constructor(
    private readonly secret: string,
    private readonly prefix: string,
    presign: number,
  ) {
    this.presign(presign);
  }

  private sign(i: number): string {
    const payload = b64url(JSON.stringify({ sub: `${this.prefix}${i}`, iat: this.iat, exp: this.exp }));
    const input = `${this.header}.${payload}`;
    return `${input}.${createHmac('sha256', this.secret).update(input).digest('base64url')}`;
  }

  /**
   * Signs tokens until `count` unused ones are ready, and drops the used ones. Called before a
   * measured run: a token signed during one costs the load generator about 3 µs of the CPU the
   * server under test shares with it, and slows the server down in turn (fewer requests per event
   * loop turn, more CPU per request), so a run that ran out of pre-signed tokens measured less.
   */
  presign(count: number): void {
    this.tokens = this.tokens.slice(this.next - this.first);
    this.first = this.next;
    const t = Date.now();
    const from = this.first + this.tokens.length;
    const to = this.first + count;
    for (let i = from; i < to; i += 1) this.tokens.push(this.sign(i));
    if (to - from >= 100_000) log(`signed ${to - from} buyer tokens in ${Date.now() - t} ms`);
  }

  /** The next unused buyer: its token and a requestId never used before. */
  take(): { token: string; requestId: string } {
    const i = this.next;
    this.next += 1;
    let token = this.tokens[i - this.first];
    if (token === undefined) {
      token = this.sign(i);
      this.signedLate += 1;
    }
    return { token, requestId: `q${i}` };
  }

  /** Tokens signed while a load ran (pre-signing fell short), since the last call. */
  takeSignedLate(): number {
    const n = this.signedLate;
    this.signedLate = 0;
    return n;
  }

  get used(): number {
    return this.next;
  }
}

export interface LoadResult {
  /** Responses per second (any status). */
  rps: number;
  /** 2xx responses per second. */
  okRps: number;
  total: number;
  statusCounts: Record<string, number>;
  p50Ms: number;
  p99Ms: number;
  avgMs: number;
  errors: number;
  durationS: number;
  /** CPU time per response, in microseconds, of the api process, Redis and the load generator. */
  cpu?: { api?: number; redis?: number; loadgen?: number };
  /** When this is the median of several measured runs: each run's server CPU µs per response. */
  cpuRounds?: number[];
}

function toResult(r: autocannon.Result): LoadResult {
  const statusCounts: Record<string, number> = {};
  for (const [code, v] of Object.entries(r.statusCodeStats ?? {})) statusCounts[code] = Number(v.count);
  const total = Object.values(statusCounts).reduce((a, b) => a + b, 0);
  return {
    rps: total / r.duration,
    okRps: r['2xx'] / r.duration,
    total,
    statusCounts,
    p50Ms: r.latency.p50,
    p99Ms: r.latency.p99,
    avgMs: r.latency.average,
    errors: r.errors + r.timeouts,
    durationS: r.duration,
  };
}

export interface OrderLoadOptions {
  baseUrl: string;
  activityId: string;
  skuId: string;
  buyers: Buyers;
  seconds: number;
  connections: number;
}

export async function orderLoad(o: OrderLoadOptions): Promise<LoadResult> {
  const path = `/v1/activities/${o.activityId}/orders`;
  o.buyers.presign(Math.ceil(o.seconds * PRESIGN_PER_SECOND));
  o.buyers.takeSignedLate();
  const r = await autocannon({
    url: o.baseUrl,
    connections: o.connections,
    pipelining: 1,
    duration: o.seconds,
    timeout: 30,
    requests: [
      {
        method: 'POST',
        path,
        setupRequest: (req) => {
          const b = o.buyers.take();
          req.headers = { 'content-type': 'application/json', authorization: `Bearer ${b.token}` };
          req.body = `{"skuId":"${o.skuId}","quantity":1,"requestId":"${b.requestId}"}`;
          return req;
        },
      },
    ],
  });
  const late = o.buyers.takeSignedLate();
  if (late > 0) log(`warning: ${late} buyer tokens were signed during the run (PRESIGN_PER_SECOND too low)`);
  return toResult(r);
}

export async function getLoad(
  baseUrl: string,
  path: string,
  seconds: number,
  connections: number,
): Promise<LoadResult> {
  const r = await autocannon({
    url: `${baseUrl}${path}`,
    connections,
    pipelining: 1,
    duration: seconds,
    timeout: 30,
  });
  return toResult(r);
}

export function describe(r: LoadResult): string {
  const codes = Object.entries(r.statusCounts)
    .map(([c, n]) => `${c}:${n}`)
    .join(' ');
  return `${Math.round(r.rps)} req/s, p50 ${r.p50Ms} ms, p99 ${r.p99Ms} ms [${codes}]${r.errors ? ` errors ${r.errors}` : ''}`;
}

/**
 * The median of measured runs by server CPU per request (the lower middle one of an even count),
 * with every run's CPU figure: one 10 s run of the same server moved by up to 20 % between runs.
 */
export async function medianByCpu(
  rounds: number,
  run: () => Promise<LoadResult>,
): Promise<LoadResult & { cpuRounds: number[] }> {
  const runs: LoadResult[] = [];
  for (let i = 0; i < rounds; i += 1) runs.push(await run());
  const sorted = [...runs].sort((a, b) => (a.cpu?.api ?? Infinity) - (b.cpu?.api ?? Infinity));
  return { ...sorted[Math.floor((sorted.length - 1) / 2)]!, cpuRounds: runs.map((r) => r.cpu?.api ?? NaN) };
}
