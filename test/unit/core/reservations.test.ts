import { reservationIdFor } from '../../../core/reservations.js';

describe('reservation ids', () => {
  test('are derived from activity, buyer and requestId, so a retry maps to the same id', () => {
    const a = reservationIdFor('act', 'alice', 'r1');
    expect(a).toBe(reservationIdFor('act', 'alice', 'r1'));
    expect(a).toMatch(/^[A-Za-z0-9_-]{22}$/);
    const others = [
      reservationIdFor('act', 'alice', 'r2'),
      reservationIdFor('act', 'bob', 'r1'),
      reservationIdFor('act2', 'alice', 'r1'),
      // The separator keeps ("a", "b\nc") and ("a\nb", "c") apart.
      reservationIdFor('act', 'alice\nr', '1'),
    ];
    expect(new Set([a, ...others]).size).toBe(5);
  });
});
