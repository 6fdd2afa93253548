import type { LoadedDefinition } from '../../../core/loaded-definition.js';
import type { ActivityDefinition } from '../../../core/model.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { catalogProblems } from '../../../operator/reconcile/resolve-items.js';
import {
  CHANGES_LISTED,
  diffDefinition,
  listChanges,
  normalizePrice,
  phaseOfGate,
} from '../../../operator/reconcile/definition.js';

const start = Date.parse('2030-01-01T10:00:00Z');
const end = Date.parse('2030-01-01T11:00:00Z');

const loaded: LoadedDefinition = {
  gate: 'pending',
  generation: 1,
  loads: 1,
  startMs: start,
  endMs: end,
  requireOrderCode: false,
  reopenOnRelease: true,
  items: [
    { skuId: 'a', name: '苹果', price: '5.00', stock: 10, limitPerUser: 1 },
    { skuId: 'b', name: '香蕉', price: '3.50', stock: 20, limitPerUser: 2 },
  ],
};

const desired = (over: Partial<ActivityDefinition> = {}): ActivityDefinition => ({
  id: 'x',
  generation: 2,
  startAt: new Date(start),
  endAt: new Date(end),
  requireOrderCode: false,
  reopenOnRelease: true,
  items: loaded.items.map((i) => ({ ...i })),
  ...over,
});
const withItem = (skuId: string, over: Record<string, unknown>): ActivityDefinition =>
  desired({ items: loaded.items.map((i) => (i.skuId === skuId ? { ...i, ...over } : { ...i })) });

describe('diffDefinition', () => {
  it('finds nothing when nothing changed (price formats compare as decimals)', () => {
    expect(diffDefinition(loaded, desired(), Phase.Active)).toEqual({ changes: [], unsafe: [] });
    expect(diffDefinition(loaded, withItem('b', { price: '3.5' }), Phase.Active)).toEqual({
      changes: [],
      unsafe: [],
    });
  });

  it.each([
    ['extended endAt', desired({ endAt: new Date(end + 60_000) })],
    ['more stock', withItem('a', { stock: 15 })],
    [
      'a new item',
      desired({
        items: [...loaded.items, { skuId: 'c', name: '橙子', price: '4.00', stock: 5, limitPerUser: 1 }],
      }),
    ],
  ])('applies %s while Active', (_what, next) => {
    const d = diffDefinition(loaded, next, Phase.Active);
    expect(d.changes).toHaveLength(1);
    expect(d.unsafe).toEqual([]);
  });

  it.each([
    ['a moved start', desired({ startAt: new Date(start + 1) }), /startAt/],
    ['a shortened end', desired({ endAt: new Date(end - 1) }), /endAt .*\(shortened\)/],
    ['a price change', withItem('a', { price: '4.99' }), /sku a: price 5\.00 -> 4\.99/],
    ['a name change', withItem('a', { name: '青苹果' }), /sku a: name changed/],
    ['a limit change', withItem('b', { limitPerUser: 3 }), /sku b: limitPerUser 2 -> 3/],
    ['order codes switched on', desired({ requireOrderCode: true }), /requireOrderCode false -> true/],
    ['release policy changed', desired({ reopenOnRelease: false }), /reopenOnRelease true -> false/],
  ])('refuses %s while Active but allows it before the sale', (_what, next, message) => {
    const active = diffDefinition(loaded, next, Phase.Active);
    expect(active.unsafe).toEqual([expect.stringMatching(message)]);
    const ready = diffDefinition(loaded, next, Phase.Ready);
    expect(ready.changes).toEqual([expect.stringMatching(message)]);
    expect(ready.unsafe).toEqual([]);
  });

  it.each([Phase.WarmingUp, Phase.Ready, Phase.Active])(
    'always refuses lower stock or a removed item (%s)',
    (phase) => {
      expect(diffDefinition(loaded, withItem('a', { stock: 9 }), phase).unsafe).toEqual([
        'sku a: stock 10 -> 9 (stock can only grow)',
      ]);
      expect(diffDefinition(loaded, desired({ items: [loaded.items[0]!] }), phase).unsafe).toEqual([
        'sku b removed (items cannot be removed once loaded)',
      ]);
    },
  );

  it('refuses every change once the sale has ended', () => {
    for (const phase of [Phase.Draining, Phase.WritingBack, Phase.CleaningUp, Phase.Completed]) {
      expect(diffDefinition(loaded, withItem('a', { stock: 11 }), phase).unsafe).toHaveLength(1);
    }
  });

  it('lists every unsafe difference, not just the first', () => {
    const next = desired({
      startAt: new Date(start + 1),
      items: [{ ...loaded.items[0]!, price: '1.00', stock: 1 }],
    });
    expect(diffDefinition(loaded, next, Phase.Active).unsafe).toHaveLength(4);
  });
});

