// The relay sends through kafkajs 2.2.4 with patches/kafkajs+2.2.4.patch applied (patch-package,
// `npm ci`'s postinstall; the Dockerfile's build stage): upstream groups a send's messages by
// partition by copying the partition's array for every message, quadratic in a batch's messages
// per partition (tulios/kafkajs#1576, never released). Checked here: the installed file is the
// patched one, and it groups exactly as upstream does (every message once, in order, on the
// partition the partitioner names).
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Partitioners } from 'kafkajs';
import type { Message } from 'kafkajs';
import {
  installedGroupMessagesPerPartition as groupMessagesPerPartition,
  partitionMetadata as metadata,
} from '../../../bench/lib/kafka-grouping.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

describe('kafkajs as installed (patches/kafkajs+2.2.4.patch)', () => {
  it('carries the patch: the patch applies in reverse to node_modules', () => {
    // Throws (non-zero exit, with git's message) when node_modules holds upstream's file.
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
    const grouped = groupMessagesPerPartition({ topic: 'orders', partitionMetadata, messages, partitioner });

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
  });

  it('returns no partitions for a topic without partition metadata, as upstream does', () => {
    const partitioner = Partitioners.DefaultPartitioner();
    expect(
      groupMessagesPerPartition({
        topic: 'orders',
        partitionMetadata: [],
        messages: [{ key: 'a', value: 'b' }],
        partitioner,
      }),
    ).toEqual({});
  });
});
