// The built-in HMAC-SHA256 payment provider: signature over the raw bytes with a timestamp,
// rotation, tolerance, merchant/app id, and amounts as decimals (never floats).
import { FlashSaleError } from '../../../core/errors.js';
import { HmacProvider, SIGNATURE_HEADER, signNotification } from '../../../runtime/payments/hmac-provider.js';

const SECRET = 'a-shared-secret-of-at-least-thirty-two-chars';
const OLD = 'the-previous-secret-still-valid-during-rotation';
const provider = new HmacProvider({
  name: 'hmac',
  secrets: [SECRET, OLD],
  appId: 'app-1',
  merchantId: 'm-1',
  toleranceSeconds: 300,
});
const now = new Date('2026-11-11T00:00:00Z');
const t = Math.floor(now.getTime() / 1000);

function body(over: Record<string, unknown> = {}): string {
  return JSON.stringify({
    app_id: 'app-1',
    merchant_id: 'm-1',
    out_trade_no: '42',
    trade_no: 'T-1',
    total_amount: '19.90',
    trade_status: 'TRADE_SUCCESS',
    ...over,
  });
}

function verify(raw: string, signature: string | undefined) {
  return provider.verify({
    rawBody: Buffer.from(raw),
    headers: signature === undefined ? {} : { [SIGNATURE_HEADER]: signature },
    now,
  });
}

function code(fn: () => unknown): string | undefined {
  try {
    fn();
    return undefined;
  } catch (err) {
    return err instanceof FlashSaleError ? err.code : 'OTHER';
  }
}

describe('HmacProvider', () => {
  it('accepts a correctly signed notification and normalises the amount to two decimals', () => {
    const raw = body({ total_amount: '19.9' });
    const n = verify(raw, signNotification(SECRET, raw, t));
    expect(n).toMatchObject({ orderId: '42', tradeNo: 'T-1', amount: '19.90', status: 'success' });
  });

  it('accepts the previous secret during a rotation', () => {
    const raw = body();
    expect(verify(raw, signNotification(OLD, raw, t)).tradeNo).toBe('T-1');
  });

  it('refuses missing, malformed, wrong and stale signatures, and tampered bytes', () => {
    const raw = body();
    expect(code(() => verify(raw, undefined))).toBe('BAD_SIGNATURE');
    expect(code(() => verify(raw, 'v1=abc'))).toBe('BAD_SIGNATURE');
    expect(code(() => verify(raw, signNotification('x'.repeat(40), raw, t)))).toBe('BAD_SIGNATURE');
    expect(code(() => verify(`${raw} `, signNotification(SECRET, raw, t)))).toBe('BAD_SIGNATURE');
    expect(code(() => verify(raw, signNotification(SECRET, raw, t - 301)))).toBe('BAD_SIGNATURE');
    expect(code(() => verify(raw, signNotification(SECRET, raw, t + 301)))).toBe('BAD_SIGNATURE');
    // Same body, signature for another timestamp than the one in the header.
    const sig = signNotification(SECRET, raw, t).replace(`t=${t}`, `t=${t - 1}`);
    expect(code(() => verify(raw, sig))).toBe('BAD_SIGNATURE');
  });

  it('refuses another merchant or app after checking the signature', () => {
    for (const over of [{ app_id: 'app-2' }, { merchant_id: 'm-2' }]) {
      const raw = body(over);
      expect(code(() => verify(raw, signNotification(SECRET, raw, t)))).toBe('MERCHANT_MISMATCH');
    }
  });

  it('refuses amounts that are floats, negative, zero or have more than two decimals', () => {
    for (const amount of [19.9, '-1.00', '0', '0.00', '1.001', '1e3', ' 1.00', '01.00']) {
      const raw = body({ total_amount: amount });
      expect([amount, code(() => verify(raw, signNotification(SECRET, raw, t)))]).toEqual([
        amount,
        'VALIDATION_ERROR',
      ]);
    }
  });

  it('reports other trade statuses as not-success (acknowledged, not applied)', () => {
    const raw = body({ trade_status: 'WAIT_BUYER_PAY' });
    expect(verify(raw, signNotification(SECRET, raw, t)).status).toBe('other');
    const finished = body({ trade_status: 'TRADE_FINISHED' });
    expect(verify(finished, signNotification(SECRET, finished, t)).status).toBe('success');
  });

  it('takes the payment time from gmt_payment, else from the signature; refuses a malformed or future one', () => {
    const paid = body({ gmt_payment: '2026-11-10T23:50:00+00:00' });
    expect(verify(paid, signNotification(SECRET, paid, t)).paidAt?.toISOString()).toBe(
      '2026-11-10T23:50:00.000Z',
    );
    const raw = body();
    expect(verify(raw, signNotification(SECRET, raw, t)).paidAt?.getTime()).toBe(t * 1000);
    const malformed = body({ gmt_payment: 'yesterday' });
    expect(code(() => verify(malformed, signNotification(SECRET, malformed, t)))).toBe('VALIDATION_ERROR');
    const future = body({ gmt_payment: new Date((t + 301) * 1000).toISOString() });
    expect(code(() => verify(future, signNotification(SECRET, future, t)))).toBe('VALIDATION_ERROR');
    const skewed = body({ gmt_payment: new Date((t + 299) * 1000).toISOString() });
    expect(code(() => verify(skewed, signNotification(SECRET, skewed, t)))).toBeUndefined();
  });

  it('refuses an order id that cannot be a PostgreSQL bigint (19 digits)', () => {
    const big = body({ out_trade_no: '9999999999999999999' });
    expect(code(() => verify(big, signNotification(SECRET, big, t)))).toBe('VALIDATION_ERROR');
    const ok = body({ out_trade_no: '999999999999999999' });
    expect(verify(ok, signNotification(SECRET, ok, t)).orderId).toBe('999999999999999999');
  });

  it('acknowledges with a JSON success body', () => {
    expect(provider.acknowledge('PAID')).toEqual({
      contentType: 'application/json',
      body: '{"result":"success","outcome":"PAID"}',
    });
  });
});

