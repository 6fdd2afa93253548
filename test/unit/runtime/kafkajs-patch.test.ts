// The relay sends through kafkajs 2.2.4 with patches/kafkajs+2.2.4.patch applied (patch-package,
// `npm ci`'s postinstall; the Dockerfile's build stage). Upstream groups a send's messages by
// partition by copying the partition's array for every message, quadratic in a batch's messages
// per partition (tulios/kafkajs#1576, never released), and encodes every record and every header
// into a zero-filled 512-byte buffer of its own, its varints through arrays and Buffers of their
// own. Checked here: the installed files are the patched ones, the grouping is upstream's (every
// message once, in order, on the partition the partitioner names), and every byte the patched
// encoders produce is the byte upstream's produce (upstream: the installed package with the patch
// reversed, bench/lib/patched-packages.ts).
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Partitioners } from 'kafkajs';
import type { Message } from 'kafkajs';
import {
  encodeProduce,
  groupMessagesPerPartition,
  kafkajsLong,
  kafkajsModule,
  partitionMetadata as metadata,
  relayMessages,
} from '../../../bench/lib/patched-packages.js';
import type { ProducePartition } from '../../../bench/lib/patched-packages.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

type Which = 'installed' | 'upstream';

interface EncoderInstance {
  buffer: Buffer;
  writeVarInt(v: number): EncoderInstance;
  writeUVarInt(v: number): EncoderInstance;
  writeVarLong(v: unknown): EncoderInstance;
  writeVarIntString(v: string | null): EncoderInstance;
  writeVarIntBytes(v: unknown): EncoderInstance;
  writeInt32(v: number): EncoderInstance;
}
interface EncoderClass {
  new (initialSize?: number): EncoderInstance;
  sizeOfVarLong(v: unknown): number;
  sizeOfVarInt(v: number): number;
}
const encoderOf = (which: Which): EncoderClass =>
  kafkajsModule<EncoderClass>(which, 'src/protocol/encoder.js');

