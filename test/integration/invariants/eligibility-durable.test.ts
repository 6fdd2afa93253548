// Eligibility that outlives what the cache forgets (docs/operator.md "Traffic shaping and
// eligibility", docs/runbooks/cache-restore.md): a pre-registration is recorded in PostgreSQL by the
// api's registration route and reaches a stock bucket loaded later and a cache restored after Redis
// came back empty; the operator's restore syncs the traffic policy before it reopens the gate; a
// deny-list sync writes every listed buyer's flag again, also one a buyer hash lost while the
// `denied` set kept the buyer. Real Redis, PostgreSQL and api processes.
import { Redis } from 'ioredis';
import pg from 'pg';
import { request } from 'undici';
import { loadActivity, setGate } from '../../../core/activity-cache.js';
import { bucketLayout, forgetBucketLayout } from '../../../core/buckets.js';
import { holdForRestore, reloadFromPostgres } from '../../../core/cache-restore.js';
import type { RestoreTarget } from '../../../core/cache-restore.js';
import { recordActivityItems } from '../../../core/db/activity-items-store.js';
import { registerActivity } from '../../../core/db/activity-registry-store.js';
import { recordActivitySkus } from '../../../core/db/activity-skus-store.js';
import { advanceRestore, beginRestore, openRestore } from '../../../core/db/cache-restores-store.js';
import { recordRegistration } from '../../../core/db/registrations-store.js';
import { activityKeys, homeBucket } from '../../../core/keys.js';
import { createLogger } from '../../../core/logger.js';
import { createOperatorMetrics } from '../../../core/metrics.js';
import type { ActivityDefinition, CatalogItem } from '../../../core/model.js';
import { reserve } from '../../../core/reservations.js';
import { registerScripts } from '../../../core/scripts.js';
import {
  DEFAULT_TRAFFIC_POLICY,
  registerBuyer,
  syncDenyList,
  writeTrafficPolicy,
} from '../../../core/traffic-policy.js';
import type { TrafficPolicy } from '../../../core/traffic-policy.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import type { EffectiveSchedule } from '../../../operator/api/v1alpha1/funcs.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import type { OperatorConfig } from '../../../operator/config.js';
import { ReconcileContext } from '../../../operator/reconcile/context.js';
import type { ReconcileDeps } from '../../../operator/reconcile/context.js';
import { restoreCache } from '../../../operator/reconcile/restore-cache.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { startRole, tokenFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

const BUCKETS = 3;
const tea: CatalogItem = { skuId: 'tea', name: '西湖龙井 250g', price: '398.00', stock: 10, limitPerUser: 1 };
const hot: CatalogItem = {
  skuId: 'hot',
  name: '茅台 500ml',
  price: '1499.00',
  stock: 9,
  limitPerUser: 1,
  buckets: BUCKETS,
};

const preRegistration: TrafficPolicy = {
  ...DEFAULT_TRAFFIC_POLICY,
  eligibility: { ...DEFAULT_TRAFFIC_POLICY.eligibility, preRegistration: true },
};