describe('HmacProvider refund notifications', () => {
  const refundId = `rf-${'ab'.repeat(16)}`;
  const refundBody = (over: Record<string, unknown> = {}): string =>
    JSON.stringify({
      app_id: 'app-1',
      merchant_id: 'm-1',
      out_refund_no: refundId,
      out_trade_no: '42',
      trade_no: 'T-1',
      refund_amount: '19.9',
      refund_status: 'REFUND_SUCCESS',
      refund_no: 'R-9',
      ...over,
    });
  const verifyRefund = (raw: string, signature: string | undefined) =>
    provider.verifyRefund({
      rawBody: Buffer.from(raw),
      headers: signature === undefined ? {} : { [SIGNATURE_HEADER]: signature },
      now,
    });

  it('accepts a signed refund notification (also with the previous secret) and maps the status', () => {
    const raw = refundBody();
    expect(verifyRefund(raw, signNotification(SECRET, raw, t))).toEqual({
      refundId,
      orderId: '42',
      tradeNo: 'T-1',
      amount: '19.90',
      status: 'success',
      providerStatus: 'REFUND_SUCCESS',
      providerRefundNo: 'R-9',
    });
    expect(verifyRefund(raw, signNotification(OLD, raw, t)).status).toBe('success');
    for (const [status, mapped] of [
      ['REFUND_FAILED', 'failed'],
      ['REFUND_CLOSED', 'failed'],
      ['REFUND_PROCESSING', 'other'],
    ]) {
      const r = refundBody({ refund_status: status });
      expect(verifyRefund(r, signNotification(SECRET, r, t)).status).toBe(mapped);
    }
  });

  it('refuses unsigned, stale, foreign and malformed refund notifications with stable codes', () => {
    const raw = refundBody();
    expect(code(() => verifyRefund(raw, undefined))).toBe('BAD_SIGNATURE');
    expect(code(() => verifyRefund(raw, signNotification(SECRET, raw, t - 301)))).toBe('BAD_SIGNATURE');
    expect(code(() => verifyRefund(raw, signNotification('x'.repeat(40), raw, t)))).toBe('BAD_SIGNATURE');
    const foreign = refundBody({ merchant_id: 'm-2' });
    expect(code(() => verifyRefund(foreign, signNotification(SECRET, foreign, t)))).toBe('MERCHANT_MISMATCH');
    for (const over of [
      { refund_amount: 19.9 },
      { refund_amount: '0' },
      { refund_amount: '1.001' },
      { out_refund_no: 'rf-1' },
      { out_trade_no: 'x' },
      { refund_status: '' },
    ]) {
      const bad = refundBody(over);
      expect([over, code(() => verifyRefund(bad, signNotification(SECRET, bad, t)))]).toEqual([
        over,
        'VALIDATION_ERROR',
      ]);
    }
  });
});
