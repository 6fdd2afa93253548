// core/kafka.ts onePartitionPerRequest: every send reaches kafkajs as one send per partition (so a
// leader change mid-send cannot drop a partition's messages, see the function's comment), with
// the partition the key's hash picks; a failed partition fails the whole send, only after every
// partition's send has settled, and makes the next send read the partition metadata again; the
// metadata is also read again once it is KAFKA_METADATA_MAX_AGE_MS old (partitions added mid-sale);
// a leader answers a send it holds for its replicas before the client's request timeout.
import { jest } from '@jest/globals';
import type { Kafka, PartitionMetadata, Producer, ProducerRecord } from 'kafkajs';
import { Partitioners } from 'kafkajs';
import {
  KAFKA_METADATA_MAX_AGE_MS,
  KAFKA_PRODUCE_ACK_TIMEOUT_MS,
  KAFKA_REQUEST_TIMEOUT_MS,
  PARTITION_REQUEST_MAX_BYTES,
  onePartitionPerRequest,
  requestsOf,
} from '../../../core/kafka.js';

function fakes(partitions = 3, failPartition?: number) {
  const sends: ProducerRecord[] = [];
  /** The partitions kafkajs' own metadata has: it sends nothing to the others, and resolves. */
  let producerKnows = Infinity;
  let metadataReads = 0;
  let settled = 0;
  let metadataFails = false;
  /** Metadata reads from now on are never answered (the broker they went to stalls). */
  let metadataHangs = false;
  const events: string[] = [];
  const partitionsOf = (n: number): PartitionMetadata[] =>
    Array.from({ length: n }, (_, i) => ({
      partitionErrorCode: 0,
      partitionId: i,
      leader: i + 1,
      replicas: [i + 1],
      isr: [i + 1],
      offlineReplicas: [],
    }));
  let meta = partitionsOf(partitions);
  const producer = {
    send: async (r: ProducerRecord) => {
      sends.push(r);
      await new Promise((resolve) => setImmediate(resolve));
      settled += 1;
      const p = r.messages[0]!.partition!;
      if (p === failPartition) throw new Error(`partition ${p} failed`);
      if (p >= producerKnows) return [];
      return [{ topicName: r.topic, partition: p, errorCode: 0 }];
    },
    connect: async () => {
      events.push('producer connect');
      await new Promise((resolve) => setImmediate(resolve));
      events.push('producer connected');
    },
    disconnect: async () => undefined,
  } as unknown as Producer;
  const kafka = {
    admin: () => ({
      connect: async () => {
        events.push('admin connect');
        await new Promise((resolve) => setImmediate(resolve));
        events.push('admin connected');
      },
      disconnect: async () => undefined,
      fetchTopicMetadata: async () => {
        metadataReads += 1;
        if (metadataHangs) await new Promise(() => undefined);
        if (metadataFails) throw new Error('no broker answers');
        return { topics: [{ name: 't', partitions: meta }] };
      },
    }),
  } as unknown as Kafka;
  return {
    sends,
    producer,
    kafka,
    reads: () => metadataReads,
    settled: () => settled,
    setPartitions: (n: number) => {
      meta = partitionsOf(n);
    },
    failMetadata: (fails: boolean) => {
      metadataFails = fails;
    },
    hangMetadata: () => {
      metadataHangs = true;
    },
    events,
    producerKnows: (n: number) => {
      producerKnows = n;
    },
  };
}

const messages = Array.from({ length: 30 }, (_, i) => ({ key: `buyer-${i}`, value: `m${i}` }));

