/**
 * kafkajs as installed (patches/kafkajs+2.2.4.patch applied by `npm ci`) and as upstream 2.2.4
 * shipped it, side by side, for the micro-benchmarks and test/unit/runtime/kafkajs-patch.test.ts;
 * the same for ioredis' patch (test/unit/runtime/ioredis-sentinel-patch.test.ts).
 * Upstream is the installed package with the patch reversed (`git apply --reverse`) in a copy
 * under node_modules/.cache, so the reference is upstream's own code, never a hand-made copy.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Message, PartitionMetadata, Partitioners } from 'kafkajs';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** The patch `npm ci` applies to kafkajs (patch-package, the postinstall script). */
export const KAFKAJS_PATCH = join(repoRoot, 'patches', 'kafkajs+2.2.4.patch');
/** The patch `npm ci` applies to ioredis (its Sentinel connector; core/redis.ts). */
export const IOREDIS_PATCH = join(repoRoot, 'patches', 'ioredis+5.11.1.patch');

/** A patched package's installed directory. */
function installedDirOf(pkg: string): string {
  return dirname(createRequire(import.meta.url).resolve(`${pkg}/package.json`));
}

/**
 * A copy of an installed package with its patch (patches/<pkg>+<version>.patch) reversed: the
 * package as published. Made once per version of the patch (the directory's name carries its hash)
 * and kept for later runs.
 */
export function upstreamPackageDir(pkg: string, patchFile: string): string {
  const hash = createHash('sha256').update(readFileSync(patchFile)).digest('hex').slice(0, 16);
  const version = (
    JSON.parse(readFileSync(join(installedDirOf(pkg), 'package.json'), 'utf8')) as { version: string }
  ).version;
  // Under the project's node_modules, so that the copy finds the package's own dependencies.
  const dir = join(repoRoot, 'node_modules', '.cache', 'flashsale-upstream', `${pkg}-${version}-${hash}`);
  mkdirSync(dirname(dir), { recursive: true });
  if (existsSync(join(dir, 'package.json'))) return dir;
  const staging = `${dir}.${process.pid}`;
  rmSync(staging, { recursive: true, force: true });
  cpSync(installedDirOf(pkg), staging, { recursive: true });
  // -p3: the patch names files as a/node_modules/<pkg>/<path>. Throws with git's message when
  // the installed package does not carry the patch.
  // Outside any repository (the ceiling stops git from finding this project's): inside one, git
  // apply would take the paths as the repository's and skip them.
  execFileSync('git', ['apply', '--reverse', '-p3', patchFile], {
    cwd: staging,
    stdio: 'pipe',
    env: { ...process.env, GIT_CEILING_DIRECTORIES: dirname(dir) },
  });
  try {
    renameSync(staging, dir);
  } catch (err) {
    // Another process made it first: theirs is the same.
    rmSync(staging, { recursive: true, force: true });
    if (!existsSync(join(dir, 'package.json'))) throw err;
  }
  return dir;
}

/** kafkajs 2.2.4 as published. */
export function upstreamKafkajsDir(): string {
  return upstreamPackageDir('kafkajs', KAFKAJS_PATCH);
}

/** A file of kafkajs (`src/...`), as installed or as upstream shipped it. */
export function kafkajsModule<T>(which: 'installed' | 'upstream', file: string): T {
  return patchedPackageModule('kafkajs', KAFKAJS_PATCH, which, file);
}

/** A file of a patched package, as installed or as upstream shipped it. */
export function patchedPackageModule<T>(
  pkg: string,
  patchFile: string,
  which: 'installed' | 'upstream',
  file: string,
): T {
  const dir = which === 'installed' ? installedDirOf(pkg) : upstreamPackageDir(pkg, patchFile);
  return createRequire(join(dir, 'package.json'))(join(dir, file)) as T;
}

export type GroupPerPartition = (args: {
  topic: string;
  partitionMetadata: PartitionMetadata[];
  messages: Message[];
  partitioner: ReturnType<typeof Partitioners.DefaultPartitioner>;
}) => Record<string, Message[]>;

/** kafkajs' grouping of a send's messages by partition, as its producer uses it. */
export function groupMessagesPerPartition(which: 'installed' | 'upstream'): GroupPerPartition {
  return kafkajsModule<GroupPerPartition>(which, 'src/producer/groupMessagesPerPartition.js');
}

/** What kafkajs' encoders return: the bytes written so far. */
export interface KafkaEncoder {
  buffer: Buffer;
}

/** One partition's messages in a produce request (kafkajs' internal shape). */
export interface ProducePartition {
  partition: number;
  firstSequence: number;
  messages: Message[];
}

/** kafkajs' produce request, version 3 (the record batch format v2 that later versions reuse). */
export type ProduceRequest = (args: {
  acks: number;
  timeout: number;
  producerId: unknown;
  producerEpoch: number;
  compression: number;
  topicData: { topic: string; partitions: ProducePartition[] }[];
}) => { encode: () => Promise<KafkaEncoder> };

export function produceRequest(which: 'installed' | 'upstream'): ProduceRequest {
  return kafkajsModule<ProduceRequest>(which, 'src/protocol/requests/produce/v3/request.js');
}

/** kafkajs' `Long` (its producer id type), from the same copy as the request. */
export function kafkajsLong(which: 'installed' | 'upstream'): { fromInt: (n: number) => unknown } {
  return kafkajsModule(which, 'src/utils/long.js');
}

/**
 * The bytes of an idempotent producer's request (acks from all in-sync replicas, no compression)
 * for topic `orders`, as the relay sends them, encoded by the installed or the upstream kafkajs.
 */
export async function encodeProduce(
  which: 'installed' | 'upstream',
  partitions: ProducePartition[],
  producer: { id: number; epoch: number } = { id: 1000, epoch: 0 },
): Promise<Buffer> {
  const request = produceRequest(which)({
    acks: -1,
    timeout: 30_000,
    producerId: kafkajsLong(which).fromInt(producer.id),
    producerEpoch: producer.epoch,
    compression: 0,
    topicData: [{ topic: 'orders', partitions }],
  });
  return (await request.encode()).buffer;
}

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

/**
 * `count` messages as the relay makes them from outbox entries (runtime/relay/relay.ts
 * kafkaMessageOf): the buyer id as key, the order's JSON as value, trace and reservation id headers.
 */
export function relayMessages(count: number, reservedAt = 1_764_000_000_000): Message[] {
  return Array.from({ length: count }, (_, i) => {
    const reservationId = `r${i.toString(16).padStart(31, '0')}`;
    const traceId = `${(i * 7919).toString(16).padStart(32, '0')}`;
    const value = JSON.stringify({
      reservationId,
      activityId: 'flash-2026-12',
      userId: `buyer-${i}`,
      skuId: 'sku-hot',
      quantity: 1,
      slot: 1 + (i % 16),
      unitPrice: '199.00',
      itemName: 'Limited edition',
      reservedAt: reservedAt + i,
      traceId,
      requestId: `q-${i}`,
    });
    return { key: `buyer-${i}`, value, headers: { 'trace-id': traceId, 'reservation-id': reservationId } };
  });
}
