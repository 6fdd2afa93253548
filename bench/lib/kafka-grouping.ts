/**
 * kafkajs' grouping of a send's messages by partition (`groupMessagesPerPartition`), as installed
 * (patches/kafkajs+2.2.4.patch applied) and as upstream 2.2.4 wrote it, for the micro-benchmarks
 * and test/unit/runtime/kafkajs-patch.test.ts.
 */
import { createRequire } from 'node:module';
import type { Message, PartitionMetadata, Partitioners } from 'kafkajs';

export type GroupPerPartition = (args: {
  topic: string;
  partitionMetadata: PartitionMetadata[];
  messages: Message[];
  partitioner: ReturnType<typeof Partitioners.DefaultPartitioner>;
}) => Record<string, Message[]>;

/** The function kafkajs' producer uses, from node_modules (patched there by `npm ci`). */
export const installedGroupMessagesPerPartition = createRequire(import.meta.url)(
  'kafkajs/src/producer/groupMessagesPerPartition.js',
) as GroupPerPartition;

/** kafkajs 2.2.4's own groupMessagesPerPartition, before patches/kafkajs+2.2.4.patch: the reference. */
export const upstreamGroupMessagesPerPartition: GroupPerPartition = ({
  topic,
  partitionMetadata,
  messages,
  partitioner,
}) => {
  if (partitionMetadata.length === 0) return {};
  return messages.reduce<Record<string, Message[]>>((result, message) => {
    const partition = partitioner({ topic, partitionMetadata, message });
    const current = result[partition] ?? [];
    return Object.assign(result, { [partition]: [...current, message] });
  }, {});
};

/** Metadata of a topic with `count` partitions, all led by broker 0. */
export function partitionMetadata(count: number): PartitionMetadata[] {
  return Array.from({ length: count }, (_, partitionId) => ({
    partitionId,
    leader: 0,
    partitionErrorCode: 0,
    replicas: [0],
    isr: [0],
    offlineReplicas: [],
  }));
}
