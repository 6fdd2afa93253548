/**
 * The built-in provider: JSON notifications signed with HMAC-SHA256 over a shared secret.
 *
 *   X-Fs-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
 *
 * The body is JSON: app_id, merchant_id, out_trade_no (our order id), trade_no, total_amount
 * (a decimal STRING, e.g. "19.90"), trade_status (TRADE_SUCCESS | TRADE_FINISHED | anything else
 * is acknowledged and ignored), optionally gmt_payment (when the buyer paid, ISO 8601 with an
 * offset; the signature's t when absent), plus optional fields kept with the payment row.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { Decimal } from 'decimal.js';
import { z } from 'zod';
import { FlashSaleError } from '../../core/errors.js';
import type { Acknowledgement, NotificationRequest, PaymentNotice, PaymentProvider } from './provider.js';

export const SIGNATURE_HEADER = 'x-fs-signature';

export interface HmacProviderConfig {
  name: string;
  /** Current secret first; the previous one (during a rotation) second. */
  secrets: string[];
  appId: string;
  merchantId: string;
  /** Largest accepted |now - t| in seconds; 0 disables the check. */
  toleranceSeconds: number;
}

/** How a provider (or a test) signs a notification body. */
export function signNotification(secret: string, rawBody: string | Buffer, timestampSeconds: number): string {
  const mac = createHmac('sha256', secret).update(`${timestampSeconds}.`).update(rawBody).digest('hex');
  return `t=${timestampSeconds},v1=${mac}`;
}

const AMOUNT = /^(0|[1-9]\d{0,13})(\.\d{1,2})?$/;

const notification = z
  .object({
    app_id: z.string().min(1).max(64),
    merchant_id: z.string().min(1).max(64),
    // At most 18 digits: every order id fits PostgreSQL's bigint (a 19-digit one may not).
    out_trade_no: z.string().regex(/^[1-9]\d{0,17}$/, 'our order id'),
    trade_no: z.string().regex(/^[A-Za-z0-9._:-]{1,128}$/, '1-128 characters of [A-Za-z0-9._:-]'),
    total_amount: z
      .string()
      .regex(AMOUNT, 'a decimal string with at most 2 decimals')
      .refine((v) => AMOUNT.test(v) && new Decimal(v).gt(0), 'must be positive'),
    trade_status: z.string().min(1).max(32),
    /** When the buyer paid (ISO 8601 with an offset); the signature's t when absent. */
    gmt_payment: z.string().datetime({ offset: true }).optional(),
  })
  .passthrough();

function parseHeader(value: string | string[] | undefined): { t: number; v1: string[] } | undefined {
  if (typeof value !== 'string' || value.length > 1024) return undefined;
  let t: number | undefined;
  const v1: string[] = [];
  for (const part of value.split(',')) {
    const [k, v] = part.trim().split('=', 2);
    if (k === 't' && v && /^\d{1,12}$/.test(v)) t = Number(v);
    else if (k === 'v1' && v && /^[0-9a-f]{64}$/.test(v)) v1.push(v);
  }
  return t === undefined || v1.length === 0 ? undefined : { t, v1 };
}

export class HmacProvider implements PaymentProvider {
  readonly name: string;

  constructor(private readonly cfg: HmacProviderConfig) {
    if (cfg.secrets.length === 0) throw new Error('the HMAC provider needs a secret');
    this.name = cfg.name;
  }

  verify(req: NotificationRequest): PaymentNotice {
    const sig = parseHeader(req.headers[SIGNATURE_HEADER]);
    if (!sig) throw new FlashSaleError('BAD_SIGNATURE', `missing or malformed ${SIGNATURE_HEADER} header`);
    const valid = this.cfg.secrets.some((secret) => {
      const expected = Buffer.from(
        createHmac('sha256', secret).update(`${sig.t}.`).update(req.rawBody).digest('hex'),
      );
      return sig.v1.some((v) => timingSafeEqual(expected, Buffer.from(v)));
    });
    if (!valid) throw new FlashSaleError('BAD_SIGNATURE');
    if (
      this.cfg.toleranceSeconds > 0 &&
      Math.abs(req.now.getTime() / 1000 - sig.t) > this.cfg.toleranceSeconds
    ) {
      throw new FlashSaleError('BAD_SIGNATURE', 'the signature timestamp is outside the tolerance');
    }
    let raw: unknown;
    try {
      raw = JSON.parse(req.rawBody.toString('utf8'));
    } catch {
      throw new FlashSaleError('VALIDATION_ERROR', 'the notification is not JSON');
    }
    const r = notification.safeParse(raw);
    if (!r.success) {
      throw new FlashSaleError('VALIDATION_ERROR', 'the notification is not valid', {
        errors: r.error.issues.map((i) => ({ path: i.path.join('.'), message: i.message })),
      });
    }
    const n = r.data;
    if (n.app_id !== this.cfg.appId || n.merchant_id !== this.cfg.merchantId) {
      throw new FlashSaleError('MERCHANT_MISMATCH');
    }
    const paidAt = n.gmt_payment ? new Date(n.gmt_payment) : new Date(sig.t * 1000);
    // A payment time after the signature (beyond the clock skew allowed) is not a payment time.
    if (paidAt.getTime() > (sig.t + this.cfg.toleranceSeconds) * 1000) {
      throw new FlashSaleError('VALIDATION_ERROR', 'gmt_payment is after the notification was signed', {
        errors: [{ path: 'gmt_payment', message: 'after the signature timestamp' }],
      });
    }
    return {
      orderId: n.out_trade_no,
      tradeNo: n.trade_no,
      amount: new Decimal(n.total_amount).toFixed(2),
      status: n.trade_status === 'TRADE_SUCCESS' || n.trade_status === 'TRADE_FINISHED' ? 'success' : 'other',
      providerStatus: n.trade_status,
      paidAt,
      fields: n as Record<string, unknown>,
    };
  }

  acknowledge(outcome: string): Acknowledgement {
    return { contentType: 'application/json', body: JSON.stringify({ result: 'success', outcome }) };
  }
}
