import { SoldOutFlags } from '../../../runtime/api/sold-out.js';

describe('sold-out flags', () => {
  test('answer without Redis until the recheck interval or a restock', () => {
    const flags = new SoldOutFlags(1000);
    expect(flags.isSoldOut('a', 's', 0)).toBe(false);
    flags.markSoldOut('a', 's', 0);
    expect(flags.isSoldOut('a', 's', 999)).toBe(true);
    expect(flags.isSoldOut('a', 'other', 999)).toBe(false);
    expect(flags.isSoldOut('b', 's', 999)).toBe(false);
    expect(flags.isSoldOut('a', 's', 1000)).toBe(false);
    flags.markSoldOut('a', 's', 2000);
    flags.restocked('a', 's');
    expect(flags.isSoldOut('a', 's', 2001)).toBe(false);
  });
});