describe('kafkajs as installed (patches/kafkajs+2.2.4.patch)', () => {
  it('carries the patch: the patch applies in reverse to node_modules', () => {
    // Throws (non-zero exit, with git's message) when node_modules holds upstream's files.
    expect(() =>
      execFileSync('git', ['apply', '--check', '--reverse', 'patches/kafkajs+2.2.4.patch'], {
        cwd: repoRoot,
        stdio: 'pipe',
      }),
    ).not.toThrow();
  });

  it('groups every message once, in order, on the partition the partitioner names', () => {
    const partitioner = Partitioners.DefaultPartitioner();
    const partitionMetadata = metadata(4);
    const messages: Message[] = Array.from({ length: 5_000 }, (_, i) => ({
      key: `buyer-${i % 977}`,
      value: String(i),
    }));
    // One message names its partition: kafkajs's partitioner honours it.
    messages[10] = { key: 'buyer-x', value: 'pinned', partition: 3 };
    const grouped = groupMessagesPerPartition('installed')({
      topic: 'orders',
      partitionMetadata,
      messages,
      partitioner,
    });

    const expected: Record<string, Message[]> = {};
    for (const message of messages) {
      const p = partitioner({ topic: 'orders', partitionMetadata, message });
      (expected[p] ??= []).push(message);
    }
    expect(Object.keys(grouped).sort()).toEqual(['0', '1', '2', '3']);
    for (const [p, list] of Object.entries(expected)) {
      // Same objects, same order: a partition's messages keep the order of the send.
      expect(grouped[p]).toHaveLength(list.length);
      expect(grouped[p]!.every((m, i) => m === list[i])).toBe(true);
    }
    expect(grouped['3']).toContain(messages[10]);
    expect(Object.values(grouped).reduce((n, l) => n + l.length, 0)).toBe(messages.length);
    // And as upstream groups them.
    expect(
      groupMessagesPerPartition('upstream')({ topic: 'orders', partitionMetadata, messages, partitioner }),
    ).toEqual(grouped);
  });

  it('returns no partitions for a topic without partition metadata, as upstream does', () => {
    const partitioner = Partitioners.DefaultPartitioner();
    for (const which of ['installed', 'upstream'] as const) {
      expect(
        groupMessagesPerPartition(which)({
          topic: 'orders',
          partitionMetadata: [],
          messages: [{ key: 'a', value: 'b' }],
          partitioner,
        }),
      ).toEqual({});
    }
  });

  it('encodes varints and varlongs byte for byte as upstream', () => {
    const installed = encoderOf('installed');
    const upstream = encoderOf('upstream');
    const ints = [
      0,
      1,
      -1,
      63,
      -64,
      64,
      127,
      128,
      300,
      -300,
      16_383,
      16_384,
      2 ** 20,
      2 ** 28,
      2 ** 31 - 1,
      -(2 ** 31),
    ];
    // Around the patch's 32-bit shortcut for varlongs (|v| < 2^30), and far beyond it.
    const longs: unknown[] = [
      ...ints,
      2 ** 30 - 1,
      2 ** 30,
      -(2 ** 30),
      -(2 ** 30) - 1,
      2 ** 31,
      -(2 ** 31) - 1,
      2 ** 32 - 1,
      2 ** 40 + 5,
      -(2 ** 45),
      1_764_000_000_123,
      Number.MAX_SAFE_INTEGER,
      '12345',
      kafkajsLong('installed').fromInt(-7),
    ];
    for (const v of ints) {
      expect(new installed().writeVarInt(v).buffer).toEqual(new upstream().writeVarInt(v).buffer);
      expect(new installed().writeUVarInt(v).buffer).toEqual(new upstream().writeUVarInt(v).buffer);
    }
    for (const v of longs) {
      expect([v, new installed().writeVarLong(v).buffer]).toEqual([v, new upstream().writeVarLong(v).buffer]);
      expect([v, installed.sizeOfVarLong(v)]).toEqual([v, upstream.sizeOfVarLong(v)]);
    }
    // Written where the buffer ends: it grows, and keeps what was written before.
    const tight = new installed(1)
      .writeInt32(0x01020304)
      .writeUVarInt(2 ** 31 - 1)
      .writeVarIntString('é');
    expect(tight.buffer).toEqual(
      new upstream(1)
        .writeInt32(0x01020304)
        .writeUVarInt(2 ** 31 - 1)
        .writeVarIntString('é').buffer,
    );
  });

  it("encodes the relay's produce requests byte for byte as upstream", async () => {
    // The relay's sends: RELAY_BATCH_SIZE messages over 4 partitions, as kafkaMessageOf makes them.
    const relay = relayMessages(2_000);
    const sends: ProducePartition[][] = [
      [0, 1, 2, 3].map((partition) => ({
        partition,
        firstSequence: partition * 1_000,
        messages: relay
          .filter((_, i) => i % 4 === partition)
          .map((m, i) => ({ ...m, timestamp: String(1_764_000_000_000 + i) })),
      })),
    ];
    // Edge cases of one record: no key, a Buffer key and value, no value, an empty value, headers
    // as Buffers, arrays and none, a multi-byte UTF-8 value, a value larger than a pooled buffer
    // (4 kB) and one over 64 kB, timestamps far apart (a varlong delta beyond 2^30).
    const big = 'x'.repeat(70_000);
    const odd: Message[] = [
      { key: null, value: 'no key', timestamp: '1764000000000' },
      { key: Buffer.from([0, 1, 2, 255]), value: Buffer.from('bytes'), timestamp: '1764000000001' },
      { key: 'k', value: null, timestamp: '1764000000002' },
      { key: 'k', value: '', timestamp: '1764000000003', headers: {} },
      {
        key: 'k',
        value: 'héllo — 世界 🎉',
        timestamp: '1764000000004',
        headers: { a: Buffer.from('x'), b: ['1', '2'], c: 'ç' },
      },
      { key: 'k', value: 'y'.repeat(5_000), timestamp: '1764000000005' },
      { key: 'k', value: big, timestamp: '1764000000006' },
      { key: 'k', value: 'late', timestamp: String(1_764_000_000_000 + 2 ** 31) },
    ];
    sends.push([{ partition: 0, firstSequence: 7, messages: odd }]);
    for (const partitions of sends) {
      const [mine, theirs] = await Promise.all([
        encodeProduce('installed', partitions, { id: 4711, epoch: 3 }),
        encodeProduce('upstream', partitions, { id: 4711, epoch: 3 }),
      ]);
      expect(mine.length).toBe(theirs.length);
      expect(mine.equals(theirs)).toBe(true);
    }
  });
});
