// Which payments count as made in time (docs/after-sale.md "Late payment"): by the payment time
// the provider states, against the order's deadline plus the tolerance; no payment time, no.
import type { LifecycleOrderRow } from '../../../core/db/orders-store.js';
import { paidInTime } from '../../../runtime/payments/apply.js';
import type { PaymentNotice } from '../../../core/payment-provider.js';

const deadline = new Date('2026-11-11T00:15:00Z');
const order = { expiresAt: deadline } as LifecycleOrderRow;
const notice = (paidAt?: Date): PaymentNotice => ({
  orderId: '1',
  tradeNo: 'T',
  amount: '1.00',
  status: 'success',
  providerStatus: 'TRADE_SUCCESS',
  fields: {},
  ...(paidAt ? { paidAt } : {}),
});
const at = (seconds: number): Date => new Date(deadline.getTime() + seconds * 1000);

describe('paidInTime', () => {
  it.each([
    [-60, 0, true],
    [0, 0, true],
    [1, 0, false],
    [299, 300, true],
    [300, 300, true],
    [301, 300, false],
  ])('paid %ss after the deadline with %ss tolerance: %s', (offset, tolerance, expected) => {
    expect(paidInTime(order, notice(at(offset)), tolerance)).toBe(expected);
  });

  it('is never in time without a payment time', () => {
    expect(paidInTime(order, notice(), 3600)).toBe(false);
  });
});
