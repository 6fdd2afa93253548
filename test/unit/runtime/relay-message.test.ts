// How the relay turns one outbox entry into a Kafka message (runtime/relay/relay.ts kafkaMessageOf):
// from the entry's own fields, and by parsing the message only for entries of the earlier format;
// and how it puts a read's entries into batch messages per partition (kafkaMessagesOf).
import {
  ORDER_BATCH_HEADER,
  ORDER_BATCH_MAX_BYTES,
  ORDER_BATCH_MAX_ORDERS,
  orderTextsOf,
} from '../../../core/order-message.js';
import { kafkaMessageOf, kafkaMessagesOf } from '../../../runtime/relay/relay.js';

describe('kafkaMessageOf', () => {
  it('takes the key and headers from the entry fields and leaves the value untouched', () => {
    // The value is not even JSON: nothing reads it.
    const fields = ['rid', 'r-1', 'm', 'not json {', 'key', 'buyer-7', 'trace', 'trace-7'];
    expect(kafkaMessageOf(fields)).toEqual({
      key: 'buyer-7',
      value: 'not json {',
      headers: { 'trace-id': 'trace-7', 'reservation-id': 'r-1' },
    });
  });

  it('finds the fields by name, whatever a value holds', () => {
    // A buyer named like a field name must not shift the lookup.
    const fields = ['rid', 'r-2', 'm', '{}', 'key', 'm', 'trace', 'key'];
    expect(kafkaMessageOf(fields)).toEqual({
      key: 'm',
      value: '{}',
      headers: { 'trace-id': 'key', 'reservation-id': 'r-2' },
    });
  });

  it('parses an entry of the earlier format (rid and m only) for its key and trace id', () => {
    const value = JSON.stringify({ reservationId: 'r-3', userId: 'buyer-3', traceId: 'trace-3' });
    expect(kafkaMessageOf(['rid', 'r-3', 'm', value])).toEqual({
      key: 'buyer-3',
      value,
      headers: { 'trace-id': 'trace-3', 'reservation-id': 'r-3' },
    });
  });

  it('forwards an unparseable entry of the earlier format as it is (the consumer sends it to the DLQ)', () => {
    expect(kafkaMessageOf(['rid', 'r-4', 'm', 'garbage'])).toEqual({
      key: null,
      value: 'garbage',
      headers: { 'trace-id': '', 'reservation-id': 'r-4' },
    });
  });
});

describe('kafkaMessagesOf', () => {
  const entry = (buyer: string, value = `{"userId":"${buyer}"}`): string[] => [
    'rid',
    `r-${buyer}`,
    'm',
    value,
    'key',
    buyer,
    'trace',
    `t-${buyer}`,
  ];
  // Buyers a*, b*, c* go to partitions 0, 1, 2.
  const partitionOf = (key: string): number => ({ a: 0, b: 1, c: 2 })[key[0] as 'a' | 'b' | 'c'];

  it('sends one message per entry, exactly as kafkaMessageOf, with one order per message', () => {
    const entries = [entry('a1'), entry('a2'), entry('b1')];
    expect(kafkaMessagesOf(entries, 1, partitionOf)).toEqual(entries.map((e) => kafkaMessageOf(e)));
  });

  it("puts each partition's entries, in read order, into batches of at most the given size", () => {
    const entries = ['a1', 'b1', 'a2', 'a3', 'c1', 'a4', 'b2'].map((b) => entry(b));
    const messages = kafkaMessagesOf(entries, 3, partitionOf);
    const batches = messages.map((m) => ({
      partition: m.partition,
      key: m.key,
      orders: m.headers?.[ORDER_BATCH_HEADER],
      texts: orderTextsOf(String(m.value), m.headers?.[ORDER_BATCH_HEADER] as string | undefined),
    }));
    expect(batches).toEqual([
      {
        partition: 0,
        key: null,
        orders: '3',
        texts: ['{"userId":"a1"}', '{"userId":"a2"}', '{"userId":"a3"}'],
      },
      // A lone entry of a partition is a message of one order: its key and headers as before.
      { partition: 0, key: 'a4', orders: undefined, texts: ['{"userId":"a4"}'] },
      { partition: 1, key: null, orders: '2', texts: ['{"userId":"b1"}', '{"userId":"b2"}'] },
      { partition: 2, key: 'c1', orders: undefined, texts: ['{"userId":"c1"}'] },
    ]);
    expect(messages.find((m) => m.key === 'c1')?.headers).toEqual({
      'trace-id': 't-c1',
      'reservation-id': 'r-c1',
    });
    // Every entry is in exactly one message.
    expect(batches.flatMap((b) => b.texts)).toHaveLength(entries.length);
  });

  it('closes a batch before it would exceed ORDER_BATCH_MAX_BYTES (counted in UTF-8 bytes)', () => {
    // Three-byte characters: 100,000 of them are 300,000 bytes, so a second such entry never fits.
    const big = (buyer: string): string[] => entry(buyer, '鸭'.repeat(100_000));
    const messages = kafkaMessagesOf([big('a1'), big('a2'), big('a3')], 500, partitionOf);
    expect(messages.map((m) => m.headers?.[ORDER_BATCH_HEADER] ?? '1')).toEqual(['1', '1', '1']);
    expect(Buffer.byteLength(String(messages[0]!.value))).toBeLessThanOrEqual(ORDER_BATCH_MAX_BYTES);
    const small = kafkaMessagesOf(
      [entry('a1', '鸭'.repeat(80_000)), entry('a2', '鸭'.repeat(80_000)), entry('a3', '鸭'.repeat(80_000))],
      500,
      partitionOf,
    );
    // 240,001 bytes each with the newline: two fit in 512 KiB, the third starts a new message.
    expect(small.map((m) => m.headers?.[ORDER_BATCH_HEADER] ?? '1')).toEqual(['2', '1']);
  });

  it('sends a value holding a raw newline alone and whole (never split into lines of a batch)', () => {
    const odd = entry('a2', 'not\njson');
    const messages = kafkaMessagesOf([entry('a1'), odd, entry('a3')], 500, partitionOf);
    expect(messages).toContainEqual(kafkaMessageOf(odd));
    const batch = messages.find((m) => m.headers?.[ORDER_BATCH_HEADER] !== undefined);
    expect(batch?.value).toBe('{"userId":"a1"}\n{"userId":"a3"}');
    expect(messages).toHaveLength(2);
  });
});

describe('orderTextsOf (the consumer reading a batch message)', () => {
  it('takes a message without the header as one order, and a batch as its lines', () => {
    expect(orderTextsOf('{"a":1}', undefined)).toEqual(['{"a":1}']);
    expect(orderTextsOf('{"a":1}\n{"b":2}', '2')).toEqual(['{"a":1}', '{"b":2}']);
  });

  it('refuses, whole, a batch whose header is not a count its value holds', () => {
    expect(orderTextsOf('{"a":1}\n{"b":2}', '3')).toBeUndefined();
    expect(orderTextsOf('{"a":1}\n{"b":2}', '1')).toBeUndefined();
    expect(orderTextsOf('\n'.repeat(1999), '5')).toBeUndefined();
    expect(
      orderTextsOf('\n'.repeat(ORDER_BATCH_MAX_ORDERS), String(ORDER_BATCH_MAX_ORDERS + 1)),
    ).toBeUndefined();
    for (const header of ['', '0', '-1', '1.5', 'many'])
      expect(orderTextsOf('{"a":1}', header)).toBeUndefined();
  });
});
