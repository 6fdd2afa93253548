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

export interface PaymentProvider extends RefundProvider {
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

// ---------------------------------------------------------------------------------------------
// Refunds (docs/after-sale.md "Refunds"). The provider deduplicates by `refundId`: a request sent
// again with the same id (after a timeout, a 5xx, or our SIGKILL before we recorded the answer)
// refunds once and answers with the refund's current state.
// ---------------------------------------------------------------------------------------------

export interface RefundRequest {
  /** Our refund request id (out_refund_no): fixed in PostgreSQL before the first call. */
  refundId: string;
  /** Our order id (out_trade_no) and the provider's transaction being refunded. */
  orderId: string;
  tradeNo: string;
  /** The whole payment, a decimal string with two decimals. */
  amount: string;
  reason: string;
}

/**
 * The provider's answer to a refund call. A transport failure, a timeout, a 5xx or an answer
 * that cannot be authenticated is thrown instead (the worker retries with the same id).
 */
export type RefundAnswer =
  | { status: 'succeeded'; providerStatus: string; providerRefundNo: string | null }
  /** Accepted, money not moved yet: a refund notification (or the next call) tells the outcome. */
  | { status: 'processing'; providerStatus: string }
  /** Refused for good (unknown trade, amount exceeded, ...): a human must look. */
  | { status: 'rejected'; providerStatus: string; error: string };

export interface RefundNotice {
  refundId: string;
  orderId: string;
  tradeNo: string;
  /** Normalised decimal string with two decimals. */
  amount: string;
  /** success: money returned; failed: the refund will not happen; other: informational. */
  status: 'success' | 'failed' | 'other';
  providerStatus: string;
  providerRefundNo: string | null;
}

export interface RefundProvider {
  readonly name: string;
  /** Asks the provider to refund; see RefundAnswer for what is thrown and what is answered. */
  refund(req: RefundRequest): Promise<RefundAnswer>;
  /**
   * Authenticates and parses a refund notification, like `verify` for payments: throws
   * BAD_SIGNATURE (401), MERCHANT_MISMATCH (403) or VALIDATION_ERROR (400) before anything is written.
   */
  verifyRefund(req: NotificationRequest): RefundNotice;
  acknowledge(outcome: string): Acknowledgement;
}
