// A cache restore (operator/reconcile/restore-cache.ts, docs/operator.md "Cache restore") against the
// running operator: a Redis that comes back from a snapshot taken before a spec generation was
// loaded is restored to the loaded generation (its stock and its extended endAt), never left at
// the older one; and a live activity deleted while its Redis came back empty is restored before it
// drains and writes back, so the write-back holds its stock (never 0 of 0, never CacheLost).
import type { Redis } from 'ioredis';
import { readMeta } from '../../../core/activity-cache.js';
import { restoresOf } from '../../../core/db/cache-restores-store.js';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows, readWriteBack } from '../../../core/db/stock-store.js';
import { createKafka, idempotentProducer, topicsFor } from '../../../core/kafka.js';
import { activityKeys } from '../../../core/keys.js';
import { findCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { GROUP, PLURAL, Phase, VERSION } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import { testEnv } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import {
  activityBody,
  admin,
  createActivity,
  eventsOf,
  getActivity,
  scanKeys,
  startOperator,
  waitFor,
  waitForPhase,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess, Recorder } from '../../../dev/operator-harness.js';
import { operatorWorld } from './setup.js';
import type { OperatorWorld } from './setup.js';

const TIMEOUT_MS = 240_000;

describe('operator: cache restore (older generation, deletion)', () => {
  const a = admin();
  let world: OperatorWorld | undefined;
  let db: FreshDatabase;
  let pg: Pool;
  let redis: Redis;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;
  let recorder: Recorder;

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-restore' });
    ({ db, pg, redis, ns, recorder } = world);
    operator = await startOperator({ ns, databaseUrl: db.url });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await operator?.kill('SIGTERM');
    await world?.close();
  }, TIMEOUT_MS);

  const patch = (name: string, ops: unknown[]): Promise<unknown> =>
    a.custom.patchNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: ns.namespace,
      plural: PLURAL,
      name,
      body: ops,
    });
  const remove = (name: string): Promise<unknown> =>
    a.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: ns.namespace,
      plural: PLURAL,
      name,
    });
  const cacheCondition = async (name: string) =>
    findCondition((await getActivity(a, ns.namespace, name))?.status?.conditions, 'CacheConsistent');
  const gone = (name: string): Promise<boolean> =>
    waitFor(`${name} deleted`, async () => (await getActivity(a, ns.namespace, name)) === undefined, 120_000);
  /** Starts an activity with one SKU of `stock` units and waits until it is Active. */
  const activeSale = async (name: string, stock: number, endAt: Date): Promise<string> => {
    const t0 = Date.now();
    await createActivity(
      a,
      activityBody(ns.namespace, name, {
        warmUpAt: new Date(t0),
        startAt: new Date(t0 + 1_000),
        endAt,
        items: [{ skuId: 's', name: '汤圆', price: '1', stock }],
        drainTimeout: '5s',
      }),
    );
    const active = await waitForPhase(a, ns.namespace, name, Phase.Active, 60_000);
    return active.status?.activityId ?? '';
  };

  it(
    'restores a cache that came back at an older generation to the loaded one: its added stock and its later endAt',
    async () => {
      const endAt = new Date(Date.now() + 10 * 60_000);
      const id = await activeSale('older', 5, endAt);
      const k = activityKeys(id);
      // The snapshot Redis will come back from: taken while generation 1 was loaded.
      const keys = await scanKeys(redis, k.scanPattern);
      const snapshot = await Promise.all(
        keys.map(async (key) => ({
          key,
          ttl: Math.max(0, await redis.pttl(key)),
          dump: (await redis.dumpBuffer(key))!,
        })),
      );
      expect(await readMeta(redis, id)).toMatchObject({ generation: 1, endMs: endAt.getTime() });

      // Generation 2 (safe while Active): more stock and an extended sale, applied to the cache.
      const later = new Date(endAt.getTime() + 5 * 60_000);
      await patch('older', [
        { op: 'replace', path: '/spec/items/0/stock', value: 8 },
        { op: 'replace', path: '/spec/schedule/endAt', value: later.toISOString() },
      ]);
      await waitFor('generation 2 loaded', async () => {
        const c = (await getActivity(a, ns.namespace, 'older'))?.status?.cache;
        return c?.loadedGeneration === 2 && c.syncedGeneration === 2;
      });
      expect(await readMeta(redis, id)).toMatchObject({ generation: 2, endMs: later.getTime() });
      expect(await redis.hget(k.sku('s'), 'stock')).toBe('8');

      // Redis comes back from the snapshot (a restart from an older RDB, a lagging replica
      // promoted): generation 1 again, consistent in itself (nothing was sold).
      const back = redis.multi();
      const now = await scanKeys(redis, k.scanPattern);
      if (now.length > 0) back.del(...now);
      for (const s of snapshot) back.restore(s.key, s.ttl, s.dump, 'REPLACE');
      await back.exec();

      // The operator brings it back to generation 2, never leaves it at generation 1.
      await waitFor(
        'the cache back at generation 2',
        async () => {
          const c = await cacheCondition('older');
          const meta = await readMeta(redis, id);
          return c?.status === 'True' && c.reason === 'Restored' && meta?.generation === 2;
        },
        90_000,
      );
      expect(await readMeta(redis, id)).toMatchObject({
        generation: 2,
        endMs: later.getTime(),
        gate: 'open',
      });
      expect(await redis.hget(k.sku('s'), 'stock')).toBe('8');
      expect(await redis.hget(k.sku('s'), 'initial')).toBe('8');
      const detected = (await eventsOf(a, ns.namespace, 'older')).find(
        (e) => e.reason === 'CacheDivergenceDetected',
      );
      expect(detected?.message).toMatch(/^CacheBehind: Redis generation 1 \(loaded 2\)/);
      const fsa = (await getActivity(a, ns.namespace, 'older')) as FlashSaleActivity;
      expect(fsa.status?.phase).toBe(Phase.Active);
      expect(fsa.status?.cache).toMatchObject({ loadedGeneration: 2, syncedGeneration: 2 });

      await remove('older');
      await gone('older');
      expect(await readWriteBack(pg, id)).toMatchObject({
        generation: 2,
        initialTotal: 8,
        remainingTotal: 8,
      });
    },
    TIMEOUT_MS,
  );

  it(
    'deleted while a restore waits for the consumers: the deletion waits, then writes back the restored stock',
    async () => {
      const id = await activeSale('held', 3, new Date(Date.now() + 10 * 60_000));
      const k = activityKeys(id);
      // One order message no consumer has read: the restore waits for consumer lag 0.
      const kafka = createKafka(testEnv().kafkaBrokers, `restore-e2e-${id}`);
      const producer = idempotentProducer(kafka);
      await producer.connect();
      await producer.send({ topic: topicsFor(id).orders, messages: [{ key: 'k', value: 'unread' }] });
      await producer.disconnect();

      // Redis loses the activity's data; the restore pauses an empty cache (a meta with only the
      // gate) and waits for the consumers.
      await redis.unlink(...(await scanKeys(redis, k.scanPattern)));
      await waitFor(
        'the restore waiting for the consumers',
        async () => {
          const c = await cacheCondition('held');
          return c?.reason === 'RestoreDraining' && /consumer lag 1/.test(c.message);
        },
        60_000,
      );
      expect(await redis.hmget(k.meta, 'gate', 'gen')).toEqual(['paused', null]);

      await remove('held');
      // Past the drain timeout (5s): nothing drains or writes back a cache that is not restored.
      await new Promise((r) => setTimeout(r, 10_000));
      const waiting = await getActivity(a, ns.namespace, 'held');
      expect(waiting?.metadata.deletionTimestamp).toBeDefined();
      expect(waiting?.status?.phase).toBe(Phase.Active);
      expect(findCondition(waiting?.status?.conditions, 'CacheConsistent')).toMatchObject({
        status: 'False',
        reason: 'RestoreDraining',
      });
      expect(await readWriteBack(pg, id)).toBeUndefined();

      // The consumers catch up: the restore finishes (gate closed), then drain and write-back.
      const kadmin = kafka.admin();
      await kadmin.connect();
      try {
        const t = topicsFor(id);
        const ends = await kadmin.fetchTopicOffsets(t.orders);
        await kadmin.setOffsets({
          groupId: t.consumerGroup,
          topic: t.orders,
          partitions: ends.map((p) => ({ partition: p.partition, offset: p.high })),
        });
      } finally {
        await kadmin.disconnect();
      }
      await gone('held');
      expect(recorder.phases.get('held')).not.toContain(Phase.Failed);
      expect(await readWriteBack(pg, id)).toMatchObject({ initialTotal: 3, remainingTotal: 3 });
      expect(await readStockRows(pg, id)).toEqual([{ skuId: 's', initial: 3, remaining: 3 }]);
      const reasons = (await eventsOf(a, ns.namespace, 'held')).map((e) => e.reason);
      expect(reasons).toEqual(expect.arrayContaining(['CacheRestoreResumed', 'WroteBack']));
      // The restore resumed before the drain began. Events carry whole seconds, so their order
      // within one second is not theirs: compare the restore's row (the database clock, µs) with
      // the status's Draining timestamp (ms) the watch delivered last.
      await recorder.sawDeleted('held');
      const [restore] = await restoresOf(pg, id);
      const draining = recorder.statuses.get('held')?.at(-1)?.status?.timestamps?.draining;
      expect(restore?.resumedAt).toBeInstanceOf(Date);
      expect(draining).toBeDefined();
      expect(restore!.resumedAt!.getTime()).toBeLessThanOrEqual(Date.parse(draining!));
    },
    TIMEOUT_MS,
  );

  it(
    'deleted at the moment its Redis came back empty: restored, drained and written back, not CacheLost',
    async () => {
      const id = await activeSale('lost', 4, new Date(Date.now() + 10 * 60_000));
      const k = activityKeys(id);
      await Promise.all([redis.unlink(...(await scanKeys(redis, k.scanPattern))), remove('lost')]);
      await gone('lost');
      expect(recorder.phases.get('lost')).not.toContain(Phase.Failed);
      expect(await readWriteBack(pg, id)).toMatchObject({ initialTotal: 4, remainingTotal: 4 });
      expect(await readStockRows(pg, id)).toEqual([{ skuId: 's', initial: 4, remaining: 4 }]);
      const reasons = (await eventsOf(a, ns.namespace, 'lost')).map((e) => e.reason);
      expect(reasons).toEqual(expect.arrayContaining(['CacheRestoreResumed', 'WroteBack']));
    },
    TIMEOUT_MS,
  );
});