describe('phaseOfGate', () => {
  it('judges an edit by the gate when a step changed it and its phase is not recorded yet', () => {
    // Opened under Ready: a price edit the CRD admitted for Ready is a live-sale edit.
    expect(phaseOfGate(Phase.Ready, 'open')).toBe(Phase.Active);
    expect(phaseOfGate(Phase.Ready, 'paused')).toBe(Phase.Active);
    expect(
      diffDefinition(loaded, withItem('a', { price: '4.00' }), phaseOfGate(Phase.Ready, 'open')).unsafe,
    ).toEqual(['sku a: price 5.00 -> 4.00']);
    // Closed under Ready or Active: the sale has ended, an endAt extension cannot reopen it.
    expect(phaseOfGate(Phase.Active, 'closed')).toBe(Phase.Draining);
    expect(phaseOfGate(Phase.Ready, 'closed')).toBe(Phase.Draining);
    expect(
      diffDefinition(loaded, desired({ endAt: new Date(end + 60_000) }), phaseOfGate(Phase.Active, 'closed'))
        .unsafe,
    ).toHaveLength(1);
  });

  it('keeps the recorded phase when the gate agrees with it', () => {
    expect(phaseOfGate(Phase.Ready, 'pending')).toBe(Phase.Ready);
    expect(phaseOfGate(Phase.Active, 'open')).toBe(Phase.Active);
    expect(phaseOfGate(Phase.Active, 'paused')).toBe(Phase.Active);
    expect(phaseOfGate(Phase.WarmingUp, 'pending')).toBe(Phase.WarmingUp);
    expect(phaseOfGate(Phase.Draining, 'closed')).toBe(Phase.Draining);
    expect(phaseOfGate(Phase.WritingBack, 'frozen')).toBe(Phase.WritingBack);
    expect(
      diffDefinition(loaded, withItem('a', { price: '4.00' }), phaseOfGate(Phase.Ready, 'pending')).unsafe,
    ).toEqual([]);
  });
});

describe('normalizePrice', () => {
  it.each([
    ['1999', '1999.00'],
    ['1999.5', '1999.50'],
    ['0', '0.00'],
    ['0.1', '0.10'],
    ['999999999999.99', '999999999999.99'],
  ])('%s -> %s', (input, output) => {
    expect(normalizePrice(input)).toBe(output);
  });
});

describe('listChanges', () => {
  it('names at most CHANGES_LISTED differences, then how many more, so a large catalog cannot overflow a condition', () => {
    const repriced = Array.from({ length: 5000 }, (_, i) => `sku sku-${i}: price 1.00 -> 2.00`);
    const message = listChanges(repriced);
    expect(message.split('; ')).toHaveLength(CHANGES_LISTED + 1);
    expect(message).toMatch(/; \.\.\. and 4980 more difference\(s\)$/);
    expect(message.length).toBeLessThan(2000);
    expect(listChanges(repriced.slice(0, 2))).toBe(repriced.slice(0, 2).join('; '));
  });
});

describe('catalogProblems', () => {
  const item = { skuId: 'tea', name: '茶', price: '5.00', stock: 3, limitPerUser: 1 };
  it('finds none in rows the CRD would admit inline', () => {
    expect(catalogProblems([item, { ...item, skuId: 'A.b_c-9', name: 'x'.repeat(200) }])).toEqual([]);
    // 200 characters as the CRD counts them, though 400 UTF-16 units.
    expect(catalogProblems([{ ...item, name: '😀'.repeat(200) }])).toEqual([]);
  });
  it('names each row the CRD would refuse: an unsafe sku id, an empty or too long name', () => {
    expect(
      catalogProblems([
        { ...item, skuId: 'a:b*' },
        { ...item, skuId: '' },
        { ...item, name: '' },
        { ...item, skuId: 'long', name: 'x'.repeat(201) },
      ]),
    ).toEqual([
      'sku id "a:b*" does not match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$',
      'sku id "" does not match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$',
      'sku tea: name must be 1 to 200 characters (has 0)',
      'sku long: name must be 1 to 200 characters (has 201)',
    ]);
  });
});
