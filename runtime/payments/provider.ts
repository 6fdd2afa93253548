/**
 * The payment provider adapter interface. A provider authenticates its notifications (signature,
 * merchant/app id) and turns them into a PaymentNotice; everything after that (the order lock,
 * the payment row, the state machine) is provider-independent (apply.ts).
 */
import type { IncomingHttpHeaders } from 'node:http';

export interface PaymentNotice {
  /** Our order id (the provider's out_trade_no). */
  orderId: string;
  /** The provider's transaction number: unique per provider, the payment's identity. */
  tradeNo: string;
  /** Amount paid, a normalised decimal string with two decimals ("19.90"); never a float. */
  amount: string;
  /** 'success' when money was received (TRADE_SUCCESS / TRADE_FINISHED), else 'other'. */
  status: 'success' | 'other';
  /** The provider's own status word, for logs and the payment row. */
  providerStatus: string;
  /**
   * When the buyer paid, as the provider states it (or, failing that, when it signed the
   * notification). Decides a payment for an order the timeout already closed (docs/after-sale.md).
   */
  paidAt?: Date;
  /** The verified notification fields, stored with the payment row. */
  fields: Record<string, unknown>;
}

export interface NotificationRequest {
  /** The body exactly as received: signatures are computed over bytes, not over parsed JSON. */
  rawBody: Buffer;
  headers: IncomingHttpHeaders;
  now: Date;
}

export interface Acknowledgement {
  contentType: string;
  body: string;
}

export interface PaymentProvider {
  /** Appears in the URL (/v1/payments/<name>/notifications) and in payments.provider. */
  readonly name: string;
  /**
   * Authenticates and parses a notification. Throws FlashSaleError: BAD_SIGNATURE (401) for a
   * missing/invalid/expired signature, MERCHANT_MISMATCH (403), VALIDATION_ERROR (400).
   * Nothing may be written before this returns.
   */
  verify(req: NotificationRequest): PaymentNotice;
  /** The 2xx body telling the provider to stop retrying (the outcome is durable). */
  acknowledge(outcome: string): Acknowledgement;
}
