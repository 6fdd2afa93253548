// The consumer's check of an order message against the activity's item from PostgreSQL
// (core/order-refusal.ts, used by the consumer and by order-gap repair): the message is never trusted.
import type { ActivityItem } from '../../../core/db/activity-items-store.js';
import type { OrderMessage } from '../../../core/model.js';
import { orderMessage } from '../../fixtures/order-message.js';
import { reservationIdFor } from '../../../core/reservations.js';
import { refusalOf } from '../../../core/order-refusal.js';

const item: ActivityItem = {
  skuId: 'duck',
  name: '北京烤鸭',
  price: '198.00',
  limitPerUser: 2,
  generation: 1,
};

function message(over: Partial<OrderMessage> = {}): OrderMessage {
  return orderMessage('a1', 'alice', { requestId: 'r1', reservedAt: 1, traceId: 't', ...over });
}

describe('order message check', () => {
  test('a message that fits the item passes; equal prices may be written differently', () => {
    expect(refusalOf(message(), item)).toBeUndefined();
    expect(refusalOf(message({ unitPrice: '198' }), item)).toBeUndefined();
    expect(refusalOf(message({ unitPrice: '198.0', quantity: 2, slot: 2 }), item)).toBeUndefined();
  });

  test.each<[string, Partial<OrderMessage>, string]>([
    ['a lower price', { unitPrice: '0.01' }, 'price'],
    ['a higher price', { unitPrice: '198.01' }, 'price'],
    ['a quantity above the limit per buyer', { quantity: 1_000_000 }, 'quantity'],
    ['a slot above the limit per buyer', { slot: 3 }, 'slot'],
    ['a zero slot', { slot: 0 }, 'slot'],
    ['a reservation id not derived from its buyer and requestId', { userId: 'mallory' }, 'reservation_id'],
    [
      'another buyer’s reservation id',
      { reservationId: reservationIdFor('a1', 'bob', 'r1') },
      'reservation_id',
    ],
  ])('%s is refused', (_what, over, reason) => {
    expect(refusalOf(message(over), item)?.[0]).toBe(reason);
  });

  test('an item the activity does not have is refused', () => {
    expect(refusalOf(message({ skuId: 'caviar' }), undefined)?.[0]).toBe('unknown_sku');
  });
});
