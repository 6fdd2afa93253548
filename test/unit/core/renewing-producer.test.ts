// core/kafka.ts RenewingProducer: after a failed send the producer is let go and the next send
// connects a fresh one (a new producer id), as the relay does; a failed connect is tried again.
import type { Producer, ProducerRecord } from 'kafkajs';
import { RenewingProducer } from '../../../core/kafka.js';

interface FakeProducer {
  id: number;
  connects: number;
  disconnects: number;
  sends: number;
}

function fakes(failSendsOf: Set<number>, failConnectsOf = new Set<number>()) {
  const made: FakeProducer[] = [];
  const create = (): Producer => {
    const f: FakeProducer = { id: made.length, connects: 0, disconnects: 0, sends: 0 };
    made.push(f);
    return {
      connect: async () => {
        f.connects += 1;
        if (failConnectsOf.has(f.id)) throw new Error('broker away');
      },
      disconnect: async () => {
        f.disconnects += 1;
      },
      send: async () => {
        f.sends += 1;
        if (failSendsOf.has(f.id)) throw new Error('UNKNOWN_PRODUCER_ID');
        return [];
      },
    } as unknown as Producer;
  };
  return { made, create };
}

const record: ProducerRecord = { topic: 't', messages: [{ value: 'x' }] };

describe('RenewingProducer', () => {
  it('sends with one producer while its sends succeed; a failed send makes the next one on a fresh producer', async () => {
    const { made, create } = fakes(new Set([0]));
    const p = new RenewingProducer(create);
    await p.connect();
    await expect(p.send(record)).rejects.toThrow('UNKNOWN_PRODUCER_ID');
    await p.send(record);
    await p.send(record);
    expect(made.map((f) => [f.connects, f.sends, f.disconnects])).toEqual([
      [1, 1, 1],
      [1, 2, 0],
    ]);
    await p.disconnect();
    expect(made[1]!.disconnects).toBe(1);
  });

  it('tries a failed connect again at the next send', async () => {
    const { made, create } = fakes(new Set(), new Set([0]));
    const p = new RenewingProducer(create);
    await expect(p.connect()).rejects.toThrow('broker away');
    await p.send(record);
    expect(made.map((f) => f.sends)).toEqual([0, 1]);
  });
});
