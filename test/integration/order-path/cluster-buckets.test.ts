// An oversubscribed sale on a Redis Cluster (three primaries, one replica each; started by
// test/env/start-redis-cluster.sh, or the one REDIS_CLUSTER_NODES names) with one hot SKU split
// into 8 stock buckets and an ordinary SKU, through the real api, relay and consumer processes.
// The hot SKU's buyers are chosen so that no buyer is homed in bucket 0: its units can only be
// sold through transfers between buckets, so a phantom sold-out (units left in a bucket nobody
// reaches) leaves stock behind and fails the test (mutant test/faults/mutants/bucket-no-transfer).
import { cleanupActivity, loadActivity, readStock, setGate } from '../../../core/activity-cache.js';
import {
  bucketLayout,
  completeTransfers,
  forgetBucketLayout,
  transferStock,
  unitsLeft,
} from '../../../core/buckets.js';
import { dependencyOutage, FlashSaleError } from '../../../core/errors.js';
import { checkCache, holdForRestore, reloadFromPostgres } from '../../../core/cache-restore.js';
import type { RestoreTarget } from '../../../core/cache-restore.js';
import { recordActivityItems } from '../../../core/db/activity-items-store.js';
import { recordActivitySkus } from '../../../core/db/activity-skus-store.js';
import { beginRestore } from '../../../core/db/cache-restores-store.js';
import { insertOrders } from '../../../core/db/orders-store.js';
import type { CatalogItem } from '../../../core/model.js';
import type { BucketKeys as BucketKeysOf } from '../../../core/keys.js';
import { orderMessageOf, readReservation, reservationIdFor, reserve } from '../../../core/reservations.js';
import { registerScripts } from '../../../core/scripts.js';
import { createPool } from '../../../core/db/pool.js';
import { createLogger } from '../../../core/logger.js';
import { auditStock } from '../../../runtime/jobs/stock-audit.js';
import { activityKeys, homeBucket } from '../../../core/keys.js';
import { isCluster, parseSentinels, primariesOf } from '../../../core/redis.js';
import { ClusterReplicaAck } from '../../../core/durable-ack.js';
import type { SentinelAddress } from '../../../core/redis.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import {
  Sale,
  clusterServers,
  prepareActivity,
  recoverAndCheck,
  redisOf,
} from '../../faults/harness/sale.js';
import type { Servers } from '../../faults/harness/sale.js';
import { startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { httpClient, tokenFor, waitFor } from '../../../dev/roles.js';
import calculateSlot from 'cluster-key-slot';
import type { Cluster } from 'ioredis';
import pg from 'pg';
import { loadOpenSale } from '../../fixtures/open-sale.js';

const HOT_STOCK = 96;

/** The process id of the cluster node at `address` ("host:port"), to SIGSTOP it. */
async function processIdOf(redis: Cluster, address: string): Promise<number> {
  const node = redis.nodes('all').find((n) => `${n.options.host}:${n.options.port}` === address);
  const pid = Number(/^process_id:(\d+)/m.exec((await node?.info('server')) ?? '')?.[1]);
  if (!Number.isInteger(pid) || pid <= 0) throw new Error(`no process id for ${address}`);
  return pid;
}
const BUCKETS = 8;
const LIMIT = 2;
const PLAIN_STOCK = 12;

describe('Redis Cluster: a hot SKU in 8 stock buckets', () => {
  let priv: PrivateServers | undefined;
  let db: FreshDatabase;
  let servers: Servers;
  let sale: Sale | undefined;

  beforeAll(async () => {
    let nodes: SentinelAddress[];
    if (process.env.REDIS_CLUSTER_NODES) nodes = parseSentinels(process.env.REDIS_CLUSTER_NODES.split(','));
    else {
      priv = await startPrivateServers(['redis-cluster']);
      nodes = parseSentinels(priv.env.REDIS_CLUSTER_NODES!.split(','));
    }
    db = await freshDatabase();
    servers = clusterServers(nodes, db.url, testEnv().kafkaBrokers);
  }, 180_000);

  afterAll(async () => {
    await sale?.stop();
    await db?.drop();
    if (priv) await stopPrivateServers(priv);
  }, 180_000);

  test('every unit sold, exactly the stock in orders, no buyer above the limit, every 202 one order', async () => {
    const activityId = uniqueId('cl-bkt');
    await prepareActivity(servers, activityId, [
      {
        skuId: 'hot',
        name: '茅台 飞天 53度 500ml',
        price: '1499.00',
        stock: HOT_STOCK,
        limitPerUser: LIMIT,
        buckets: BUCKETS,
      },
      { skuId: 'plain', name: '五常大米 5kg', price: '89.90', stock: PLAIN_STOCK, limitPerUser: 1 },
    ]);
    sale = new Sale({ servers, activityId, env: { RESERVE_ACK: 'local' } });
    await sale.start();

    // Hot-SKU buyers homed anywhere but bucket 0; demand 3 x 60 submissions for 96 units.
    const hotBuyers: string[] = [];
    for (let i = 0; hotBuyers.length < 60; i += 1) {
      const b = `${activityId}-h${i}`;
      if (homeBucket(activityId, 'hot', b, BUCKETS) !== 0) hotBuyers.push(b);
    }
    const plainBuyers = Array.from({ length: 30 }, (_, i) => `${activityId}-p${i}`);
    const submissions = [
      ...hotBuyers.flatMap((b) => [0, 1, 2].map((n) => ({ buyer: b, skuId: 'hot', requestId: `r${n}` }))),
      ...plainBuyers.map((b) => ({ buyer: b, skuId: 'plain', requestId: 'r0' })),
    ];
    const http = httpClient(16);
    const tokens = new Map<string, string>();
    for (const b of [...hotBuyers, ...plainBuyers]) tokens.set(b, await tokenFor(b));
    const answers: { buyer: string; skuId: string; status: number; code?: string; rid?: string }[] = [];
    let next = 0;
    const worker = async (): Promise<void> => {
      for (let i = next++; i < submissions.length; i = next++) {
        const s = submissions[i]!;
        for (let attempt = 1; ; attempt += 1) {
          const r = await http
            .post(
              `${sale!.url('api')}/v1/activities/${activityId}/orders`,
              { skuId: s.skuId, quantity: 1, requestId: s.requestId },
              tokens.get(s.buyer),
            )
            .catch(() => ({ status: 0, json: {} as Record<string, unknown> }));
          if ((r.status >= 200 && r.status < 500) || attempt >= 50) {
            answers.push({
              buyer: s.buyer,
              skuId: s.skuId,
              status: r.status,
              ...(typeof r.json.code === 'string' ? { code: r.json.code } : {}),
              ...(typeof r.json.reservationId === 'string' ? { rid: r.json.reservationId } : {}),
            });
            break;
          }
        }
      }
    };
    try {
      await Promise.all(Array.from({ length: 16 }, worker));
    } finally {
      await http.close();
    }

    const accepted = answers.filter((a) => a.status === 202);
    const refusals = new Set(
      answers.filter((a) => a.status !== 202).map((a) => `${a.status} ${a.code ?? ''}`),
    );
    expect([...refusals].sort()).toEqual(['409 LIMIT_REACHED', '409 SOLD_OUT']);
    expect(accepted.filter((a) => a.skuId === 'hot')).toHaveLength(HOT_STOCK);
    expect(accepted.filter((a) => a.skuId === 'plain')).toHaveLength(PLAIN_STOCK);

    const recovery = await recoverAndCheck(servers, activityId);
    expect(recovery.drained).toBe(true);
    expect(formatViolations(recovery.violations)).toBe('');

    // Every unit sold: nothing left in any bucket (bucket 0 only through transfers). The stock
    // audit agrees over all buckets; freezing and cleanup cover every bucket on every primary.
    const redis = redisOf(servers);
    const audit = createPool(db.url, 2, 'cluster-buckets-test');
    try {
      const stock = await readStock(redis, activityId);
      expect(stock.skus.map((s) => [s.skuId, s.initial, s.remaining])).toEqual([
        ['hot', HOT_STOCK, 0],
        ['plain', PLAIN_STOCK, 0],
      ]);
      const rec = await auditStock({
        activityId,
        redis,
        pool: audit,
        logger: createLogger('cluster-buckets-test', 'silent'),
        remeasureDelayMs: 50,
      });
      expect(rec.mismatches).toEqual([]);
      await sale!.stop();
      sale = undefined;
      await setGate(redis, activityId, 'frozen');
      const cleaned = await cleanupActivity(redis, activityId, 60);
      expect(cleaned.retained).toBe(1);
      const left: string[] = [];
      const k = activityKeys(activityId);
      for (const node of primariesOf(redis)) {
        for (const pattern of [k.scanPattern, k.bucketScanPattern]) left.push(...(await node.keys(pattern)));
      }
      // Only the buyers' results stay (with their TTL).
      expect(left).toEqual([k.results]);
    } finally {
      redis.disconnect();
      await audit.end();
    }

    // PostgreSQL: exactly one live order per 202, none above the limit.
    const sql = new pg.Pool({ connectionString: db.url, max: 1 });
    try {
      const rows = (
        await sql.query<{ reservation_id: string; user_id: string; sku_id: string }>(
          `SELECT reservation_id, user_id, sku_id FROM orders WHERE activity_id = $1 AND status <> 'CLOSED'`,
          [activityId],
        )
      ).rows;
      expect(rows.map((r) => r.reservation_id).sort()).toEqual(accepted.map((a) => a.rid).sort());
      const perBuyer = new Map<string, number>();
      for (const r of rows)
        perBuyer.set(`${r.user_id}/${r.sku_id}`, (perBuyer.get(`${r.user_id}/${r.sku_id}`) ?? 0) + 1);
      expect(Math.max(...perBuyer.values())).toBeLessThanOrEqual(LIMIT);
    } finally {
      await sql.end();
    }
  });

  // A cache restore (core/cache-restore.ts) of a bucketed SKU on the cluster: the buckets live on
  // several primaries, and every one of them comes back empty.
  test('a bucketed cache lost on every primary is restored bucket by bucket, then sells exactly the rest', async () => {
    const id = uniqueId('cl-rst');
    const items: CatalogItem[] = [
      {
        skuId: 'hot',
        name: '茅台 飞天 53度 500ml',
        price: '1499.00',
        stock: 24,
        limitPerUser: LIMIT,
        buckets: BUCKETS,
      },
      { skuId: 'plain', name: '五常大米 5kg', price: '89.90', stock: 6, limitPerUser: 1 },
    ];
    const redis = redisOf(servers);
    registerScripts(redis);
    const sql = new pg.Pool({ connectionString: db.url, max: 2 });
    try {
      const start = new Date(Date.now() - 60_000);
      const end = new Date(Date.now() + 3_600_000);
      await recordActivityItems(sql, id, 1, items);
      await recordActivitySkus(sql, id, items, 'spec');
      await loadActivity(redis, {
        id,
        generation: 1,
        startAt: start,
        endAt: end,
        requireOrderCode: false,
        reopenOnRelease: true,
        items,
      });
      await setGate(redis, id, 'open');
      let n = 0;
      const buy = async (user: string, skuId: string): Promise<boolean> => {
        n += 1;
        try {
          const r = await reserve(redis, {
            activityId: id,
            userId: user,
            skuId,
            quantity: 1,
            requestId: `q${n}`,
            traceId: 't',
          });
          const rec = await readReservation(redis, id, r.reservationId, r.scope);
          await insertOrders(sql, [orderMessageOf(id, rec!)], 900);
          return true;
        } catch (err) {
          const code = (err as { code?: string }).code;
          if (code === 'SOLD_OUT' || code === 'LIMIT_REACHED') return false;
          throw err;
        }
      };
      const first = Array.from({ length: 10 }, (_, i) => `${id}-a${i}`);
      for (const b of first) await buy(b, 'hot');
      await buy(`${id}-p0`, 'plain');
      // Healthy: not behind, pass after pass.
      for (let pass = 0; pass < 3; pass += 1) {
        await buy(`${id}-p${pass + 1}`, 'plain');
        expect((await checkCache(redis, sql, id, 0, 10)).kind).toBe('consistent');
      }

      const k = activityKeys(id);
      for (const node of primariesOf(redis)) {
        for (const pattern of [k.scanPattern, k.bucketScanPattern]) {
          for (const key of await node.keys(pattern)) await node.del(key);
        }
      }
      forgetBucketLayout(id);
      const check = await checkCache(redis, sql, id, 0, 10);
      expect(check.kind).toBe('CacheEmpty');
      const row = await beginRestore(sql, id, 'CacheEmpty', check.divergence);
      const t: RestoreTarget = {
        activityId: id,
        epoch: row.epoch,
        generation: 1,
        startMs: start.getTime(),
        endMs: end.getTime(),
        requireOrderCode: false,
        reopenOnRelease: true,
        ownerUid: 'uid-1',
        buckets: new Map([['hot', BUCKETS]]),
      };
      await holdForRestore(redis, t);
      const reload = await reloadFromPostgres(redis, sql, t);
      expect(await reloadFromPostgres(redis, sql, t)).toEqual(reload); // a repeat after a crash
      expect((await readStock(redis, id)).skus.map((s) => [s.skuId, s.initial, s.remaining])).toEqual([
        ['hot', 24, 14],
        ['plain', 6, 2],
      ]);
      await setGate(redis, id, 'open');
      expect((await checkCache(redis, sql, id, row.epoch, 10)).kind).toBe('consistent');

      // Demand above supply: the first buyers try twice more (limit 2), 30 new ones once.
      let sold = 0;
      for (const b of first) for (const _ of [0, 1]) if (await buy(b, 'hot')) sold += 1;
      for (let i = 0; i < 30; i += 1) if (await buy(`${id}-b${i}`, 'hot')) sold += 1;
      expect(sold).toBe(14);
      expect((await readStock(redis, id)).skus.find((s) => s.skuId === 'hot')?.remaining).toBe(0);
      const perBuyer = await sql.query<{ n: string }>(
        `SELECT max(q)::text AS n FROM (SELECT sum(quantity) AS q FROM orders
          WHERE activity_id = $1 AND status <> 'CLOSED' GROUP BY user_id, sku_id) x`,
        [id],
      );
      expect(Number(perBuyer.rows[0]!.n)).toBe(LIMIT);
      expect((await checkCache(redis, sql, id, row.epoch, 10)).kind).toBe('consistent');
    } finally {
      redis.disconnect();
      await sql.end();
    }
  });

  // RESERVE_ACK=replica on the cluster (core/durable-ack.ts ClusterReplicaAck): reservations spread
  // over buckets on every primary are each confirmed by their own node's replica (read back from
  // that replica), while the WAITs are shared per node; a replica count no node has is refused.
  test('the replica acknowledgement confirms each reservation on its node, sharing the WAITs', async () => {
    const id = uniqueId('cl-ack');
    const client = redisOf(servers);
    if (!isCluster(client)) throw new Error('not a cluster client');
    const redis: Cluster = client;
    registerScripts(redis);
    try {
      await loadOpenSale(
        redis,
        id,
        [{ skuId: 'hot', name: '茅台', price: '1499.00', stock: 1000, limitPerUser: 1, buckets: BUCKETS }],
        { reopenOnRelease: true },
      );
      await Promise.all(primariesOf(redis).map((n) => n.config('RESETSTAT')));
      const ack = new ClusterReplicaAck(redis, 1, 5_000);
      const N = 200;
      const reserved = await Promise.all(
        Array.from({ length: N }, async (_, i) => {
          const r = await reserve(redis, {
            activityId: id,
            userId: `${id}-u${i}`,
            skuId: 'hot',
            quantity: 1,
            requestId: 'r',
            traceId: 't',
          });
          await ack.confirm(id, r.reservationId, false, r.scope);
          return r;
        }),
      );
      // Each reservation is on the replica of the node that holds its bucket.
      const byAddress = new Map(redis.nodes('all').map((n) => [`${n.options.host}:${n.options.port}`, n]));
      let onReplicas = 0;
      for (const r of reserved) {
        const key = r.scope.reservation(r.reservationId);
        const replicaAddress = redis.slots[calculateSlot(key)]?.[1];
        const replica = replicaAddress ? byAddress.get(replicaAddress) : undefined;
        if (!replica) throw new Error(`no replica known for ${key}`);
        const [, state] = (await replica.pipeline().readonly().hget(key, 'state').exec()) ?? [];
        if (state?.[1] === 'RESERVED') onReplicas += 1;
      }
      expect(onReplicas).toBe(N);
      // Shared: far fewer WAITs than reservations (one per reservation before).
      let waits = 0;
      for (const n of primariesOf(redis)) {
        waits += Number(/^cmdstat_wait:calls=(\d+)/m.exec(await n.info('commandstats'))?.[1] ?? 0);
      }
      expect(waits).toBeGreaterThan(0);
      expect(waits).toBeLessThanOrEqual(N / 2);

      // Two replicas per reservation: no node has them.
      const r = await reserve(redis, {
        activityId: id,
        userId: `${id}-x`,
        skuId: 'hot',
        quantity: 1,
        requestId: 'r',
        traceId: 't',
      });
      await expect(
        new ClusterReplicaAck(redis, 2, 200).confirm(id, r.reservationId, false, r.scope),
      ).rejects.toMatchObject({
        code: 'NOT_REPLICATED',
        extra: { reservationId: r.reservationId },
      });
    } finally {
      redis.disconnect();
    }
  });
  // ClusterReplicaAck's node check: a reservation counts only the WAIT of the node that answered
  // its script. Here the client's slot map moves the scope to another primary while the
  // reservation's WAIT waits behind the one in flight (as ioredis' map moves after a failover);
  // the WAIT that follows must not be taken from the new node.
  test('a reservation whose node no longer serves its slot at the WAIT is NOT_REPLICATED', async () => {
    const id = uniqueId('cl-ackmv');
    const client = redisOf(servers);
    if (!isCluster(client)) throw new Error('not a cluster client');
    const redis: Cluster = client;
    const probe = activityKeys(id).ackProbe;
    const slot = calculateSlot(probe);
    const original = redis.slots[slot];
    let stopped: number | undefined;
    try {
      await redis.incr(probe);
      const { replicaAddress, other } = await waitFor(
        `slot ${slot}'s primary, its replica and another primary in the client's map`,
        async () => {
          // Replicas attach after the cluster answers: read the map again until they show.
          await new Promise<void>((resolve) => {
            redis.refreshSlotsCache(() => resolve());
          });
          const [p, r] = redis.slots[slot] ?? [];
          const o = primariesOf(redis)
            .map((n) => `${n.options.host}:${n.options.port}`)
            .find((a) => a !== p);
          return p && r && o ? { primary: p, replicaAddress: r, other: o } : undefined;
        },
        20_000,
      );
      const pid = await processIdOf(redis, replicaAddress);

      // The replica stops acknowledging: the first WAIT blocks on the scope's node.
      process.kill(pid, 'SIGSTOP');
      stopped = pid;
      const ack = new ClusterReplicaAck(redis, 1, 5_000);
      const outcome = (p: Promise<void>): Promise<string> =>
        p.then(
          () => 'confirmed',
          (err: unknown) => String((err as { code?: string }).code),
        );
      const first = outcome(ack.confirm(id, 'rid-1', false));
      await new Promise((r) => setTimeout(r, 300));
      // Joins the node's next batch, recorded on the node that served the slot.
      const second = outcome(ack.confirm(id, 'rid-2', false));
      // The client's map now names another primary for the slot.
      redis.slots[slot] = [other];
      process.kill(pid, 'SIGCONT');
      stopped = undefined;

      expect(await first).toBe('confirmed');
      expect(await second).toBe('NOT_REPLICATED');
    } finally {
      if (stopped !== undefined) process.kill(stopped, 'SIGCONT');
      if (original) redis.slots[slot] = original;
      redis.disconnect();
    }
  });
  // A transfer's units land in the recipient only once the donor's record is confirmed on a
  // replica of the node serving the donor's slot: with that replica stopped, neither the transfer
  // nor completeTransfers lands them (a failover would bring them back to the donor: twice), a
  // buyer who needs them is told to retry (503 UNAVAILABLE, not SOLD_OUT), and they land once it
  // acknowledges.
  test('a transfer whose donor record no replica confirmed stays in flight until one does', async () => {
    const id = uniqueId('cl-xfer');
    const items: CatalogItem[] = [
      { skuId: 'hot', name: '茅台', price: '1499.00', stock: 8, limitPerUser: 8, buckets: 2 },
    ];
    const redis = redisOf(servers);
    if (!isCluster(redis)) throw new Error('not a cluster client');
    registerScripts(redis);
    let stopped: number | undefined;
    try {
      await loadOpenSale(redis, id, items);
      const layout = await bucketLayout(redis, id, { refresh: true });
      const [b0, b1] = layout.bucketsOf('hot') as [BucketKeysOf, BucketKeysOf];
      const stock = async (b: BucketKeysOf) => Number(await redis.hget(b.sku('hot'), 'stock'));
      expect([await stock(b0), await stock(b1)]).toEqual([4, 4]);

      // The replica of bucket 0's node stops acknowledging.
      const slot = calculateSlot(b0.transfers);
      const replicaAddress = await waitFor(
        `slot ${slot}'s replica in the client's map`,
        async () => {
          await new Promise<void>((resolve) => {
            redis.refreshSlotsCache(() => resolve());
          });
          return redis.slots[slot]?.[1];
        },
        20_000,
      );
      const pid = await processIdOf(redis, replicaAddress);
      process.kill(pid, 'SIGSTOP');
      stopped = pid;

      const t = await transferStock(redis, b0, b1, 2);
      expect([t.moved, t.landed]).toEqual([2, false]);
      // The replica wait's probe write expires: it may land after the activity's cleanup.
      expect(await redis.ttl(b0.ackProbe)).toBeGreaterThan(0);
      expect([await stock(b0), await stock(b1)]).toEqual([2, 4]);
      expect(await completeTransfers(redis, layout, 'hot')).toEqual({ landed: 0, unconfirmed: 2 });
      expect(await stock(b1)).toBe(4);

      // Bucket 1's buyers empty it; the next one needs the 2 units in flight: retry, not SOLD_OUT.
      const home1 = Array.from({ length: 200 }, (_, i) => `x${i}`).filter(
        (u) => homeBucket(id, 'hot', u, 2) === 1,
      );
      const buy = (user: string, quantity: number) =>
        reserve(redis, {
          activityId: id,
          userId: user,
          skuId: 'hot',
          quantity,
          requestId: `r-${user}`,
          traceId: 't',
        });
      await buy(home1[0]!, 4);
      expect(await stock(b1)).toBe(0);
      // Bucket 0's 2 units move (unconfirmed as well): 4 units in flight, none safe to land.
      await expect(buy(home1[1]!, 3)).rejects.toMatchObject({ code: 'UNAVAILABLE' });

      process.kill(pid, 'SIGCONT');
      stopped = undefined;
      // Acknowledged: the units land and the buyer's retry is served.
      await waitFor(
        'the transfers land',
        async () => ((await completeTransfers(redis, layout, 'hot')).unconfirmed === 0 ? true : undefined),
        30_000,
      );
      const r = await buy(home1[1]!, 3);
      expect(r.reservationId).toBeDefined();
      const after = await readStock(redis, id);
      expect(after.skus.find((x) => x.skuId === 'hot')?.remaining).toBe(1);
    } finally {
      if (stopped !== undefined) process.kill(stopped, 'SIGCONT');
      redis.disconnect();
    }
  }, 120_000);
  // The activity's node (its claims and the buyers' windows) at its maxmemory, a bucket's node
  // not: a bucket reservation without its claim would let one requestId reserve in two scopes, so
  // the bucket only answers (reserve-9.lua ARGV[11] '2'): SOLD_OUT and a replay as usual, a
  // reservation refused as on any full Redis (503, nothing written anywhere); once the node takes
  // writes again, the retry reserves.
  test("with the activity's node at its maxmemory, a bucket on another node answers but never reserves unclaimed", async () => {
    const id = uniqueId('cl-full');
    const window = { requests: 5, perSeconds: 60 };
    const items: CatalogItem[] = [
      { skuId: 'hot', name: 'hot', price: '10.00', stock: 16, limitPerUser: 2, buckets: 8 },
      { skuId: 'few', name: 'few', price: '10.00', stock: 2, limitPerUser: 1, buckets: 2 },
    ];
    const redis = redisOf(servers, { maxRetriesPerRequest: 3 });
    if (!isCluster(redis)) throw new Error('not a cluster client');
    registerScripts(redis);
    /** The primary serving `key`'s slot. */
    const primaryOf = async (key: string) => {
      const slot = calculateSlot(key);
      const address = await waitFor(`slot ${slot}'s primary in the client's map`, async () => {
        await new Promise<void>((resolve) => {
          redis.refreshSlotsCache(() => resolve());
        });
        return redis.slots[slot]?.[0];
      });
      const node = redis.nodes('master').find((n) => `${n.options.host}:${n.options.port}` === address);
      if (!node) throw new Error(`no primary ${address}`);
      return { address, node };
    };
    /** `ok:<kind>`, the error's code, or `refused` (a Redis refusal: 503). */
    const buy = async (userId: string, skuId: string) => {
      try {
        const r = await reserve(redis, {
          activityId: id,
          userId,
          skuId,
          quantity: 1,
          requestId: `r-${skuId}`,
          traceId: 't',
          window,
        });
        return `ok:${r.kind}`;
      } catch (err) {
        if (err instanceof FlashSaleError) return err.code;
        if (dependencyOutage(err) === 'refused') return 'refused';
        throw err;
      }
    };
    const own = activityKeys(id);
    const { address: fullAddress, node: full } = await primaryOf(own.meta);
    try {
      await loadOpenSale(redis, id, items);
      const layout = await bucketLayout(redis, id, { refresh: true });
      // A bucket of 'hot' served by another primary than the activity's, and a buyer homed there.
      let elsewhere: BucketKeysOf | undefined;
      for (const b of layout.bucketsOf('hot')) {
        if ((await primaryOf(b.meta)).address !== fullAddress) elsewhere = b;
      }
      if (!elsewhere) throw new Error('every bucket on the activity node');
      const there = elsewhere;
      const buyer = Array.from({ length: 500 }, (_, i) => `u${i}`).find(
        (u) => homeBucket(id, 'hot', u, 8) === there.index,
      )!;
      expect(await buy('a', 'few')).toBe('ok:reserved');
      expect(await buy('b', 'few')).toBe('ok:reserved');
      const stockThere = await redis.hget(there.sku('hot'), 'stock');

      const policy = String(((await full.config('GET', 'maxmemory-policy')) as string[])[1]);
      await full.config('SET', 'maxmemory-policy', 'noeviction');
      await full.config('SET', 'maxmemory', '1');
      try {
        expect(await buy(buyer, 'hot')).toBe('refused');
        expect(await buy('c', 'few')).toBe('SOLD_OUT');
        expect(await buy('a', 'few')).toBe('ok:replayed');
        const rid = reservationIdFor(id, buyer, 'r-hot');
        expect([
          await redis.exists(there.reservation(rid)),
          await redis.exists(own.reservation(rid)),
        ]).toEqual([0, 0]);
        expect(await redis.hget(there.sku('hot'), 'stock')).toBe(stockThere);
        expect(await unitsLeft(redis, layout, 'hot')).toBe(16);
      } finally {
        await full.config('SET', 'maxmemory', '0');
        await full.config('SET', 'maxmemory-policy', policy);
      }
      expect(await buy(buyer, 'hot')).toBe('ok:reserved');
      expect(await redis.hget(own.reservation(reservationIdFor(id, buyer, 'r-hot')), 'state')).toBe(
        'ELSEWHERE',
      );
      expect(await unitsLeft(redis, layout, 'hot')).toBe(15);
    } finally {
      redis.disconnect();
    }
  }, 120_000);
});
