// The invariant checker's pure part: each rule fires on a state that breaks it, and only then.
import { checkInvariants } from '../../faults/harness/invariants.js';
import type { FinalState, OrderFinal, ReservationFinal } from '../../faults/harness/invariants.js';

function rsv(i: number, state: ReservationFinal['state'] = 'RESERVED', quantity = 1): ReservationFinal {
  return { reservationId: `r${i}`, state, userId: `u${i}`, skuId: 'sku', quantity };
}
function order(r: ReservationFinal, status = 'UNPAID'): OrderFinal {
  return { reservationId: r.reservationId, userId: r.userId, skuId: r.skuId, quantity: r.quantity, status };
}

/** 10 units: 3 live reservations with orders, 1 released (its order closed, its unit back), 7 remaining. */
function healthy(): FinalState {
  const live = [rsv(1), rsv(2), rsv(3, 'PAID')];
  const released = rsv(4, 'RELEASED');
  return {
    activityId: 'a',
    skus: [{ skuId: 'sku', initial: 10, remaining: 7, limitPerUser: 1 }],
    counters: { reserved: 4, released: 1, reservations: 4 },
    reservations: [...live, released, { ...rsv(5, 'CANCELLED', 0), skuId: '0-cancelled' }],
    orders: [...live.map((r) => order(r, r.state === 'PAID' ? 'PAID' : 'UNPAID')), order(released, 'CLOSED')],
    createdEvents: new Map([
      ['r1', 1],
      ['r2', 1],
      ['r3', 1],
      ['r4', 1],
    ]),
    halfMessages: 0,
    unconfirmed: 0,
  };
}

const rules = (s: FinalState): string[] => checkInvariants(s).map((v) => v.rule);

describe('checkInvariants', () => {
  test('a consistent final state has no violation', () => {
    expect(checkInvariants(healthy())).toEqual([]);
    expect(
      checkInvariants({ ...healthy(), reported: { initial: 10, remaining: 7, released: 1, ordered: 3 } }),
    ).toEqual([]);
  });

  test('oversell: stock not conserved, or negative', () => {
    const s = healthy();
    s.skus[0]!.remaining = 8;
    expect(rules(s)).toContain('stock-conservation');
    const n = healthy();
    n.skus[0]!.remaining = -1;
    n.skus[0]!.initial = 3;
    expect(rules(n)).toEqual(expect.arrayContaining(['negative-stock', 'stock-conservation']));
  });

  test('stock returned twice shows as counters out of step', () => {
    const s = healthy();
    s.counters.released = 2;
    expect(rules(s)).toEqual(['counters']);
  });

  test('a duplicate order: two rows or two creation events for one reservation', () => {
    const s = healthy();
    s.orders.push(order(s.reservations[0]!));
    expect(rules(s)).toContain('duplicate-order');
    const e = healthy();
    e.createdEvents.set('r2', 2);
    expect(rules(e)).toEqual(['duplicate-order']);
  });

  test('a lost journal row: an order with zero creation events (the row must commit with its order)', () => {
    const s = healthy();
    s.createdEvents.delete('r2');
    expect(rules(s)).toEqual(['missing-journal']);
    const closed = healthy();
    closed.createdEvents.delete('r4');
    expect(rules(closed)).toEqual(['missing-journal']);
  });

  test('a lost order: a live reservation with no live order', () => {
    const s = healthy();
    s.orders = s.orders.filter((o) => o.reservationId !== 'r2');
    expect(rules(s)).toEqual(['missing-order']);
    const c = healthy();
    c.orders = c.orders.map((o) => (o.reservationId === 'r1' ? { ...o, status: 'CLOSED' } : o));
    expect(rules(c)).toEqual(['missing-order']);
  });

  test('an order without a reservation, or differing from it', () => {
    const s = healthy();
    s.orders.push({ reservationId: 'ghost', userId: 'x', skuId: 'sku', quantity: 1, status: 'UNPAID' });
    s.createdEvents.set('ghost', 1);
    expect(rules(s)).toEqual(['phantom-order']);
    const d = healthy();
    d.orders[0] = { ...d.orders[0]!, quantity: 2 };
    expect(rules(d)).toEqual(['phantom-order', 'buyer-limit']);
  });

  test('a released or cancelled reservation whose order is still live', () => {
    const s = healthy();
    s.orders = s.orders.map((o) => (o.reservationId === 'r4' ? { ...o, status: 'UNPAID' } : o));
    expect(rules(s)).toEqual(['released-but-live']);
  });

  test('a buyer above the limit', () => {
    const s = healthy();
    const extra: ReservationFinal = { ...rsv(6), userId: 'u1' };
    s.reservations.push(extra);
    s.orders.push(order(extra));
    s.skus[0]!.remaining = 6;
    s.counters = { reserved: 5, released: 1, reservations: 5 };
    s.createdEvents.set('r6', 1);
    expect(rules(s)).toEqual(['buyer-limit', 'buyer-limit']);
  });

  test('half messages and order gap after recovery', () => {
    expect(rules({ ...healthy(), halfMessages: 2 })).toEqual(['half-messages']);
    expect(rules({ ...healthy(), unconfirmed: 1 })).toEqual(['order-gap']);
  });

  test('reported counters that disagree', () => {
    expect(rules({ ...healthy(), reported: { remaining: 6, ordered: 3 } })).toEqual(['reported-counters']);
  });
});
