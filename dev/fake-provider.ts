// A fake payment provider's refund API: a real HTTP server on loopback that speaks the built-in
// HMAC provider's refund protocol (docs/after-sale.md "Refunds") the way a real provider does:
// it checks our signature, deduplicates by the refund request id (out_refund_no: the same id
// again answers the same refund and moves no money), refuses a second refund of one trade, and
// signs its answers. On demand it fails (5xx), hangs (never answers), or answers "processing" and
// leaves the outcome to a refund notification that the test sends.
import { createHmac, timingSafeEqual } from 'node:crypto';
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { signNotification } from '../runtime/payments/hmac-provider.js';

/** `refuse-garbled`: a refusal whose message holds a NUL and half a surrogate pair (a gateway's bytes). */
export type FakeMode = 'ok' | 'fail' | 'hang' | 'processing' | 'refuse' | 'refuse-garbled';

export interface ExecutedRefund {
  refundId: string;
  tradeNo: string;
  orderId: string;
  amount: string;
  refundNo: string;
}

export interface FakeProvider {
  url: string;
  /** The refund endpoint to configure as PAYMENT_HMAC_REFUND_URL. */
  refundUrl: string;
  mode: FakeMode;
  /** Calls received per refund request id (every attempt, whatever the answer). */
  calls: Map<string, number>;
  /** Money actually returned: one entry per refund performed. */
  executed: Map<string, ExecutedRefund>;
  /** Requests refused because the signature did not verify. */
  badSignatures: number;
  close(): Promise<void>;
}

function verify(secret: string, header: string | undefined, body: Buffer): boolean {
  const m = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(header ?? '');
  if (!m) return false;
  const expected = Buffer.from(createHmac('sha256', secret).update(`${m[1]}.`).update(body).digest('hex'));
  return timingSafeEqual(expected, Buffer.from(m[2]!));
}

export async function startFakeProvider(opts: { secret: string }): Promise<FakeProvider> {
  const sockets = new Set<Socket>();
  let refundSeq = 0;
  const state: Omit<FakeProvider, 'url' | 'refundUrl' | 'close'> = {
    mode: 'ok',
    calls: new Map(),
    executed: new Map(),
    badSignatures: 0,
  };
  const answer = (res: ServerResponse, status: number, body: Record<string, unknown>): void => {
    const text = JSON.stringify(body);
    res.writeHead(status, {
      'content-type': 'application/json',
      'x-fs-signature': signNotification(opts.secret, text, Math.floor(Date.now() / 1000)),
    });
    res.end(text);
  };
  const handle = (req: IncomingMessage, res: ServerResponse, raw: Buffer): void => {
    if (req.method !== 'POST' || req.url !== '/refunds') {
      answer(res, 404, { message: 'not found' });
      return;
    }
    if (!verify(opts.secret, req.headers['x-fs-signature'] as string | undefined, raw)) {
      state.badSignatures += 1;
      answer(res, 401, { out_refund_no: '', refund_status: 'REFUND_FAILED', message: 'bad signature' });
      return;
    }
    const b = JSON.parse(raw.toString('utf8')) as Record<string, string>;
    const id = b.out_refund_no ?? '';
    state.calls.set(id, (state.calls.get(id) ?? 0) + 1);
    if (state.mode === 'hang') return; // the socket stays open until the caller gives up
    if (state.mode === 'fail') {
      answer(res, 503, { out_refund_no: id, refund_status: 'SYSTEM_ERROR', message: 'try later' });
      return;
    }
    if (state.mode === 'refuse' || state.mode === 'refuse-garbled') {
      answer(res, 400, {
        out_refund_no: id,
        refund_status: 'REFUND_FAILED',
        message: state.mode === 'refuse' ? 'trade not refundable' : 'trade \u0000not refundable \ud800',
      });
      return;
    }
    const done = state.executed.get(id);
    if (done) {
      answer(res, 200, { out_refund_no: id, refund_status: 'REFUND_SUCCESS', refund_no: done.refundNo });
      return;
    }
    if ([...state.executed.values()].some((e) => e.tradeNo === b.trade_no)) {
      answer(res, 400, {
        out_refund_no: id,
        refund_status: 'REFUND_FAILED',
        message: 'trade already refunded',
      });
      return;
    }
    if (state.mode === 'processing') {
      answer(res, 200, { out_refund_no: id, refund_status: 'REFUND_PROCESSING' });
      return;
    }
    refundSeq += 1;
    const e: ExecutedRefund = {
      refundId: id,
      tradeNo: b.trade_no ?? '',
      orderId: b.out_trade_no ?? '',
      amount: b.refund_amount ?? '',
      refundNo: `R${refundSeq}`,
    };
    state.executed.set(id, e);
    answer(res, 200, { out_refund_no: id, refund_status: 'REFUND_SUCCESS', refund_no: e.refundNo });
  };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => handle(req, res, Buffer.concat(chunks)));
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const fake = state as FakeProvider;
  fake.url = url;
  fake.refundUrl = `${url}/refunds`;
  fake.close = async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return fake;
}

/** The body of a refund notification as the provider sends it. */
export function refundNotificationBody(n: {
  refundId: string;
  orderId: string;
  tradeNo: string;
  amount: string;
  status?: string;
  appId: string;
  merchantId: string;
  refundNo?: string;
}): string {
  return JSON.stringify({
    app_id: n.appId,
    merchant_id: n.merchantId,
    out_refund_no: n.refundId,
    out_trade_no: n.orderId,
    trade_no: n.tradeNo,
    refund_amount: n.amount,
    refund_status: n.status ?? 'REFUND_SUCCESS',
    ...(n.refundNo ? { refund_no: n.refundNo } : {}),
    gmt_refund: new Date().toISOString(),
  });
}

/** A payment as the HMAC provider notifies it (docs/after-sale.md "Payment notifications"). */
export interface PaymentNotification {
  appId: string;
  merchantId: string;
  orderId: string;
  tradeNo: string;
  amount: string;
  paidAt: Date;
}

/** POSTs one signed TRADE_SUCCESS notification to the after-sale role at `baseUrl`, once. */
export async function sendPaymentNotification(
  baseUrl: string,
  secret: string,
  n: PaymentNotification,
): Promise<{ status: number; json: Record<string, unknown> }> {
  const body = JSON.stringify({
    app_id: n.appId,
    merchant_id: n.merchantId,
    out_trade_no: n.orderId,
    trade_no: n.tradeNo,
    total_amount: n.amount,
    trade_status: 'TRADE_SUCCESS',
    gmt_payment: n.paidAt.toISOString(),
  });
  const r = await fetch(`${baseUrl}/v1/payments/hmac/notifications`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-fs-signature': signNotification(secret, body, Math.floor(Date.now() / 1000)),
    },
    body,
  });
  return { status: r.status, json: (await r.json().catch(() => ({}))) as Record<string, unknown> };
}
