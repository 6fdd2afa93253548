// How the relay turns one outbox entry into a Kafka message (runtime/relay/relay.ts kafkaMessageOf):
// from the entry's own fields, and by parsing the message only for entries of the earlier format.
import { kafkaMessageOf } from '../../../runtime/relay/relay.js';

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
