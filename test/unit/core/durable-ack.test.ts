// The acknowledgement a role decides on its first use (core/durable-ack.ts AckDecidedOnFirstUse):
// decided once, and decided again after a decision that failed (Redis unreachable at that moment),
// so a role starts without Redis and still settles with the configured durability later.
import { AckDecidedOnFirstUse } from '../../../core/durable-ack.js';
import type { ReservationAck } from '../../../core/durable-ack.js';

describe('AckDecidedOnFirstUse', () => {
  it('decides once, retries a failed decision, and forwards every confirmation', async () => {
    const confirmed: string[] = [];
    const decided: ReservationAck = {
      confirm: async (activityId, reservationId, replayed) => {
        confirmed.push(`${activityId}/${reservationId}/${String(replayed)}`);
      },
      answeredOn: () => 'the connection',
    };
    let decisions = 0;
    const ack = new AckDecidedOnFirstUse(async () => {
      decisions += 1;
      if (decisions === 1) throw new Error('redis unreachable');
      return decided;
    });
    await expect(ack.confirm('a1', 'r1', true)).rejects.toThrow('redis unreachable');
    await Promise.all([ack.confirm('a1', 'r2', true), ack.confirm('a1', 'r3', false)]);
    await ack.confirm('a2', 'r4', true);
    expect(decisions).toBe(2);
    // Where a write was answered is known only once decided: before, a token no connection is.
    expect(ack.answeredOn('a1')).toBe('the connection');
    expect(confirmed).toEqual(['a1/r2/true', 'a1/r3/false', 'a2/r4/true']);
  });

  it('decides on ready(), so that writes answered afterwards are judged by where they were answered', async () => {
    const decided: ReservationAck = {
      confirm: async () => undefined,
      answeredOn: () => 'the connection',
    };
    const ack = new AckDecidedOnFirstUse(async () => decided);
    expect(ack.answeredOn('a1')).not.toBe('the connection');
    await ack.ready();
    expect(ack.answeredOn('a1')).toBe('the connection');
  });

  it('passes a NOT_REPLICATED of the decided acknowledgement through', async () => {
    const ack = new AckDecidedOnFirstUse(async () => ({
      confirm: async () => {
        throw Object.assign(new Error('not replicated'), { code: 'NOT_REPLICATED' });
      },
      answeredOn: () => undefined,
    }));
    await expect(ack.confirm('a1', 'r1', true)).rejects.toMatchObject({ code: 'NOT_REPLICATED' });
  });
});
