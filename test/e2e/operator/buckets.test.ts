// The real operator drives an activity with bucketed SKUs (spec.items[].buckets) through its
// lifecycle on the real API server, Kafka, PostgreSQL and a loopback Redis Cluster (three primaries
// with a replica each: test/env/start-redis-cluster.sh, or the one REDIS_CLUSTER_NODES names), with
// the runtime roles as a local process (RESERVE_ACK=replica, the cluster's default) and buyers over
// HTTP: warm-up splits each bucketed SKU's stock into its buckets, the
// oversubscribed sale sells every unit (bucket 0 of the hot SKU only through transfers: no buyer
// is homed there), nobody above the limit, every 202 one order, write-back sums the remaining
// stock over the buckets, and cleanup leaves no bucket key behind on any primary. A SKU without a count of its
// own is split by spec.bucketing (automatic above a stock threshold); the count chosen at warm-up
// is recorded (Redis, status) and a threshold edited mid-sale changes no loaded SKU. The Redis Cluster side of
// buckets in depth (slots spread over primaries, a primary killed mid-sale) is covered by
// test/integration/order-path/cluster-buckets.test.ts and test/integration/faults/cluster-failover.test.ts.
import type { Redis } from 'ioredis';
import { createRedis, parseSentinels, primariesOf } from '../../../core/redis.js';
import type { RedisClient } from '../../../core/scripts.js';
import { startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';
import { bucketShare } from '../../../core/buckets.js';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows, readWriteBack } from '../../../core/db/stock-store.js';
import { activityKeys, homeBucket } from '../../../core/keys.js';
import { findCondition } from '../../../operator/api/v1alpha1/conditions.js';
import { GROUP, PLURAL, Phase, VERSION } from '../../../operator/api/v1alpha1/types.js';
import { uniqueId } from '../../../dev/servers.js';
import { httpClient, pool as inParallel, startRole, tokenFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
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
import type { OperatorProcess } from '../../../dev/operator-harness.js';
import { operatorWorld } from './setup.js';
import type { OperatorWorld } from './setup.js';

const TIMEOUT_MS = 150_000;
const HOT = { skuId: 'hot', stock: 24, buckets: 4, limit: 2 };
const WARM = { skuId: 'warm', stock: 10, buckets: 3 };
/** No count of its own: spec.bucketing (threshold 8, 3 buckets) splits it. */
const BULK = { skuId: 'bulk', stock: 8, buckets: 3 };

describe('operator: an activity with stock buckets, end to end', () => {
  const a = admin();
  let world: OperatorWorld | undefined;
  let priv: PrivateServers | undefined;
  let redis: RedisClient;
  /** The cluster for the operator and the runtime (REDIS_URL stays for credentials only). */
  let clusterEnv: Record<string, string>;
  /** Every key matching `pattern`, on every primary. */
  const scanAll = async (pattern: string): Promise<string[]> =>
    (await Promise.all(primariesOf(redis).map((n: Redis) => scanKeys(n, pattern)))).flat().sort();
  let operator: OperatorProcess | undefined;
  let runtime: RoleProcess | undefined;
  const activityId = uniqueId('bkt');
  const crashedId = uniqueId('bkt-crash');

  beforeAll(async () => {
    let nodes = process.env.REDIS_CLUSTER_NODES;
    if (!nodes) {
      priv = await startPrivateServers(['redis-cluster']);
      nodes = priv.env.REDIS_CLUSTER_NODES!;
    }
    clusterEnv = { REDIS_CLUSTER_NODES: nodes };
    redis = createRedis({ clusterNodes: parseSentinels(nodes.split(',')) });
    world = await operatorWorld(a, { namespace: 'op-bkt', topicsOf: [activityId, crashedId] });
    [runtime, operator] = await Promise.all([
      startRole('all', { activityId, databaseUrl: world.db.url, env: clusterEnv }),
      startOperator({ ns: world.ns, databaseUrl: world.db.url, env: clusterEnv }),
    ]);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await runtime?.stop();
    await operator?.kill('SIGTERM');
    await world?.close();
    redis?.disconnect();
    if (priv) await stopPrivateServers(priv);
  }, TIMEOUT_MS);

  it(
    'splits the stock at warm-up, sells every unit, writes back the sum over buckets, cleans every bucket',
    async () => {
      const w = world!;
      const pg: Pool = w.pg;
      const ns = w.ns.namespace;
      const name = 'hot-sale';
      const warmUpAt = new Date(Date.now() + 6_000);
      const startAt = new Date(warmUpAt.getTime() + 8_000);
      const endAt = new Date(startAt.getTime() + 20_000);
      await createActivity(
        a,
        activityBody(ns, name, {
          warmUpAt,
          startAt,
          endAt,
          items: [
            {
              skuId: HOT.skuId,
              name: '茅台 飞天 53度 500ml',
              price: '1499.00',
              stock: HOT.stock,
              limitPerUser: HOT.limit,
              buckets: HOT.buckets,
            },
            {
              skuId: WARM.skuId,
              name: '西湖龙井礼盒',
              price: '199.90',
              stock: WARM.stock,
              limitPerUser: 1,
              buckets: WARM.buckets,
            },
            { skuId: BULK.skuId, name: '东北大米 10kg', price: '129.00', stock: BULK.stock, limitPerUser: 1 },
            { skuId: 'plain', name: '五常大米 5kg', price: '89.90', stock: 6, limitPerUser: 1 },
          ],
          // Unpaid orders stay open past the sale: the stock written back is exactly what the
          // sale left, and the activity waits in Settling.
          extraSpec: {
            activityId,
            payment: { timeout: '30m' },
            bucketing: { stockThreshold: BULK.stock, buckets: BULK.buckets },
          },
        }),
      );

      // Warm-up split each bucketed SKU's stock into its buckets (the first `stock % n` buckets get
      // one more unit); the SKU's own hash holds none, and the meta records the layout.
      const k = activityKeys(activityId);
      const ready = await waitForPhase(a, ns, name, [Phase.Ready, Phase.Active], 60_000);
      expect(ready.status?.cache?.loads).toBe(1);
      for (const sku of [HOT, WARM, BULK]) {
        expect(await redis.hget(k.meta, k.bucketField(sku.skuId))).toBe(String(sku.buckets));
        expect(await redis.hget(k.sku(sku.skuId), 'stock')).toBe('0');
        const shares = await Promise.all(
          Array.from({ length: sku.buckets }, (_, i) =>
            redis.hget(k.bucket(sku.skuId, i, sku.buckets).sku(sku.skuId), 'stock'),
          ),
        );
        expect(shares.map(Number)).toEqual(
          Array.from({ length: sku.buckets }, (_, i) => bucketShare(sku.stock, i, sku.buckets)),
        );
      }
      // Below the threshold: not split.
      expect(await redis.hget(k.sku('plain'), 'stock')).toBe('6');
      expect(await redis.hget(k.meta, k.bucketField('plain'))).toBeNull();
      // The choices, recorded before the load (what a resumed operator loads with) and in status.
      expect(await redis.hgetall(k.bucketPlan)).toEqual({ hot: '4', warm: '3', bulk: '3', plain: '1' });
      const loaded = await waitFor('the layout in status', async () => {
        const fsa = await getActivity(a, ns, name);
        return fsa?.status?.cache?.buckets ? fsa : undefined;
      });
      expect(loaded.status?.cache?.buckets).toEqual([
        { skuId: BULK.skuId, buckets: BULK.buckets },
        { skuId: HOT.skuId, buckets: HOT.buckets },
        { skuId: WARM.skuId, buckets: WARM.buckets },
      ]);

      const active = await waitForPhase(a, ns, name, Phase.Active, 60_000);
      // The threshold lowered mid-sale (it would split every SKU now): the operator takes the new
      // generation and changes nothing loaded, refusing nothing either.
      await a.custom.patchNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: ns,
        plural: PLURAL,
        name,
        body: [{ op: 'replace', path: '/spec/bucketing/stockThreshold', value: 3 }],
      });
      const edited = active.metadata.generation + 1;
      await waitFor('the edit synced', async () => {
        const fsa = await getActivity(a, ns, name);
        return fsa?.status?.cache?.syncedGeneration === edited ? fsa : undefined;
      });
      expect(await redis.hget(k.meta, k.bucketField('plain'))).toBeNull();
      expect(await redis.hget(k.sku('plain'), 'stock')).toBe('6');
      expect(await redis.hget(k.meta, k.bucketField(BULK.skuId))).toBe('3');
      // Demand: 20 hot buyers x 3 requests for 24 units (limit 2), none homed in bucket 0, so its
      // 6 units sell only through transfers; 4 buyers of 10 warm units, 5 of 8 bulk, 4 of 6 plain.
      const hotBuyers: string[] = [];
      for (let i = 0; hotBuyers.length < 20; i += 1) {
        const b = `h-buyer-${i}`;
        if (homeBucket(activityId, HOT.skuId, b, HOT.buckets) !== 0) hotBuyers.push(b);
      }
      const submissions = [
        ...hotBuyers.flatMap((u) => [0, 1, 2].map((n) => ({ u, skuId: HOT.skuId, requestId: `${u}-${n}` }))),
        ...[0, 1, 2, 3].map((n) => ({ u: `w-buyer-${n}`, skuId: WARM.skuId, requestId: `w-${n}` })),
        ...[0, 1, 2, 3, 4].map((n) => ({ u: `b-buyer-${n}`, skuId: BULK.skuId, requestId: `b-${n}` })),
        ...[0, 1, 2, 3].map((n) => ({ u: `p-buyer-${n}`, skuId: 'plain', requestId: `p-${n}` })),
      ];
      const http = httpClient(16);
      const url = `${runtime?.url ?? ''}/v1/activities/${activityId}/orders`;
      const answers = await inParallel(
        8,
        submissions.map((s) => async () => {
          const r = await http.post(
            url,
            { skuId: s.skuId, quantity: 1, requestId: s.requestId },
            await tokenFor(s.u),
          );
          return {
            ...s,
            status: r.status,
            code: typeof r.json.code === 'string' ? r.json.code : '',
            rid: typeof r.json.reservationId === 'string' ? r.json.reservationId : '',
          };
        }),
      );
      await http.close();
      const accepted = answers.filter((r) => r.status === 202);
      expect(accepted.filter((r) => r.skuId === HOT.skuId)).toHaveLength(HOT.stock);
      expect(accepted.filter((r) => r.skuId === WARM.skuId)).toHaveLength(4);
      expect(accepted.filter((r) => r.skuId === BULK.skuId)).toHaveLength(5);
      expect(accepted.filter((r) => r.skuId === 'plain')).toHaveLength(4);
      expect(
        [...new Set(answers.filter((r) => r.status !== 202).map((r) => `${r.status} ${r.code}`))].sort(),
      ).toEqual(['409 LIMIT_REACHED', '409 SOLD_OUT']);

      // Drain, write-back and cleanup ran; the unpaid orders keep the activity in Settling.
      const settling = await waitForPhase(a, ns, name, Phase.Settling, 90_000);
      const rows = (
        await pg.query<{ reservation_id: string; user_id: string; sku_id: string }>(
          `SELECT reservation_id, user_id, sku_id FROM orders WHERE activity_id = $1`,
          [activityId],
        )
      ).rows;
      expect(rows.map((r) => r.reservation_id).sort()).toEqual(accepted.map((r) => r.rid).sort());
      const perBuyer = new Map<string, number>();
      for (const r of rows)
        perBuyer.set(`${r.user_id}/${r.sku_id}`, (perBuyer.get(`${r.user_id}/${r.sku_id}`) ?? 0) + 1);
      expect(Math.max(...perBuyer.values())).toBe(HOT.limit);

      // Write-back: the remaining stock is the sum over the buckets (hot 0, warm 6, bulk 3) plus
      // plain's 2; the generation is the one loaded at warm-up (the edit loaded nothing).
      expect(await readWriteBack(pg, activityId)).toMatchObject({
        generation: 1,
        initialTotal: 48,
        remainingTotal: 11,
        reservedTotal: 37,
        ordersTotal: 37,
      });
      expect(await readStockRows(pg, activityId)).toEqual([
        { skuId: BULK.skuId, initial: BULK.stock, remaining: 3 },
        { skuId: HOT.skuId, initial: HOT.stock, remaining: 0 },
        { skuId: 'plain', initial: 6, remaining: 2 },
        { skuId: WARM.skuId, initial: WARM.stock, remaining: 6 },
      ]);
      expect(settling.status?.stock).toMatchObject({ initial: 48, remaining: 11, reserved: 37, ordered: 37 });
      expect(settling.status?.cache?.loads).toBe(1);
      expect(findCondition(settling.status?.conditions, 'Degraded')).toMatchObject({ status: 'False' });

      // Cleanup: no key of any bucket is left; of the activity's own slot only the results.
      expect(await scanAll(k.bucketScanPattern)).toEqual([]);
      expect(await scanAll(k.scanPattern)).toEqual([k.results]);
      expect(await redis.hlen(k.results)).toBe(37);

      const events = await eventsOf(a, ns, name);
      expect(events.filter((e) => e.reason === 'WroteBack')).toHaveLength(1);
      expect(events.filter((e) => e.type !== 'Normal')).toEqual([]);
    },
    TIMEOUT_MS,
  );

  it(
    'an operator SIGKILLed after choosing the counts and restarted with another setting loads the first choice',
    async () => {
      const w = world!;
      const ns = w.ns.namespace;
      // The operator of the first test leaves; one at a time holds the lease.
      await operator?.kill('SIGTERM');
      operator = undefined;
      const name = 'crash-plan';
      const now = Date.now();
      await createActivity(
        a,
        activityBody(ns, name, {
          warmUpAt: new Date(now),
          startAt: new Date(now + 3_600_000),
          endAt: new Date(now + 7_200_000),
          items: [{ skuId: 'big', name: '洗衣液 3kg', price: '39.90', stock: 12, limitPerUser: 1 }],
          extraSpec: { activityId: crashedId },
        }),
      );
      const crashed = await startOperator({
        ns: w.ns,
        databaseUrl: w.db.url,
        crashPoint: 'operator-after-bucket-plan',
        waitFor: 'nothing',
        env: { ...clusterEnv, AUTO_BUCKETS_STOCK_THRESHOLD: '10', AUTO_BUCKETS: '2' },
      });
      const exit = await Promise.race([
        crashed.exited,
        new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 90_000).unref()),
      ]);
      expect(exit?.signal).toBe('SIGKILL');
      const k = activityKeys(crashedId);
      // Chosen and recorded, nothing loaded yet.
      expect(await redis.hgetall(k.bucketPlan)).toEqual({ big: '2' });
      expect(await redis.hget(k.meta, k.bucketField('big'))).toBeNull();

      // Restarted with another setting: the load finishes with the count it began with.
      operator = await startOperator({
        ns: w.ns,
        databaseUrl: w.db.url,
        env: { ...clusterEnv, AUTO_BUCKETS_STOCK_THRESHOLD: '10', AUTO_BUCKETS: '4' },
      });
      const ready = await waitForPhase(a, ns, name, Phase.Ready, 60_000);
      expect(ready.status?.cache?.buckets).toEqual([{ skuId: 'big', buckets: 2 }]);
      expect(await redis.hget(k.meta, k.bucketField('big'))).toBe('2');
      const shares = await Promise.all(
        [0, 1].map((i) => redis.hget(k.bucket('big', i, 2).sku('big'), 'stock')),
      );
      expect(shares).toEqual(['6', '6']);
      // No key of another layout: every bucket key is one of the two buckets'.
      const prefixes = [0, 1].map((i) => k.bucket('big', i, 2).prefix);
      const bucketKeys = await scanAll(k.bucketScanPattern);
      expect(bucketKeys.length).toBeGreaterThan(0);
      expect(bucketKeys.filter((key) => !prefixes.some((p) => key.startsWith(p)))).toEqual([]);
    },
    TIMEOUT_MS,
  );
});
