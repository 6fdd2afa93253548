// The order message is defined once (core/order-message.ts): what reserve-9.lua writes on the real
// Redis (the reservation hash and the outbox entry) is exactly what the schema knows, and the relay
// forwards an entry without parsing it, including entries a relay of the earlier format left in a
// stream (written before the script wrote the Kafka key and trace id as fields of their own).
import { Redis } from 'ioredis';
import { Partitioners } from 'kafkajs';
import type { KafkaMessage } from 'kafkajs';
import { createKafka, idempotentProducer } from '../../../core/kafka.js';
import { activityKeys } from '../../../core/keys.js';
import { createLogger } from '../../../core/logger.js';
import { createMetrics } from '../../../core/metrics.js';
import {
  ORDER_BATCH_HEADER,
  OUTBOX_FIELDS,
  RESERVATION_HASH_FIELDS,
  RESERVATION_STATE_FIELDS,
  orderMessageOf,
  orderMessageSchema,
} from '../../../core/order-message.js';
import type { OrderMessage } from '../../../core/order-message.js';
import {
  cancelBeforeReserve,
  confirmPaid,
  readReservation,
  release,
  reservationIdFor,
  reserve,
} from '../../../core/reservations.js';
import { registerScripts } from '../../../core/scripts.js';
import { Relay } from '../../../runtime/relay/relay.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import { setUpActivity, waitFor } from '../../../dev/roles.js';
import type { TestActivity } from '../../../dev/roles.js';

const ITEM = { skuId: 'tea', name: '西湖龙井 明前特级', price: '268.00', stock: 10, limitPerUser: 2 };

describe('the order message written by reserve-9.lua', () => {
  let redis: Redis;
  let activity: TestActivity;

  beforeAll(async () => {
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 2 });
    registerScripts(redis);
    activity = await setUpActivity(uniqueId('msg'), [ITEM]);
  });
  afterAll(async () => {
    await redis.quit();
  });

  test('the reservation hash and the outbox entry hold exactly the schema’s fields', async () => {
    const input = {
      activityId: activity.id,
      userId: 'buyer.1@shop',
      skuId: 'tea',
      quantity: 2,
      requestId: 'req-fields',
      traceId: '4bf92f3577b34da6a3ce929d0e0e4736',
    };
    const outcome = await reserve(redis, input);
    expect(outcome.kind).toBe('reserved');
    const rid = reservationIdFor(activity.id, input.userId, input.requestId);
    const k = activityKeys(activity.id);

    const hash = await redis.hgetall(k.reservation(rid));
    expect(Object.keys(hash).sort()).toEqual(['state', ...Object.values(RESERVATION_HASH_FIELDS)].sort());

    const entries = await redis.xrange(k.outbox, '-', '+');
    expect(entries).toHaveLength(1);
    const fields = entries[0]![1];
    const entry = new Map<string, string>();
    for (let i = 0; i < fields.length; i += 2) entry.set(fields[i]!, fields[i + 1]!);
    expect([...entry.keys()].sort()).toEqual(Object.values(OUTBOX_FIELDS).sort());

    const raw = JSON.parse(entry.get(OUTBOX_FIELDS.message)!) as Record<string, unknown>;
    // strict(): a field the script writes and the schema does not know fails as much as a missing one.
    const message = orderMessageSchema.strict().parse(raw);
    expect(Object.keys(raw).sort()).toEqual(Object.keys(orderMessageSchema.shape).sort());
    expect(message).toMatchObject({
      reservationId: rid,
      activityId: activity.id,
      userId: input.userId,
      skuId: 'tea',
      quantity: 2,
      slot: 1,
      unitPrice: '268.00',
      itemName: ITEM.name,
      traceId: input.traceId,
      requestId: input.requestId,
    });
    expect({
      rid: entry.get(OUTBOX_FIELDS.reservationId),
      key: entry.get(OUTBOX_FIELDS.key),
      trace: entry.get(OUTBOX_FIELDS.traceId),
    }).toEqual({ rid, key: input.userId, trace: input.traceId });

    // The ledger entry read back is the same message (what gap repair re-publishes).
    const record = await readReservation(redis, activity.id, rid);
    expect(record?.state).toBe('RESERVED');
    expect(orderMessageOf(activity.id, record!)).toEqual(message);
  });
  test('the other scripts add only the lifecycle fields core/order-message.ts names', async () => {
    const known = new Set<string>([...RESERVATION_STATE_FIELDS, ...Object.values(RESERVATION_HASH_FIELDS)]);
    const k = activityKeys(activity.id);
    const unknownFields = async (rid: string): Promise<string[]> =>
      Object.keys(await redis.hgetall(k.reservation(rid))).filter((f) => !known.has(f));

    await reserve(redis, {
      activityId: activity.id,
      userId: 'releasing-buyer',
      skuId: 'tea',
      quantity: 1,
      requestId: 'req-release',
      traceId: 't-release',
    });
    const released = reservationIdFor(activity.id, 'releasing-buyer', 'req-release');
    await release(redis, {
      activityId: activity.id,
      reservationId: released,
      userId: 'releasing-buyer',
      skuId: 'tea',
      reason: 'TEST',
    });
    expect((await readReservation(redis, activity.id, released))?.state).toBe('RELEASED');

    await reserve(redis, {
      activityId: activity.id,
      userId: 'paying-buyer',
      skuId: 'tea',
      quantity: 1,
      requestId: 'req-pay',
      traceId: 't-pay',
    });
    const paid = reservationIdFor(activity.id, 'paying-buyer', 'req-pay');
    expect(await confirmPaid(redis, activity.id, paid)).toBe('paid');

    const marker = await cancelBeforeReserve(redis, {
      activityId: activity.id,
      userId: 'cancelling-buyer',
      requestId: 'req-cancel',
      reason: 'TEST',
    });
    expect(marker.kind).toBe('marked');
    const cancelled = reservationIdFor(activity.id, 'cancelling-buyer', 'req-cancel');

    expect({
      released: await unknownFields(released),
      paid: await unknownFields(paid),
      cancelled: await unknownFields(cancelled),
    }).toEqual({ released: [], paid: [], cancelled: [] });
  });
});

