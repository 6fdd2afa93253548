/**
 * The built-in provider: JSON notifications signed with HMAC-SHA256 over a shared secret.
 *
 *   X-Fs-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
 *
 * The body is JSON: app_id, merchant_id, out_trade_no (our order id), trade_no, total_amount
 * (a decimal STRING, e.g. "19.90"), trade_status (TRADE_SUCCESS | TRADE_FINISHED | anything else
 * is acknowledged and ignored), optionally gmt_payment (when the buyer paid, ISO 8601 with an
 * offset; the signature's t when absent), plus optional fields kept with the payment row.
 *
 * Refunds use the same scheme both ways (docs/after-sale.md "Refunds"): we POST a signed JSON
 * request to the provider's refund URL (its answer is signed too and is checked), and the
 * provider POSTs signed refund notifications to /v1/payments/<name>/refund-notifications.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { Decimal } from 'decimal.js';
import { z } from 'zod';
import { FlashSaleError } from '../../core/errors.js';
import type {
  Acknowledgement,
  NotificationRequest,
  PaymentNotice,
  PaymentProvider,
  RefundAnswer,
  RefundNotice,
  RefundRequest,
} from '../../core/payment-provider.js';

export const SIGNATURE_HEADER = 'x-fs-signature';

export interface HmacProviderConfig {
  name: string;
  /** Current secret first; the previous one (during a rotation) second. */
  secrets: string[];
  appId: string;
  merchantId: string;
  /** Largest accepted |now - t| in seconds; 0 disables the check. */
  toleranceSeconds: number;
  /** The provider's refund endpoint; unset = refunds wait (PENDING, alerted) until it is configured. */
  refundUrl?: string | undefined;
  /** A refund call taking longer is abandoned and retried later with the same refund id. */
  refundTimeoutMs?: number;
}

/** How a provider (or a test) signs a notification body. */
export function signNotification(secret: string, rawBody: string | Buffer, timestampSeconds: number): string {
  const mac = createHmac('sha256', secret).update(`${timestampSeconds}.`).update(rawBody).digest('hex');
  return `t=${timestampSeconds},v1=${mac}`;
}

const AMOUNT = /^(0|[1-9]\d{0,13})(\.\d{1,2})?$/;

/** What both notifications carry: who they are for, the provider's trade number, an amount. */
const merchant = { app_id: z.string().min(1).max(64), merchant_id: z.string().min(1).max(64) };
const tradeNo = z.string().regex(/^[A-Za-z0-9._:-]{1,128}$/, '1-128 characters of [A-Za-z0-9._:-]');
const positiveAmount = z
  .string()
  .regex(AMOUNT, 'a decimal string with at most 2 decimals')
  .refine((v) => AMOUNT.test(v) && new Decimal(v).gt(0), 'must be positive');

