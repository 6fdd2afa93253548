// The order state machine's shape and the order-gap repair's insertability rule (the consumer's message schema).
import { ORDER_TRANSITIONS, PAID_STATUSES } from '../../../core/db/orders-store.js';
import { isValidOrderMessage } from '../../../core/order-message.js';
import type { OrderMessage } from '../../../core/order-message.js';

describe('order state machine', () => {
  it('UNPAID -> PAID | CLOSED; PAID -> REFUNDING -> REFUNDED; nothing leaves CLOSED or REFUNDED', () => {
    const edges = Object.values(ORDER_TRANSITIONS).map((t) => `${t.from}->${t.to}`);
    expect(edges.sort()).toEqual(
      ['PAID->REFUNDING', 'REFUNDING->REFUNDED', 'UNPAID->CLOSED', 'UNPAID->PAID'].sort(),
    );
    const sources = new Set(Object.values(ORDER_TRANSITIONS).map((t) => t.from as string));
    expect(sources.has('CLOSED')).toBe(false);
    expect(sources.has('REFUNDED')).toBe(false);
    expect([...PAID_STATUSES].sort()).toEqual(['PAID', 'REFUNDED', 'REFUNDING']);
  });
});

describe('order-gap repair: insertable ledger entries', () => {
  const good: OrderMessage = {
    reservationId: 'r1',
    activityId: 'a',
    userId: 'u',
    skuId: 's',
    quantity: 1,
    slot: 1,
    unitPrice: '19.90',
    itemName: 'item',
    reservedAt: 1_700_000_000_000,
    traceId: 't',
    requestId: 'q',
  };
  it('accepts a complete entry and refuses broken ones', () => {
    expect(isValidOrderMessage(good)).toBe(true);
    for (const bad of [
      { quantity: 0 },
      { slot: 0 },
      { unitPrice: '' },
      { unitPrice: '1.999' },
      { itemName: '' },
      { userId: '' },
      { reservedAt: 0 },
    ]) {
      expect([bad, isValidOrderMessage({ ...good, ...bad })]).toEqual([bad, false]);
    }
  });
});
