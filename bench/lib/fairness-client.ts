/**
 * The fairness benchmark's HTTP client, shared by the main thread (honest buyers) and the flood
 * worker (bots and the address farm): pre-signed HS256 tokens, one POST per click, an open-loop
 * schedule. Times are absolute milliseconds (performance.timeOrigin + now()), comparable across
 * threads.
 */
import { createHmac } from 'node:crypto';
import { Agent, request } from 'undici';

export type Who = 'honest' | 'bot' | 'farm';

export interface Sent {
  who: Who;
  account: string;
  /** 0 when the request failed without an answer (see `error`). */
  status: number;
  code: string;
  replayed: boolean;
  error: string;
  ms: number;
  /** When the request left and when its answer came (absolute ms). */
  sentAt: number;
  answeredAt: number;
}

const b64url = (s: string): string => Buffer.from(s).toString('base64url');
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
export const nowMs = (): number => performance.timeOrigin + performance.now();

export function tokenSigner(secret: string): (sub: string) => string {
  const header = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  // The api requires `iat` (its maximum token age counts from it) as well as `sub` and `exp`.
  const iat = Math.floor(Date.now() / 1000);
  const exp = iat + 3600;
  return (sub) => {
    const input = `${header}.${b64url(JSON.stringify({ sub, iat, exp }))}`;
    return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`;
  };
}

export class Client {
  readonly sent: Sent[] = [];
  lateSends = 0;
  private readonly agent: Agent;

  constructor(
    private readonly url: string,
    connections: number,
  ) {
    this.agent = new Agent({ connections, pipelining: 1, keepAliveTimeout: 30_000 });
  }

  /** Waits until the absolute instant `ms`; counts sends more than 100 ms late. */
  async at(ms: number): Promise<void> {
    const wait = ms - nowMs();
    if (wait > 0) await sleep(wait);
    else if (wait < -100) this.lateSends += 1;
  }

  async fire(who: Who, account: string, token: string, address: string, requestId: string): Promise<Sent> {
    const t0 = nowMs();
    let status = 0;
    let code = '';
    let replayed = false;
    let error = '';
    try {
      const r = await request(this.url, {
        method: 'POST',
        dispatcher: this.agent,
        headers: {
          'content-type': 'application/json',
          authorization: `Bearer ${token}`,
          'x-forwarded-for': address,
        },
        body: `{"skuId":"drop","quantity":1,"requestId":"${requestId}"}`,
        headersTimeout: 60_000,
        bodyTimeout: 60_000,
      });
      status = r.statusCode;
      const body = (await r.body.json()) as { code?: string; replayed?: boolean };
      code = body.code ?? '';
      replayed = body.replayed === true;
    } catch (err) {
      error = (err as { code?: string }).code ?? (err as Error).name;
    }
    const t1 = nowMs();
    const s: Sent = { who, account, status, code, replayed, error, ms: t1 - t0, sentAt: t0, answeredAt: t1 };
    this.sent.push(s);
    return s;
  }

  close(): Promise<void> {
    return this.agent.close();
  }
}
