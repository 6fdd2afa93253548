import { buyerSkuKey } from '../../../core/db/orders-store.js';
import { BUYER_LIMIT_EXCEEDED, decideGuard, OVERSELL_PREVENTED } from '../../../core/stock-guard.js';
import type { GuardCandidate, GuardSku } from '../../../core/stock-guard.js';

const c = (
  orderId: string,
  userId: string,
  quantity: number,
  reservedAt: number,
  skuId = 'a',
): GuardCandidate => ({
  orderId,
  reservationId: `r${orderId}`,
  userId,
  skuId,
  quantity,
  slot: 1,
  reservedAt,
});

describe('decideGuard (the PostgreSQL stock and buyer-limit guard)', () => {
  it('closes nothing while sold stays within stock and every buyer within the limit', () => {
    const skus = new Map<string, GuardSku>([['a', { stock: 3, sold: 3, limitPerUser: 1 }]]);
    const cands = [c('1', 'u1', 1, 10), c('2', 'u2', 1, 11), c('3', 'u3', 1, 12)];
    const held = new Map(cands.map((x) => [buyerSkuKey(x.userId, x.skuId), 1]));
    expect(decideGuard(cands, skus, held).size).toBe(0);
  });

  it('closes the newest orders of the batch beyond the stock, in units', () => {
    // stock 3, sold 5 with this batch's three orders (1 + 2 + 2 units): 2 units too many.
    const skus = new Map<string, GuardSku>([['a', { stock: 3, sold: 5, limitPerUser: 5 }]]);
    const cands = [c('1', 'u1', 1, 10), c('2', 'u2', 2, 30), c('3', 'u3', 2, 20)];
    const held = new Map(cands.map((x) => [buyerSkuKey(x.userId, x.skuId), x.quantity]));
    expect([...decideGuard(cands, skus, held)]).toEqual([['2', OVERSELL_PREVENTED]]);
  });

  it('closes every new order when earlier transactions already sold the stock', () => {
    const skus = new Map<string, GuardSku>([['a', { stock: 2, sold: 4, limitPerUser: 1 }]]);
    const cands = [c('1', 'u1', 1, 10), c('2', 'u2', 1, 11)];
    const held = new Map(cands.map((x) => [buyerSkuKey(x.userId, x.skuId), 1]));
    expect(decideGuard(cands, skus, held)).toEqual(
      new Map([
        ['1', OVERSELL_PREVENTED],
        ['2', OVERSELL_PREVENTED],
      ]),
    );
  });

  it('weighs a reservation that came twice in the batch once: the older order over the limit is closed too', () => {
    // limit 3: u1 holds 3 units in an order Redis forgot, plus this batch's ra and rb (rb twice).
    const skus = new Map<string, GuardSku>([['a', { stock: 10, sold: 5, limitPerUser: 3 }]]);
    const ra = c('a', 'u1', 1, 10);
    const rb = c('b', 'u1', 1, 20);
    const held = new Map([[buyerSkuKey('u1', 'a'), 5]]);
    expect(decideGuard([ra, rb, { ...rb }], skus, held)).toEqual(
      new Map([
        ['b', BUYER_LIMIT_EXCEEDED],
        ['a', BUYER_LIMIT_EXCEEDED],
      ]),
    );
    expect(decideGuard([ra, rb, { ...rb }], skus, held)).toEqual(decideGuard([ra, rb], skus, held));
  });

  it('limits a buyer by quantity, not by slot count, and the closes free stock for others', () => {
    // limit 2: u1 holds 2 units from an earlier order plus this batch's 2 (one per slot).
    const skus = new Map<string, GuardSku>([['a', { stock: 5, sold: 6, limitPerUser: 2 }]]);
    const cands = [c('1', 'u1', 2, 10), c('2', 'u2', 1, 11), c('3', 'u3', 1, 12)];
    const held = new Map([
      [buyerSkuKey('u1', 'a'), 4],
      [buyerSkuKey('u2', 'a'), 1],
      [buyerSkuKey('u3', 'a'), 1],
    ]);
    // Closing u1's 2 units brings sold to 4 <= 5: nobody else is closed.
    expect([...decideGuard(cands, skus, held)]).toEqual([['1', BUYER_LIMIT_EXCEEDED]]);
  });

  it('keeps the oldest of a buyer’s new orders and judges each SKU on its own', () => {
    const skus = new Map<string, GuardSku>([
      ['a', { stock: 10, sold: 3, limitPerUser: 1 }],
      ['b', { stock: 1, sold: 2, limitPerUser: 3 }],
    ]);
    const cands = [
      c('1', 'u1', 1, 10),
      c('2', 'u1', 1, 20),
      c('3', 'u1', 1, 30),
      c('4', 'u2', 1, 5, 'b'),
      c('5', 'u3', 1, 6, 'b'),
    ];
    const held = new Map([
      [buyerSkuKey('u1', 'a'), 3],
      [buyerSkuKey('u2', 'b'), 1],
      [buyerSkuKey('u3', 'b'), 1],
    ]);
    expect(decideGuard(cands, skus, held)).toEqual(
      new Map([
        ['3', BUYER_LIMIT_EXCEEDED],
        ['2', BUYER_LIMIT_EXCEEDED],
        ['5', OVERSELL_PREVENTED],
      ]),
    );
  });

  it('closes an order in a slot above the limit (Redis never assigns one), whatever the sums say', () => {
    const skus = new Map<string, GuardSku>([['a', { stock: 10, sold: 2, limitPerUser: 1 }]]);
    const forged = { ...c('2', 'u1', 1, 20), slot: 2 };
    const cands = [c('1', 'u2', 1, 10), forged];
    expect([...decideGuard(cands, skus, new Map())]).toEqual([['2', BUYER_LIMIT_EXCEEDED]]);
  });
});
