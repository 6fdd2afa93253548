// An oversubscribed sale on a Redis Cluster (three primaries, one replica each; started by
// test/env/start-redis-cluster.sh, or the one REDIS_CLUSTER_NODES names) with one hot SKU split
// into 8 stock buckets and an ordinary SKU, through the real api, relay and consumer processes.
// The hot SKU's buyers are chosen so that no buyer is homed in bucket 0: its units can only be
// sold through transfers between buckets, so a phantom sold-out (units left in a bucket nobody
// reaches) leaves stock behind and fails the test (mutant test/faults/mutants/bucket-no-transfer).
import { cleanupActivity, readStock, setGate } from '../../../core/activity-cache.js';
import { createPool } from '../../../core/db/pool.js';
import { createLogger } from '../../../core/logger.js';
import { auditStock } from '../../../runtime/jobs/stock-audit.js';
import { activityKeys, homeBucket } from '../../../core/keys.js';
import { parseSentinels, primariesOf } from '../../../core/redis.js';
import type { SentinelAddress } from '../../../core/redis.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import { Sale, prepareActivity, recoverAndCheck, redisOf } from '../../faults/harness/sale.js';
import type { Servers } from '../../faults/harness/sale.js';
import { startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { httpClient, tokenFor } from '../../../dev/roles.js';
import pg from 'pg';

const HOT_STOCK = 96;
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
    servers = {
      databaseUrl: db.url,
      redisUrl: `redis://${nodes[0]!.host}:${nodes[0]!.port}`,
      kafkaBrokers: testEnv().kafkaBrokers,
      cluster: nodes,
    };
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
});