describe('eligibility that outlives the cache', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let redis: Redis;
  const roles: RoleProcess[] = [];

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 3 });
    registerScripts(redis);
  });

  afterAll(async () => {
    await Promise.all(roles.map((r) => r.stop()));
    redis?.disconnect();
    await sql?.end();
    await db?.drop();
  });

  /** A sale whose start is an hour away (registration open), loaded as generation 1. */
  const definition = (id: string, items: CatalogItem[]): ActivityDefinition => ({
    id,
    generation: 1,
    startAt: new Date(Date.now() + 3_600_000),
    endAt: new Date(Date.now() + 7_200_000),
    requireOrderCode: false,
    reopenOnRelease: true,
    items,
  });

  /** An api process serving the activity, and its buyer calls. */
  const buyerApi = async (id: string) => {
    const api = await startRole('api', { activityId: id, databaseUrl: db.url });
    roles.push(api);
    const base = `${api.url}/v1/activities/${id}`;
    const post = async (user: string, path: string, body?: unknown): Promise<string> => {
      const r = await request(`${base}${path}`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${await tokenFor(user)}`,
          ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
        },
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
      });
      const answer = (await r.body.json()) as { code?: string };
      return `${r.statusCode}${answer.code ? ` ${answer.code}` : ''}`;
    };
    let n = 0;
    return {
      register: (user: string) => post(user, '/registrations'),
      order: (user: string, skuId: string) => {
        n += 1;
        return post(user, '/orders', { skuId, quantity: 1, requestId: `q${n}` });
      },
    };
  };

  const registrations = async (id: string): Promise<string[]> =>
    (
      await sql.query<{ user_id: string }>(
        'SELECT user_id FROM activity_registrations WHERE activity_id = $1 ORDER BY user_id',
        [id],
      )
    ).rows.map((r) => r.user_id);

  test('a buyer who registered may reserve a bucketed SKU a later load added', async () => {
    const id = uniqueId('regb');
    const gen1 = definition(id, [tea]);
    await loadActivity(redis, gen1);
    await writeTrafficPolicy(redis, id, preRegistration);
    const api = await buyerApi(id);

    expect(await api.register('alice')).toBe('201');
    expect(await api.register('alice')).toBe('200');
    // The route recorded it in PostgreSQL, once.
    expect(await registrations(id)).toEqual(['alice']);

    // Generation 2 adds a SKU split into stock buckets and moves the start into the past.
    await loadActivity(redis, {
      ...gen1,
      generation: 2,
      startAt: new Date(Date.now() - 1000),
      items: [tea, hot],
    });
    expect((await bucketLayout(redis, id, { refresh: true })).countOf('hot')).toBe(BUCKETS);
    await setGate(redis, id, 'open');

    // Alice is flagged in her home bucket of the new SKU (today: 403 NOT_REGISTERED there).
    expect(await api.order('alice', 'hot')).toBe('202');
    expect(await api.order('alice', 'tea')).toBe('202');
    expect(await api.order('bob', 'hot')).toBe('403 NOT_REGISTERED');
  }, 120_000);

  test('a cache restored after Redis came back empty keeps every registration', async () => {
    const id = uniqueId('regr');
    const gen1 = definition(id, [tea, hot]);
    await recordActivityItems(sql, id, 1, gen1.items);
    await loadActivity(redis, gen1);
    await writeTrafficPolicy(redis, id, preRegistration);
    const api = await buyerApi(id);
    expect(await api.register('alice')).toBe('201');
    expect(await registrations(id)).toEqual(['alice']);

    // The sale starts (generation 2: the start in the past) and opens.
    const gen2 = { ...gen1, generation: 2, startAt: new Date(Date.now() - 1000) };
    await recordActivityItems(sql, id, 2, gen2.items);
    await recordActivitySkus(sql, id, gen2.items, 'spec');
    await loadActivity(redis, gen2);
    await setGate(redis, id, 'open');
    expect(await api.register('carol')).toBe('409 REGISTRATION_CLOSED');

    // Redis loses everything of the activity, its buckets included.
    const k = activityKeys(id);
    for (const pattern of [k.scanPattern, k.bucketScanPattern]) {
      const keys = await redis.keys(pattern);
      if (keys.length > 0) await redis.del(...keys);
    }
    forgetBucketLayout(id);

    // The restore's steps (operator/reconcile/restore-cache.ts), then the traffic policy and the
    // gate, as its resume does.
    const row = await beginRestore(sql, id, 'CacheEmpty', {
      redis: { present: false },
      expectedEpoch: 0,
      skus: [],
    });
    const t: RestoreTarget = {
      activityId: id,
      epoch: row.epoch,
      generation: 2,
      startMs: gen2.startAt.getTime(),
      endMs: gen2.endAt.getTime(),
      requireOrderCode: false,
      reopenOnRelease: true,
      ownerUid: 'uid-1',
      buckets: new Map([['hot', BUCKETS]]),
    };
    await holdForRestore(redis, t);
    await advanceRestore(sql, id, row.epoch, 'detected');
    await advanceRestore(sql, id, row.epoch, 'paused');
    const reload = await reloadFromPostgres(redis, sql, t);
    await advanceRestore(sql, id, row.epoch, 'drained', reload);
    await advanceRestore(sql, id, row.epoch, 'reloaded');
    await writeTrafficPolicy(redis, id, preRegistration);
    await setGate(redis, id, 'open');

    // Alice's flag is back in every scope she may reserve in (today: 403 NOT_REGISTERED).
    expect(await api.order('alice', 'tea')).toBe('202');
    expect(await api.order('alice', 'hot')).toBe('202');
    expect(await api.order('carol', 'tea')).toBe('403 NOT_REGISTERED');
    expect(await api.order('carol', 'hot')).toBe('403 NOT_REGISTERED');
    expect(await redis.smembers(k.registered)).toEqual(['alice']);
  }, 120_000);

  test("the operator's restore syncs the traffic policy before it reopens the gate", async () => {
    const id = uniqueId('regp');
    const gen1 = definition(id, [tea, hot]);
    await loadActivity(redis, gen1);
    await writeTrafficPolicy(redis, id, preRegistration);
    // What the registration route does: PostgreSQL first, then the flags.
    await recordRegistration(sql, id, 'alice');
    expect(await registerBuyer(redis, id, 'alice')).toBe('registered');
    const gen2 = { ...gen1, generation: 2, startAt: new Date(Date.now() - 1000) };
    await recordActivityItems(sql, id, 2, gen2.items);
    await recordActivitySkus(sql, id, gen2.items, 'spec');
    await loadActivity(redis, gen2);
    await setGate(redis, id, 'open');
    const settings = { requireOrderCode: false, reopenOnRelease: true };
    await registerActivity(sql, {
      activityId: id,
      owner: `default/${id}`,
      ownerUid: id,
      startAt: gen2.startAt,
      endAt: gen2.endAt,
      ...settings,
    });
    // Redis loses the activity (its buckets included).
    const k = activityKeys(id);
    for (const pattern of [k.scanPattern, k.bucketScanPattern]) {
      const keys = await redis.keys(pattern);
      if (keys.length > 0) await redis.del(...keys);
    }
    forgetBucketLayout(id);

    const perBuyer = { requests: 7, perSeconds: 60 };
    const fsa = {
      apiVersion: 'flashsale.io/v1alpha1',
      kind: 'FlashSaleActivity',
      metadata: { name: id, namespace: 'default', generation: 2, uid: id },
      spec: {
        paused: false,
        ...settings,
        items: gen2.items,
        trafficShaping: { perBuyer },
        eligibility: { preRegistration: true, denyListRef: { name: 'deny' } },
      },
      status: {
        conditions: enterPhase(undefined, Phase.Active, 'test', 2, new Date()),
        cache: { loadedGeneration: 2, buckets: [{ skuId: 'hot', buckets: BUCKETS }] },
      },
    } as unknown as FlashSaleActivity;
    const log = createLogger('eligibility-restore-test', 'silent');
    const deps = {
      redis,
      pool: sql,
      kafka: { lag: async () => 0 },
      // The deny list's ConfigMap.
      core: { readNamespacedConfigMap: async () => ({ data: { denied: 'bob\n' } }) },
      identity: 'eligibility-restore-test',
      now: () => new Date(),
      log,
      config: {
        drainCheckMs: 200,
        restoreSettleMs: 0,
        cleanupRetryMs: 1000,
        trafficPolicy: DEFAULT_TRAFFIC_POLICY,
      } as OperatorConfig,
      metrics: createOperatorMetrics(),
      events: { record: async () => undefined },
    } as unknown as ReconcileDeps;
    const schedule = { startAt: gen2.startAt, endAt: gen2.endAt } as EffectiveSchedule;
    // Pass 1 holds; pass 2 (settled at once, nothing in Kafka) drains, reloads and resumes.
    for (let pass = 0; pass < 2; pass += 1) {
      const ctx = new ReconcileContext(deps, fsa, id, schedule, log);
      ctx.ownsActivityId = true;
      await restoreCache(ctx);
      fsa.status = ctx.status;
    }
    expect(await openRestore(sql, id)).toBeUndefined();
    expect(await redis.hget(k.meta, 'gate')).toBe('open');

    // Right after the resume, before any sync-spec pass: the policy is in force.
    const buy = async (userId: string, skuId: string): Promise<string> => {
      try {
        await reserve(redis, {
          activityId: id,
          userId,
          skuId,
          quantity: 1,
          requestId: `${userId}-${skuId}`,
          traceId: 't',
        });
        return 'reserved';
      } catch (err) {
        return String((err as { code?: string }).code);
      }
    };
    expect(await buy('bob', 'tea')).toBe('BUYER_DENIED');
    expect(await buy('bob', 'hot')).toBe('BUYER_DENIED');
    expect(await buy('carol', 'tea')).toBe('NOT_REGISTERED');
    expect(await buy('carol', 'hot')).toBe('NOT_REGISTERED');
    expect(await buy('alice', 'tea')).toBe('reserved');
    expect(await buy('alice', 'hot')).toBe('reserved');
    expect(JSON.parse((await redis.get(k.policy)) ?? 'null')).toMatchObject({
      shaping: { perBuyer },
      eligibility: { preRegistration: true },
    });
  }, 120_000);

  test('a deny-list sync flags a listed buyer again whose buyer hash lost the flag', async () => {
    const id = uniqueId('deny');
    await loadActivity(redis, { ...definition(id, [tea, hot]), startAt: new Date(Date.now() - 1000) });
    await setGate(redis, id, 'open');
    expect(await syncDenyList(redis, id, ['bob'])).toEqual({ added: 1, removed: 0 });

    // The buyer hashes lose the flag (a node's data, a failover's lost suffix, a rebuilt hash);
    // the `denied` set keeps bob.
    const k = activityKeys(id);
    const home = k.bucket('hot', homeBucket(id, 'hot', 'bob', BUCKETS), BUCKETS);
    expect(await redis.hget(home.buyer('bob'), '~deny')).toBe('1');
    await redis.del(k.buyer('bob'), home.buyer('bob'));
    expect(await redis.smembers(k.denied)).toEqual(['bob']);

    expect(await syncDenyList(redis, id, ['bob'])).toEqual({ added: 0, removed: 0 });
    const buy = async (skuId: string): Promise<string> => {
      try {
        await reserve(redis, {
          activityId: id,
          userId: 'bob',
          skuId,
          quantity: 1,
          requestId: skuId,
          traceId: 't',
        });
        return 'reserved';
      } catch (err) {
        return String((err as { code?: string }).code);
      }
    };
    // Today: reserved, in both scopes.
    expect(await buy('tea')).toBe('BUYER_DENIED');
    expect(await buy('hot')).toBe('BUYER_DENIED');
    // Lifting the list still readmits him.
    expect(await syncDenyList(redis, id, [])).toEqual({ added: 0, removed: 1 });
    expect(await buy('tea')).toBe('reserved');
    expect(await buy('hot')).toBe('reserved');
  }, 60_000);
});