const notification = z
  .object({
    ...merchant,
    // At most 18 digits: every order id fits PostgreSQL's bigint (a 19-digit one may not).
    out_trade_no: z.string().regex(/^[1-9]\d{0,17}$/, 'our order id'),
    trade_no: tradeNo,
    total_amount: positiveAmount,
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

const refundNotification = z
  .object({
    ...merchant,
    out_refund_no: z.string().regex(/^rf-[0-9a-f]{32}$/, 'our refund id'),
    out_trade_no: z.string().regex(/^[1-9]\d{0,18}$/, 'our order id'),
    trade_no: tradeNo,
    refund_amount: positiveAmount,
    refund_status: z.string().min(1).max(32),
    refund_no: z
      .string()
      .regex(/^[A-Za-z0-9._:-]{1,128}$/)
      .optional(),
  })
  .passthrough();

/** The provider's synchronous answer to a refund call (signed like a notification). */
const refundReply = z
  .object({
    out_refund_no: z.string(),
    refund_status: z.string().min(1).max(32),
    refund_no: z.string().max(128).optional(),
    message: z.string().max(500).optional(),
  })
  .passthrough();

const REFUND_SUCCESS = new Set(['REFUND_SUCCESS']);
const REFUND_FAILED = new Set(['REFUND_FAILED', 'REFUND_CLOSED']);

/** A failure worth retrying with the same refund id (the provider is unreachable or unsure). */
export class TransientRefundError extends Error {
  override name = 'TransientRefundError';
}

export class HmacProvider implements PaymentProvider {
  readonly name: string;

  constructor(private readonly cfg: HmacProviderConfig) {
    if (cfg.secrets.length === 0) throw new Error('the HMAC provider needs a secret');
    this.name = cfg.name;
  }

  /**
   * Signature, then timestamp tolerance, then JSON: nothing is parsed before it is authenticated.
   * Returns the body and the signature's timestamp (unix seconds).
   */
  private authenticate(req: NotificationRequest): { body: unknown; signedAt: number } {
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
    try {
      return { body: JSON.parse(req.rawBody.toString('utf8')) as unknown, signedAt: sig.t };
    } catch {
      throw new FlashSaleError('VALIDATION_ERROR', 'the notification is not JSON');
    }
  }

  /** An authenticated notification parsed by `schema`, sent for this app and merchant. */
  private signedNotice<S extends z.ZodType<{ app_id: string; merchant_id: string }>>(
    req: NotificationRequest,
    schema: S,
    what: string,
  ): { n: z.output<S>; signedAt: number } {
    const { body, signedAt } = this.authenticate(req);
    const r = schema.safeParse(body);
    if (!r.success) {
      throw new FlashSaleError('VALIDATION_ERROR', `the ${what} is not valid`, {
        errors: r.error.issues.map((i) => ({ path: i.path.join('.'), message: i.message })),
      });
    }
    if (r.data.app_id !== this.cfg.appId || r.data.merchant_id !== this.cfg.merchantId) {
      throw new FlashSaleError('MERCHANT_MISMATCH');
    }
    return { n: r.data, signedAt };
  }

  verify(req: NotificationRequest): PaymentNotice {
    const { n, signedAt } = this.signedNotice(req, notification, 'notification');
    const paidAt = n.gmt_payment ? new Date(n.gmt_payment) : new Date(signedAt * 1000);
    // A payment time after the signature (beyond the clock skew allowed) is not a payment time.
    if (paidAt.getTime() > (signedAt + this.cfg.toleranceSeconds) * 1000) {
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

  verifyRefund(req: NotificationRequest): RefundNotice {
    const { n } = this.signedNotice(req, refundNotification, 'refund notification');
    return {
      refundId: n.out_refund_no,
      orderId: n.out_trade_no,
      tradeNo: n.trade_no,
      amount: new Decimal(n.refund_amount).toFixed(2),
      status: REFUND_SUCCESS.has(n.refund_status)
        ? 'success'
        : REFUND_FAILED.has(n.refund_status)
          ? 'failed'
          : 'other',
      providerStatus: n.refund_status,
      providerRefundNo: n.refund_no ?? null,
    };
  }

  /**
   * POSTs the signed refund request. 2xx answers must carry a valid signature over the answer's
   * bytes (an unauthenticated "success" never marks money as returned); 4xx (except 408/429) is
   * a refusal; anything else is thrown as TransientRefundError.
   */
  async refund(req: RefundRequest): Promise<RefundAnswer> {
    if (!this.cfg.refundUrl) {
      throw new TransientRefundError(`no refund URL is configured for provider ${this.name}`);
    }
    const body = JSON.stringify({
      app_id: this.cfg.appId,
      merchant_id: this.cfg.merchantId,
      out_trade_no: req.orderId,
      trade_no: req.tradeNo,
      out_refund_no: req.refundId,
      refund_amount: req.amount,
      refund_reason: req.reason,
    });
    const t = Math.floor(Date.now() / 1000);
    let res: Response;
    let text: string;
    try {
      res = await fetch(this.cfg.refundUrl, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          [SIGNATURE_HEADER]: signNotification(this.cfg.secrets[0]!, body, t),
        },
        body,
        signal: AbortSignal.timeout(this.cfg.refundTimeoutMs ?? 10_000),
      });
      text = await res.text();
    } catch (err) {
      throw new TransientRefundError(`refund call failed: ${(err as Error).message}`);
    }
    if (res.status >= 500 || res.status === 408 || res.status === 429) {
      throw new TransientRefundError(`the provider answered ${res.status}`);
    }
    let parsed: z.infer<typeof refundReply> | undefined;
    try {
      parsed = refundReply.parse(
        this.authenticate({
          rawBody: Buffer.from(text, 'utf8'),
          headers: { [SIGNATURE_HEADER]: res.headers.get(SIGNATURE_HEADER) ?? undefined },
          now: new Date(),
        }).body,
      );
    } catch (err) {
      if (res.status >= 400) {
        return { status: 'rejected', providerStatus: `HTTP_${res.status}`, error: text.slice(0, 500) };
      }
      throw new TransientRefundError(`unauthenticated or malformed refund answer: ${(err as Error).message}`);
    }
    if (parsed.out_refund_no !== req.refundId) {
      throw new TransientRefundError(`the answer names refund ${parsed.out_refund_no}, not ${req.refundId}`);
    }
    if (res.status >= 400 || REFUND_FAILED.has(parsed.refund_status)) {
      return {
        status: 'rejected',
        providerStatus: parsed.refund_status,
        error: parsed.message ?? `HTTP ${res.status}`,
      };
    }
    if (REFUND_SUCCESS.has(parsed.refund_status)) {
      return {
        status: 'succeeded',
        providerStatus: parsed.refund_status,
        providerRefundNo: parsed.refund_no ?? null,
      };
    }
    return { status: 'processing', providerStatus: parsed.refund_status };
  }

  acknowledge(outcome: string): Acknowledgement {
    return { contentType: 'application/json', body: JSON.stringify({ result: 'success', outcome }) };
  }
}

/** The configuration variables of the built-in provider (runtime/config.ts). */
export interface HmacProviderEnv {
  PAYMENT_HMAC_SECRET?: string | undefined;
  PAYMENT_HMAC_SECRET_PREVIOUS?: string | undefined;
  PAYMENT_HMAC_APP_ID?: string | undefined;
  PAYMENT_HMAC_MERCHANT_ID?: string | undefined;
  PAYMENT_HMAC_PROVIDER_NAME: string;
  PAYMENT_SIGNATURE_TOLERANCE_SECONDS: number;
  PAYMENT_HMAC_REFUND_URL?: string | undefined;
  REFUND_PROVIDER_TIMEOUT_MS: number;
}

/** The configured providers: the built-in one when its secret is set, else none. */
export function providersFromEnv(cfg: HmacProviderEnv): HmacProvider[] {
  if (!cfg.PAYMENT_HMAC_SECRET) return [];
  return [
    new HmacProvider({
      name: cfg.PAYMENT_HMAC_PROVIDER_NAME,
      secrets: [cfg.PAYMENT_HMAC_SECRET, cfg.PAYMENT_HMAC_SECRET_PREVIOUS].filter((x): x is string =>
        Boolean(x),
      ),
      appId: cfg.PAYMENT_HMAC_APP_ID ?? '',
      merchantId: cfg.PAYMENT_HMAC_MERCHANT_ID ?? '',
      toleranceSeconds: cfg.PAYMENT_SIGNATURE_TOLERANCE_SECONDS,
      refundUrl: cfg.PAYMENT_HMAC_REFUND_URL,
      refundTimeoutMs: cfg.REFUND_PROVIDER_TIMEOUT_MS,
    }),
  ];
}