describe('onePartitionPerRequest', () => {
  it('sends each partition its messages in a request of their own, as the default partitioner places them', async () => {
    const f = fakes(3);
    const p = onePartitionPerRequest(f.producer, f.kafka);
    const out = await p.send({ topic: 't', acks: -1, messages });
    const placeRef = Partitioners.DefaultPartitioner();
    const meta = [0, 1, 2].map((i) => ({ partitionId: i, leader: i + 1 }) as PartitionMetadata);
    const expected = new Map<number, string[]>();
    for (const m of messages) {
      const part = placeRef({ topic: 't', partitionMetadata: meta, message: m });
      expected.set(part, [...(expected.get(part) ?? []), m.value]);
    }
    expect(f.sends).toHaveLength(expected.size);
    for (const s of f.sends) {
      const parts = new Set(s.messages.map((m) => m.partition));
      expect(parts.size).toBe(1);
      expect(s.acks).toBe(-1);
      expect(s.messages.map((m) => m.value)).toEqual(expected.get([...parts][0]!));
    }
    expect(out).toHaveLength(expected.size);
    // The metadata is read once per topic.
    await p.send({ topic: 't', messages: messages.slice(0, 3) });
    expect(f.reads()).toBe(1);
  });

  it('sends a partition more than one request takes in several, in their order', async () => {
    const f = fakes(1);
    const p = onePartitionPerRequest(f.producer, f.kafka);
    // 2,000 messages of 640 bytes: about 1.4 MB for the one partition, refused by Kafka in one request.
    const big = Array.from({ length: 2000 }, (_, i) => ({ key: `buyer-${i}`, value: 'x'.repeat(640) + i }));
    const out = await p.send({ topic: 't', messages: big });
    expect(f.sends.length).toBeGreaterThanOrEqual(3);
    expect(f.sends.flatMap((s) => s.messages.map((m) => m.key))).toEqual(big.map((m) => m.key));
    for (const s of f.sends) {
      const bytes = s.messages.reduce((n, m) => n + Buffer.byteLength(m.value as string) + 20, 0);
      expect(bytes).toBeLessThanOrEqual(PARTITION_REQUEST_MAX_BYTES);
    }
    expect(out).toHaveLength(f.sends.length);
  });

  it('splits by bytes of keys, values and headers, a message above the bound going alone', () => {
    const m = (value: string, header = '') => ({ key: 'k', value, headers: header ? { h: header } : {} });
    const half = 'y'.repeat(PARTITION_REQUEST_MAX_BYTES / 2);
    expect(requestsOf([]).length).toBe(0);
    expect(requestsOf([m('a'), m('b')]).map((r) => r.length)).toEqual([2]);
    // Two halves do not fit with their framing; the third message's header tips it too.
    expect(requestsOf([m(half), m(half), m('c', half)]).map((r) => r.length)).toEqual([1, 1, 1]);
    const huge = 'z'.repeat(PARTITION_REQUEST_MAX_BYTES * 2);
    expect(requestsOf([m('a'), m(huge), m('b')]).map((r) => r.length)).toEqual([1, 1, 1]);
    expect(requestsOf([m('a'), m(Buffer.from(huge) as unknown as string)]).map((r) => r.length)).toEqual([
      1, 1,
    ]);
  });

  it('has the leader answer a send it holds for its replicas before the client gives the request up', async () => {
    const f = fakes(3);
    const p = onePartitionPerRequest(f.producer, f.kafka);
    await p.send({ topic: 't', acks: -1, messages });
    // A healthy leader waiting for a stalled follower answers REQUEST_TIMED_OUT, and its connection
    // stays open; kafkajs' 30 s would let the client's own timeout close it first.
    expect(KAFKA_PRODUCE_ACK_TIMEOUT_MS).toBeLessThan(KAFKA_REQUEST_TIMEOUT_MS);
    expect(f.sends.map((s) => s.timeout)).toEqual(f.sends.map(() => KAFKA_PRODUCE_ACK_TIMEOUT_MS));
    // A caller's own timeout is kept.
    await p.send({ topic: 't', acks: -1, timeout: 2_000, messages: messages.slice(0, 1) });
    expect(f.sends.at(-1)?.timeout).toBe(2_000);
  });

  it('fails the send when a partition fails, after all settled, and reads the metadata again next time', async () => {
    const f = fakes(3, 1);
    const p = onePartitionPerRequest(f.producer, f.kafka);
    await expect(p.send({ topic: 't', messages })).rejects.toThrow('partition 1 failed');
    expect(f.settled()).toBe(f.sends.length);
    await expect(p.send({ topic: 't', messages })).rejects.toThrow('partition 1 failed');
    expect(f.reads()).toBe(2);
  });

  it('fails the send when kafkajs sent nothing to a partition its own metadata lacks (added since), never resolving it as sent', async () => {
    const f = fakes(6);
    f.producerKnows(3);
    const p = onePartitionPerRequest(f.producer, f.kafka);
    await expect(p.send({ topic: 't', messages })).rejects.toThrow(
      /sent nothing to partition [345] of t \(not in its metadata yet\)/,
    );
    // Every partition's send settled first; the next send reads the metadata again.
    expect(f.settled()).toBe(f.sends.length);
    f.producerKnows(6);
    await expect(p.send({ topic: 't', messages })).resolves.toHaveLength(6);
    expect(f.reads()).toBe(2);
  });

  /** Lets a read started beside a send answer (the fakes answer within one turn). */
  const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

  it('reads the metadata again once it is KAFKA_METADATA_MAX_AGE_MS old, beside the sends, keeping what it knew when that read fails', async () => {
    const f = fakes(3);
    const p = onePartitionPerRequest(f.producer, f.kafka);
    let now = 1_000_000;
    const clock = jest.spyOn(Date, 'now').mockImplementation(() => now);
    try {
      const partitionsUsed = (): Set<number> =>
        new Set(f.sends.flatMap((r) => r.messages.map((m) => m.partition!)));
      await p.send({ topic: 't', messages });
      expect([...partitionsUsed()].sort()).toEqual([0, 1, 2]);
      // Partitions added to the topic: unused while the metadata is younger than the age ...
      f.setPartitions(6);
      now += KAFKA_METADATA_MAX_AGE_MS - 1;
      f.sends.length = 0;
      await p.send({ topic: 't', messages });
      expect(f.reads()).toBe(1);
      expect(Math.max(...partitionsUsed())).toBeLessThan(3);
      // ... once it is that old, the send goes by what is known and the read starts beside it ...
      now += 1;
      f.sends.length = 0;
      await p.send({ topic: 't', messages });
      expect(f.reads()).toBe(2);
      expect(Math.max(...partitionsUsed())).toBeLessThan(3);
      // ... and the keys spread over all six once it has answered.
      await settle();
      f.sends.length = 0;
      await p.send({ topic: 't', messages });
      expect(f.reads()).toBe(2);
      expect(Math.max(...partitionsUsed())).toBeGreaterThanOrEqual(3);
      // A read that fails keeps the partitions known (the send itself tells whether Kafka answers),
      // and is tried again one age later.
      f.failMetadata(true);
      now += KAFKA_METADATA_MAX_AGE_MS;
      f.sends.length = 0;
      const out = await p.send({ topic: 't', messages });
      expect(out).toHaveLength(6);
      expect(f.reads()).toBe(3);
      await settle();
      await p.send({ topic: 't', messages });
      expect(f.reads()).toBe(3);
      expect(Math.max(...partitionsUsed())).toBeGreaterThanOrEqual(3);
      now += KAFKA_METADATA_MAX_AGE_MS;
      await p.send({ topic: 't', messages });
      expect(f.reads()).toBe(4);
    } finally {
      clock.mockRestore();
    }
  });

  it('a read that is never answered (its broker stalls) holds no send, and only one is made at a time', async () => {
    const f = fakes(3);
    const p = onePartitionPerRequest(f.producer, f.kafka);
    let now = 1_000_000;
    const clock = jest.spyOn(Date, 'now').mockImplementation(() => now);
    try {
      await p.send({ topic: 't', messages });
      f.hangMetadata();
      now += KAFKA_METADATA_MAX_AGE_MS;
      for (let i = 0; i < 3; i += 1) {
        f.sends.length = 0;
        await expect(p.send({ topic: 't', messages })).resolves.toHaveLength(3);
        expect(f.sends).toHaveLength(3);
        await expect(p.partitionerFor('t')).resolves.toBeInstanceOf(Function);
        now += KAFKA_METADATA_MAX_AGE_MS;
      }
      expect(f.reads()).toBe(2);
    } finally {
      clock.mockRestore();
    }
  }, 10_000);

  it('connects the client it reads partitions with together with the producer', async () => {
    const f = fakes(3);
    const p = onePartitionPerRequest(f.producer, f.kafka);
    await p.connect();
    // Both connects begin before either ends: a stalled bootstrap broker is waited out once.
    expect(f.events.slice(0, 2).sort()).toEqual(['admin connect', 'producer connect']);
    expect(f.events).toHaveLength(4);
    await p.send({ topic: 't', messages });
    expect(f.events).toHaveLength(4);
  });
});
