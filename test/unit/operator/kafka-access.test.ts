import type { Admin } from 'kafkajs';
import { DeadlineExceededError } from '../../../core/deadline.js';
import { TopicReplicationError } from '../../../core/kafka.js';
import { KafkaAdminAccess, KafkaCallError } from '../../../operator/reconcile/kafka-access.js';

/** An admin whose offset reads answer only when the test says so (a broker that does not answer). */
class SilentBroker {
  offsetReads = 0;
  private answers: (() => void)[] = [];

  admin(): Admin {
    const admin = {
      connect: async () => undefined,
      disconnect: async () => undefined,
      fetchTopicOffsets: async () => {
        this.offsetReads += 1;
        await new Promise<void>((resolve) => this.answers.push(resolve));
        return [{ partition: 0, offset: '7', high: '7', low: '0' }];
      },
      fetchOffsets: async () => [{ topic: 't', partitions: [{ partition: 0, offset: '4' }] }],
    };
    return admin as unknown as Admin;
  }

  answer(): void {
    for (const a of this.answers.splice(0)) a();
  }
}

/** An admin whose topic creation fails at once with `err` (a request that timed out, a refusal). */
function failingAdmin(err: Error): Admin {
  return {
    connect: async () => undefined,
    disconnect: async () => undefined,
    listTopics: async () => [],
    createTopics: async () => {
      throw err;
    },
  } as unknown as Admin;
}

function access(broker: SilentBroker): KafkaAdminAccess {
  return new KafkaAdminAccess({
    brokers: ['127.0.0.1:1'],
    clientId: 'test',
    topicPrefix: 'flashsale',
    partitions: 1,
    replicationFactor: 1,
    readDeadlineMs: 30,
    createAdmin: () => broker.admin(),
  });
}

describe("the operator's Kafka figures", () => {
  test('a read the broker does not answer gives up at the deadline; the next pass joins it', async () => {
    const broker = new SilentBroker();
    const kafka = access(broker);
    await expect(kafka.lag('a.sale')).rejects.toBeInstanceOf(DeadlineExceededError);
    await expect(kafka.lag('a.sale')).rejects.toThrow('Kafka lag a.sale: no answer in 30 ms');
    // Two passes gave up, one request is out: nothing piles up on the broker.
    expect(broker.offsetReads).toBe(1);
    // Another figure or another activity is a call of its own.
    await expect(kafka.dlqDepth('a.sale')).rejects.toBeInstanceOf(DeadlineExceededError);
    await expect(kafka.lag('b.sale')).rejects.toBeInstanceOf(DeadlineExceededError);
    expect(broker.offsetReads).toBe(3);
  });

  test('once the broker answers, a pass joining in time gets the figure, and the next read is new', async () => {
    const broker = new SilentBroker();
    const kafka = access(broker);
    await expect(kafka.lag('a.sale')).rejects.toBeInstanceOf(DeadlineExceededError);
    const joined = kafka.lag('a.sale');
    broker.answer();
    await expect(joined).resolves.toBe(3); // high 7, committed 4
    const fresh = kafka.lag('a.sale');
    await new Promise((resolve) => setImmediate(resolve)); // its request is out
    broker.answer();
    await expect(fresh).resolves.toBe(3);
    expect(broker.offsetReads).toBe(2);
  });

  test('a call that fails before its deadline says which call and activity, with the cause', async () => {
    // The patched kafkajs fails every request on a connection another one timed out on: the
    // warm-up's topics then fail before their own deadline, and the reconcile error must still
    // say that it was the topics of this activity.
    const timedOut = Object.assign(
      new Error(
        'Request not answered: another request on its connection timed out, and the connection was closed',
      ),
      { name: 'KafkaJSRequestTimeoutError' },
    );
    const kafka = new KafkaAdminAccess({
      brokers: ['127.0.0.1:1'],
      clientId: 'test',
      topicPrefix: 'flashsale',
      partitions: 1,
      replicationFactor: 1,
      createAdmin: () => failingAdmin(timedOut),
    });
    const err: unknown = await kafka.ensureTopics('a.sale').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KafkaCallError);
    expect((err as Error).message).toBe(
      'Kafka ensure topics a.sale: Request not answered: another request on its connection timed out, ' +
        'and the connection was closed',
    );
    expect((err as Error).cause).toBe(timedOut);
  });

  test('an error that already explains itself passes unchanged (the warm-up holds on it)', async () => {
    const refused = new TopicReplicationError(['flashsale.a.sale.orders has 1 replica, 3 configured']);
    const kafka = new KafkaAdminAccess({
      brokers: ['127.0.0.1:1'],
      clientId: 'test',
      topicPrefix: 'flashsale',
      partitions: 1,
      replicationFactor: 3,
      createAdmin: () => failingAdmin(refused),
    });
    await expect(kafka.ensureTopics('a.sale')).rejects.toBe(refused);
  });
});
