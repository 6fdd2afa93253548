// A relay whose activity was cleaned up (the outbox stream deleted with the activity's keys) goes
// quiet: one info line, no warning per retry, and no stray key re-created behind the cleanup; it
// resumes should the outbox come back. A relay started after the cleanup, or during one stopped
// half-way, creates nothing either.
import { Redis } from 'ioredis';
import { cleanupActivity, outboxStreams } from '../../../core/activity-cache.js';
import { activityKeys } from '../../../core/keys.js';
import { reserve } from '../../../core/reservations.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { setUpActivity, startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import { cleanupKilledAtFirstDelete } from '../../fixtures/interrupted-cleanup.js';

const TIMEOUT_MS = 120_000;

describe('a relay after its activity was cleaned up', () => {
  let db: FreshDatabase;
  let redis: Redis;
  let relay: RoleProcess | undefined;

  beforeAll(async () => {
    db = await freshDatabase();
    redis = new Redis(testEnv().redisUrl);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await relay?.kill();
    redis?.disconnect();
    await db?.drop();
  }, TIMEOUT_MS);

  it(
    'idles quietly without re-creating the outbox, and resumes if it comes back',
    async () => {
      const id = uniqueId('gone');
      const items = [{ skuId: 'pen', name: '钢笔', price: '12.00', stock: 5, limitPerUser: 2 }];
      await setUpActivity(id, items);
      relay = await startRole('relay', {
        activityId: id,
        databaseUrl: db.url,
        env: { LOG_LEVEL: 'info', RELAY_CONCURRENCY: '4' },
      });
      const keys = activityKeys(id);

      // What cleanup does: every key of the activity goes (the stream and its relay group too).
      const found: string[] = [];
      let cursor = '0';
      do {
        const [next, batch] = await redis.scan(cursor, 'MATCH', keys.scanPattern, 'COUNT', 1000);
        cursor = next;
        found.push(...batch);
      } while (cursor !== '0');
      expect(found).toContain(keys.outbox);
      await redis.unlink(...found);

      await waitFor('the relay idles', async () => relay?.output().includes("the activity's outbox is gone"));
      expect(await redis.exists(keys.outbox)).toBe(0);

      // The outbox comes back (the activity loaded again and a reservation made): it resumes.
      await setUpActivity(id, items);
      await reserve(redis, {
        activityId: id,
        userId: 'u1',
        skuId: 'pen',
        quantity: 1,
        requestId: 'r1',
        traceId: 't1',
      });
      await waitFor('the relay resumes', async () =>
        relay?.output().includes("the activity's outbox is back"),
      );
      const out = relay.output();
      // One line per relay loop (RELAY_CONCURRENCY, 4 here), however long it idled.
      expect(out.match(/outbox is gone/g)).toHaveLength(4);
      expect(out).not.toContain('relay batch failed');
      expect(relay.proc.exitCode).toBeNull();
    },
    TIMEOUT_MS,
  );
  it(
    'a relay (re)started after cleanup creates no outbox either',
    async () => {
      await relay?.kill();
      const id = uniqueId('gone-start');
      const items = [{ skuId: 'ink', name: '墨水', price: '8.00', stock: 5, limitPerUser: 2 }];
      await setUpActivity(id, items);
      const keys = activityKeys(id);
      const found = await redis.keys(keys.scanPattern);
      if (found.length > 0) await redis.unlink(...found);
      // A relay pod restarted during Settling, after cleanup (relays run at their draining size).
      relay = await startRole('relay', { activityId: id, databaseUrl: db.url, env: { LOG_LEVEL: 'info' } });
      await waitFor('the relay idles', async () => relay?.output().includes("the activity's outbox is gone"));
      expect(await redis.exists(keys.outbox)).toBe(0);
      expect(await redis.keys(keys.scanPattern)).toEqual([]);
    },
    TIMEOUT_MS,
  );
  it(
    'a relay (re)started during a cleanup stopped half-way creates no outbox behind it',
    async () => {
      await relay?.kill();
      const id = uniqueId('gone-mid');
      const items = [{ skuId: 'nib', name: '笔尖', price: '3.00', stock: 5, limitPerUser: 2 }];
      await setUpActivity(id, items);
      const keys = activityKeys(id);
      // The operator dies at cleanup's first delete: the meta hash (with the load mark and the
      // mark that cleanup began) is still there, as it is until cleanup's very last delete.
      await cleanupKilledAtFirstDelete(redis, id);
      expect(await redis.hexists(keys.meta, 'cleanupBegan')).toBe(1);
      // A resumed cleanup's SCAN reached the outbox first.
      await redis.unlink(keys.outbox);
      relay = await startRole('relay', { activityId: id, databaseUrl: db.url, env: { LOG_LEVEL: 'info' } });
      await waitFor('the relay idles', async () => relay?.output().includes("the activity's outbox is gone"));
      expect(await redis.exists(keys.outbox)).toBe(0);
      // The cleanup completes: not a key of the activity is left but the retained results.
      await cleanupActivity(redis, id, 60);
      expect((await redis.keys(keys.scanPattern)).filter((key) => key !== keys.results)).toEqual([]);
    },
    TIMEOUT_MS,
  );
  it(
    "a relay started before its activity's load relays every outbox once it is loaded, a stock bucket's too",
    async () => {
      await relay?.kill();
      const id = uniqueId('early');
      const items = [{ skuId: 'hot', name: '热门', price: '5.00', stock: 40, limitPerUser: 1, buckets: 4 }];
      // Topics first (the operator's warm-up creates them before it loads the cache), no cache yet.
      await setUpActivity(id, items);
      const keys = activityKeys(id);
      const loaded = [...(await redis.keys(keys.scanPattern)), ...(await redis.keys(keys.bucketScanPattern))];
      await redis.unlink(...loaded);
      relay = await startRole('relay', { activityId: id, databaseUrl: db.url, env: { LOG_LEVEL: 'info' } });
      await waitFor('the relay idles', async () => relay?.output().includes("the activity's outbox is gone"));

      // The operator loads the cache; the SKU is bucketed only, so the activity's own outbox gets
      // no entry: the buyers' half messages are all in the buckets' outboxes.
      await setUpActivity(id, items);
      for (let i = 0; i < 12; i += 1) {
        await reserve(redis, {
          activityId: id,
          userId: `early-${i}`,
          skuId: 'hot',
          quantity: 1,
          requestId: `r${i}`,
          traceId: `t${i}`,
        });
      }
      const streams = await outboxStreams(redis, id);
      expect(streams.length).toBeGreaterThan(1);
      const backlog = async () => {
        let n = 0;
        for (const s of streams) n += await redis.xlen(s);
        return n;
      };
      expect(await backlog()).toBe(12);
      await waitFor('every outbox relayed', async () => (await backlog()) === 0, 20_000);
      // The activity's own outbox got its relay group once the activity was loaded.
      const groups = (await redis.xinfo('GROUPS', keys.outbox)) as unknown[][];
      expect(groups.map((g) => g[1])).toEqual(['relay']);
      expect(relay.proc.exitCode).toBeNull();
    },
    TIMEOUT_MS,
  );
});