describe('the relay turns outbox entries into Kafka messages', () => {
  let redis: Redis;
  let blocking: Redis;
  let activity: TestActivity;
  const kafka = createKafka(testEnv().kafkaBrokers, 'test-order-message');

  beforeAll(async () => {
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 2 });
    blocking = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: null });
    registerScripts(redis);
    activity = await setUpActivity(uniqueId('relaymsg'), [ITEM]);
  });
  afterAll(async () => {
    await redis.quit();
    blocking.disconnect();
  });

  test('entries of the current and of the earlier format reach Kafka with the same key, headers and value', async () => {
    const k = activityKeys(activity.id);
    // A sale in flight during an upgrade: an entry written by the earlier script (rid and m only).
    const legacy: OrderMessage = {
      reservationId: reservationIdFor(activity.id, 'legacy-buyer', 'req-legacy'),
      activityId: activity.id,
      userId: 'legacy-buyer',
      skuId: 'tea',
      quantity: 1,
      slot: 1,
      unitPrice: '268.00',
      itemName: ITEM.name,
      reservedAt: 1_760_000_000_000,
      traceId: 'trace-legacy',
      requestId: 'req-legacy',
    };
    const legacyValue = JSON.stringify(legacy);
    await redis.xadd(k.outbox, '*', 'rid', legacy.reservationId, 'm', legacyValue);
    await reserve(redis, {
      activityId: activity.id,
      userId: 'current-buyer',
      skuId: 'tea',
      quantity: 1,
      requestId: 'req-current',
      traceId: 'trace-current',
    });
    const currentRid = reservationIdFor(activity.id, 'current-buyer', 'req-current');
    const currentValue = (await redis.xrange(k.outbox, '-', '+'))
      .map(([, f]) => f)
      .find((f) => f[1] === currentRid)!;
    const currentJson = currentValue[currentValue.indexOf(OUTBOX_FIELDS.message) + 1]!;

    const seen = new Map<string, { key: string; value: string; headers: Record<string, string> }>();
    const reader = kafka.consumer({ groupId: uniqueId('relay-reader') });
    await reader.connect();
    await reader.subscribe({ topic: activity.topics.orders, fromBeginning: true });
    await reader.run({
      eachMessage: async ({ message }: { message: KafkaMessage }) => {
        const headers: Record<string, string> = {};
        for (const [name, v] of Object.entries(message.headers ?? {})) headers[name] = String(v);
        seen.set(headers['reservation-id'] ?? '', {
          key: message.key?.toString('utf8') ?? '',
          value: message.value?.toString('utf8') ?? '',
          headers,
        });
      },
    });

    const relay = new Relay({
      activityId: activity.id,
      topic: activity.topics.orders,
      redis,
      blockingRedis: blocking,
      createProducer: () => idempotentProducer(kafka),
      metrics: createMetrics('test-relay'),
      logger: createLogger('test-relay', 'silent'),
      batchSize: 10,
      reclaimIdleMs: 60_000,
      consumerName: 'order-message-test',
    });
    await relay.start();
    try {
      await waitFor('both entries on Kafka', async () => seen.size === 2);
      await waitFor('the outbox emptied', async () => (await redis.xlen(k.outbox)) === 0);
    } finally {
      await relay.stop();
      await reader.disconnect();
    }

    expect(seen.get(legacy.reservationId)).toEqual({
      key: 'legacy-buyer',
      value: legacyValue,
      headers: { 'trace-id': 'trace-legacy', 'reservation-id': legacy.reservationId },
    });
    expect(seen.get(currentRid)).toEqual({
      key: 'current-buyer',
      value: currentJson,
      headers: { 'trace-id': 'trace-current', 'reservation-id': currentRid },
    });
  });

  // With RELAY_ORDERS_PER_MESSAGE above 1, a read's entries for one partition travel as one message:
  // every order exactly once, each on the partition a message keyed by its buyer would have gone to.
  test("a read of many entries reaches Kafka as batch messages on the buyers' partitions", async () => {
    const batchActivity = await setUpActivity(uniqueId('relaybatch'), [{ ...ITEM, stock: 40 }]);
    const k = activityKeys(batchActivity.id);
    const buyers = Array.from({ length: 16 }, (_, i) => `batch-buyer-${i}`);
    const expected = new Map<string, string>();
    for (const buyer of buyers) {
      await reserve(redis, {
        activityId: batchActivity.id,
        userId: buyer,
        skuId: 'tea',
        quantity: 1,
        requestId: `req-${buyer}`,
        traceId: `trace-${buyer}`,
      });
      expected.set(reservationIdFor(batchActivity.id, buyer, `req-${buyer}`), buyer);
    }

    const admin = kafka.admin();
    await admin.connect();
    const partitionMetadata = (await admin.fetchTopicMetadata({ topics: [batchActivity.topics.orders] }))
      .topics[0]!.partitions;
    await admin.disconnect();
    const partitioner = Partitioners.DefaultPartitioner();
    const partitionOf = (buyer: string): number =>
      partitioner({
        topic: batchActivity.topics.orders,
        partitionMetadata,
        message: { key: buyer, value: null },
      });

    const arrived: { partition: number; batch: boolean; order: OrderMessage }[] = [];
    const reader = kafka.consumer({ groupId: uniqueId('relay-batch-reader') });
    await reader.connect();
    await reader.subscribe({ topic: batchActivity.topics.orders, fromBeginning: true });
    await reader.run({
      eachMessage: async ({ partition, message }) => {
        const batch = message.headers?.[ORDER_BATCH_HEADER] !== undefined;
        const lines = (message.value?.toString('utf8') ?? '').split('\n');
        if (batch) expect(String(message.headers?.[ORDER_BATCH_HEADER])).toBe(String(lines.length));
        for (const line of lines)
          arrived.push({ partition, batch, order: orderMessageSchema.parse(JSON.parse(line)) });
      },
    });
    const relay = new Relay({
      activityId: batchActivity.id,
      topic: batchActivity.topics.orders,
      redis,
      blockingRedis: blocking,
      createProducer: () => idempotentProducer(kafka),
      metrics: createMetrics('test-relay-batch'),
      logger: createLogger('test-relay-batch', 'silent'),
      batchSize: 100,
      ordersPerMessage: 500,
      reclaimIdleMs: 60_000,
      consumerName: 'order-batch-test',
    });
    await relay.start();
    try {
      await waitFor('every order on Kafka', async () => arrived.length >= buyers.length);
      await waitFor('the outbox emptied', async () => (await redis.xlen(k.outbox)) === 0);
    } finally {
      await relay.stop();
      await reader.disconnect();
    }

    expect(arrived.map((a) => a.order.reservationId).sort()).toEqual([...expected.keys()].sort());
    for (const a of arrived) {
      expect({ buyer: a.order.userId, partition: a.partition }).toEqual({
        buyer: expected.get(a.order.reservationId),
        partition: partitionOf(a.order.userId),
      });
    }
    // 16 entries read at once over the topic's partitions: some partition got several, in one message.
    expect(arrived.some((a) => a.batch)).toBe(true);
  });
});
