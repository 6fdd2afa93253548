// The simulated payment provider (docs/after-sale.md, docs/demo.md "Payments"): signed payment
// notifications sent to the after-sale role, and the provider's refund endpoint (a local stand-in
// that refunds each refund id once, like a real provider) that the role's refund worker calls.
import type { Pool } from '../../core/db/pool.js';
import { sendPaymentNotification, startFakeProvider } from '../../dev/fake-provider.js';
import type { FakeProvider } from '../../dev/fake-provider.js';
import type { Knobs } from './knobs.js';

const PAY_SECRET = 'demo-payment-provider-secret-0123456789';
const PAY_APP = 'demo-app';
const PAY_MERCHANT = 'demo-merchant';

/** The refund endpoint, signing with the demo's provider secret. */
export function startRefundProvider(): Promise<FakeProvider> {
  return startFakeProvider({ secret: PAY_SECRET });
}

/** The after-sale role's environment to accept the demo provider's notifications and refund through it. */
export function providerEnv(provider: FakeProvider): Record<string, string> {
  return {
    PAYMENT_HMAC_SECRET: PAY_SECRET,
    PAYMENT_HMAC_APP_ID: PAY_APP,
    PAYMENT_HMAC_MERCHANT_ID: PAY_MERCHANT,
    PAYMENT_HMAC_REFUND_URL: provider.refundUrl,
    REFUND_WORKER_CRON: '* * * * * *',
  };
}

export interface PaymentTally {
  /** notification outcome -> count. */
  outcomes: Map<string, number>;
  /** The order paid in time whose notification is held back until the timeout closed it. */
  late: { orderId: string; paidAt: Date; outcome?: string } | undefined;
  /** The order paid twice (two trade numbers). */
  duplicate: { orderId: string; outcome?: string } | undefined;
  seen: Set<string>;
  paidNotified: number;
}

export function newPaymentTally(): PaymentTally {
  return { outcomes: new Map(), late: undefined, duplicate: undefined, seen: new Set(), paidNotified: 0 };
}

async function notifyPayment(
  url: string,
  orderId: string,
  tradeNo: string,
  amount: string,
  paidAt: Date,
): Promise<string> {
  const payment = { appId: PAY_APP, merchantId: PAY_MERCHANT, orderId, tradeNo, amount, paidAt };
  for (let attempt = 1; ; attempt += 1) {
    const r = await sendPaymentNotification(url, PAY_SECRET, payment);
    // Like a provider: retry what was not acknowledged (5xx), a bounded number of times.
    if (r.status < 500 || attempt >= 5) return String(r.json.outcome ?? r.json.code ?? `http ${r.status}`);
    await new Promise((res) => setTimeout(res, 300 * attempt));
  }
}

/**
 * One round of the simulated payment provider: new UNPAID orders are paid (a share of them, at
 * once) except the first, whose payment is made now but notified only once the timeout closed
 * its order and the stock was written back (late but in time); the first paid order is paid a
 * second time with another trade number (a duplicate trade).
 */
export async function payRound(
  pg: Pool,
  url: string,
  activityId: string,
  k: Knobs,
  p: PaymentTally,
  random: () => number,
  phase: string | undefined,
): Promise<void> {
  const count = (outcome: string): void => void p.outcomes.set(outcome, (p.outcomes.get(outcome) ?? 0) + 1);
  const fresh = await pg.query<{ id: string; amount: string }>(
    `SELECT id, amount::text AS amount FROM orders WHERE activity_id = $1 AND status = 'UNPAID' ORDER BY id`,
    [activityId],
  );
  for (const o of fresh.rows) {
    if (p.seen.has(o.id)) continue;
    p.seen.add(o.id);
    if (!p.late) {
      p.late = { orderId: o.id, paidAt: new Date() };
      continue;
    }
    if (random() * 100 >= k.paypercent) continue;
    count(await notifyPayment(url, o.id, `T-${o.id}`, o.amount, new Date()));
    p.paidNotified += 1;
    if (!p.duplicate) {
      p.duplicate = { orderId: o.id };
      p.duplicate.outcome = await notifyPayment(url, o.id, `T-${o.id}-again`, o.amount, new Date());
      count(p.duplicate.outcome);
    }
  }
  const late = p.late;
  if (late && !late.outcome && (phase === 'Settling' || phase === 'Completed')) {
    const row = await pg.query<{ status: string; amount: string }>(
      `SELECT status, amount::text AS amount FROM orders WHERE id = $1`,
      [late.orderId],
    );
    if (row.rows[0]?.status === 'CLOSED') {
      late.outcome = await notifyPayment(
        url,
        late.orderId,
        `T-${late.orderId}-late`,
        row.rows[0].amount,
        late.paidAt,
      );
      count(late.outcome);
    }
  }
}
