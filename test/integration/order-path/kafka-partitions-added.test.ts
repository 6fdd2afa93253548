// kafkajs sends nothing to a partition its own metadata does not have yet, and resolves the send
// (cluster.findLeaderForPartitions skips the partition). core/kafka.ts onePartitionPerRequest
// places messages by partitions it reads itself, which can already name a partition added to the
// topic since the producer last read its metadata; the relay deletes from the outbox what a
// resolved send carried, so such a send must fail, never resolve. On the suite's real Kafka.
import { Partitioners } from 'kafkajs';
import type { Admin, Producer } from 'kafkajs';
import { createKafka, idempotentProducer, onePartitionPerRequest } from '../../../core/kafka.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';

const TIMEOUT_MS = 60_000;

test(
  'a send to a partition added since the producer read its metadata fails; a fresh producer delivers it',
  async () => {
    const id = uniqueId('parts');
    const topic = `flashsale.partitions-added.${id}`;
    const kafka = createKafka(testEnv().kafkaBrokers, id);
    const admin: Admin = kafka.admin();
    await admin.connect();
    // The producer's own metadata kept for longer than the test (in the roles: 5 s), so that the
    // window in which it lags the topic stays open.
    const stale: Producer = kafka.producer({
      metadataMaxAge: 600_000,
      allowAutoTopicCreation: false,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    const wrapped = onePartitionPerRequest(stale, kafka);
    const fresh = idempotentProducer(kafka);
    try {
      await admin.createTopics({ topics: [{ topic, numPartitions: 1 }], waitForLeaders: true });
      await stale.connect();
      await stale.send({ topic, acks: -1, messages: [{ key: 'k', value: 'before' }] });
      await admin.createPartitions({ topicPartitions: [{ topic, count: 2 }] });
      const highOf = async (partition: number): Promise<number> =>
        Number((await admin.fetchTopicOffsets(topic)).find((o) => o.partition === partition)?.high ?? -1);
      expect(await highOf(1)).toBe(0);

      const partitionOf = await wrapped.partitionerFor(topic);
      const key = Array.from({ length: 100 }, (_, i) => `buyer-${i}`).find((k) => partitionOf(k) === 1)!;
      await expect(wrapped.send({ topic, acks: -1, messages: [{ key, value: 'after' }] })).rejects.toThrow(
        `kafka producer sent nothing to partition 1 of ${topic} (not in its metadata yet)`,
      );
      // Nothing reached the partition: kafkajs had resolved that send as done.
      expect(await highOf(1)).toBe(0);

      // Sent again with a producer that reads the metadata first (the relay's retry): delivered.
      await fresh.connect();
      const sent = await fresh.send({ topic, acks: -1, messages: [{ key, value: 'after' }] });
      expect(sent.map((r) => r.partition)).toEqual([1]);
      expect(await highOf(1)).toBe(1);
    } finally {
      // The wrapped producers' disconnect also closes the admin client each reads partitions with.
      await Promise.allSettled([wrapped.disconnect(), fresh.disconnect()]);
      await admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
      await admin.disconnect();
    }
  },
  TIMEOUT_MS,
);
