// A Redis changed under a running sale the way maintenance changes it, on private servers
// (test/env/start-redis-*.sh; each change is for good):
// - a Redis Cluster resharded: the slot that holds an activity's keys, and a stock bucket's, moves
//   to another primary, as `redis-cli --cluster reshard` (or adding a primary) moves it. While a
//   slot migrates, Redis answers a script whose keys are split between the two nodes, or partly
//   missing, with TRYAGAIN, and ioredis retries it for 16 × 100 ms only: a migration that takes
//   longer (a big sale's slot holds many keys) must be a 503 with Retry-After for the buyer, never
//   a 500, and the sale must sell exactly its stock on the new node;
// - the planned failover of a rolling Redis upgrade, in a cluster (CLUSTER FAILOVER on the replica
//   of the sale's primary) and under Sentinel (SENTINEL FAILOVER), with RESERVE_ACK=replica (their
//   default): a moment of 503s, never a 500, and every 202 exactly one order.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import pg from 'pg';
import calculateSlot from 'cluster-key-slot';
import { activityKeys, BucketKeys } from '../../../core/keys.js';
import { readStock } from '../../../core/activity-cache.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import {
  Sale,
  answersToOrders,
  buyers,
  prepareActivity,
  recoverAndCheck,
  redisOf,
  sleep,
} from '../../faults/harness/sale.js';
import { privateRedisSale } from '../../faults/harness/private-sale.js';
import type { PrivateSale } from '../../faults/harness/private-sale.js';
import type { BuyerAnswer } from '../../faults/harness/sale.js';
import { uniqueId } from '../../../dev/servers.js';
import { waitFor } from '../../../dev/roles.js';

const HOT_STOCK = 60;
const BUCKETED_STOCK = 45;
const BUCKETS = 3;
/** How long a slot's migration is held half-way: well past ioredis' 16 × 100 ms of retries. */
const HOLD_MS = 3_000;

interface ClusterNode {
  id: string;
  host: string;
  port: number;
  primary: boolean;
  /** A replica's primary ('-' for a primary). */
  primaryId: string;
  slots: string[];
}

/** CLUSTER NODES as seen by one node. */
async function clusterNodes(redis: Redis): Promise<ClusterNode[]> {
  const text = (await redis.call('CLUSTER', 'NODES')) as string;
  return text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => {
      const f = l.trim().split(' ');
      const addr = (f[1] ?? '').split('@')[0]!;
      const [host, port] = addr.split(':');
      return {
        id: f[0]!,
        host: host!,
        port: Number(port),
        primary: (f[2] ?? '').split(',').includes('master'),
        primaryId: f[3] ?? '-',
        slots: f.slice(8),
      };
    });
}

function servesSlot(node: ClusterNode, slot: number): boolean {
  return node.slots.some((r) => {
    if (r.startsWith('[')) return false;
    const [lo, hi] = r.split('-').map(Number);
    return slot >= lo! && slot <= (hi ?? lo)!;
  });
}

/**
 * Moves `slot` from its primary to another one as `redis-cli --cluster reshard` does (IMPORTING on
 * the target, MIGRATING on the source, MIGRATE key by key, then the slot assigned to the target on
 * every primary), holding the migration half-way for `holdMs` as a slot with many keys would.
 */
async function moveSlot(
  seed: Redis,
  slot: number,
  holdMs: number,
): Promise<{ from: number; to: number; keys: number }> {
  const nodes = await clusterNodes(seed);
  const primaries = nodes.filter((n) => n.primary);
  const source = primaries.find((n) => servesSlot(n, slot));
  const target = primaries.find((n) => n !== source);
  if (!source || !target) throw new Error(`no owner or no other primary for slot ${slot}`);
  const open = (n: ClusterNode): Redis => new Redis({ host: n.host, port: n.port, lazyConnect: false });
  const src = open(source);
  const dst = open(target);
  try {
    await dst.call('CLUSTER', 'SETSLOT', String(slot), 'IMPORTING', source.id);
    await src.call('CLUSTER', 'SETSLOT', String(slot), 'MIGRATING', target.id);
    const total = Number(await src.call('CLUSTER', 'COUNTKEYSINSLOT', String(slot)));
    let moved = 0;
    for (;;) {
      const keys = (await src.call('CLUSTER', 'GETKEYSINSLOT', String(slot), '1')) as string[];
      if (keys.length === 0) break;
      await src.call('MIGRATE', target.host, String(target.port), '', '0', '5000', 'KEYS', ...keys);
      moved += keys.length;
      if (moved === Math.ceil(total / 2)) await sleep(holdMs);
    }
    for (const n of [target, source, ...primaries.filter((p) => p !== source && p !== target)]) {
      const c = n === source ? src : n === target ? dst : open(n);
      try {
        await c.call('CLUSTER', 'SETSLOT', String(slot), 'NODE', target.id);
      } finally {
        if (c !== src && c !== dst) c.disconnect();
      }
    }
    return { from: source.port, to: target.port, keys: moved };
  } finally {
    src.disconnect();
    dst.disconnect();
  }
}

describe('Redis Cluster: the slot of a sale resharded mid-sale', () => {
  const f = privateRedisSale('redis-cluster');

  test('503 while a slot moves, never 500; every unit of a plain and a bucketed SKU sold, exactly once', async () => {
    const { activityId, attempts, loads } = await saleUnderLoad(f, 'cl-resh', 'local');
    // The activity's slot (the plain SKU, every buyer's window and claim) and one bucket's slot.
    const activitySlot = calculateSlot(activityKeys(activityId).policy);
    const bucketSlot = calculateSlot(new BucketKeys(activityId, 'bkt', 1, BUCKETS).sku('bkt'));
    const seedAddr = f.servers.cluster![0]!;
    const seed = new Redis({ host: seedAddr.host, port: seedAddr.port });
    const moves: { slot: number; from: number; to: number; keys: number }[] = [];
    try {
      await waitFor('the first reservations', async () => attempts.some((a) => a.status === 202), 30_000, 20);
      moves.push({ slot: bucketSlot, ...(await moveSlot(seed, bucketSlot, HOLD_MS)) });
      moves.push({ slot: activitySlot, ...(await moveSlot(seed, activitySlot, HOLD_MS)) });
      // The cluster serves both slots, keys and all, from their new primaries.
      const nodes = await clusterNodes(seed);
      for (const m of moves) {
        expect(m.keys).toBeGreaterThan(0);
        expect(nodes.filter((n) => servesSlot(n, m.slot)).map((n) => n.port)).toEqual([m.to]);
      }
    } finally {
      seed.disconnect();
    }
    const answers = await Promise.all(loads);
    // While a slot moved, its scripts were refused (TRYAGAIN) past ioredis' retries: 503s, no 500.
    expect(Object.keys(countBy(attempts)).sort()).toEqual(['202', '409 SOLD_OUT', '503 UNAVAILABLE']);
    await expectEveryUnitSold(f, activityId, answers);
    expect503sLoggedOnceASecond(f.sale!, attempts);
  }, 240_000);

  test("a planned failover of the sale's primary (CLUSTER FAILOVER), RESERVE_ACK=replica: 503 for a moment, never 500; every 202 one order", async () => {
    const { activityId, attempts, loads } = await saleUnderLoad(f, 'cl-plfo', 'replica');
    const slot = calculateSlot(activityKeys(activityId).policy);
    const seedAddr = f.servers.cluster![0]!;
    const seed = new Redis({ host: seedAddr.host, port: seedAddr.port });
    try {
      await waitFor('the first reservations', async () => attempts.some((a) => a.status === 202), 30_000, 20);
      const nodes = await clusterNodes(seed);
      const primary = nodes.find((n) => n.primary && servesSlot(n, slot))!;
      const replica = nodes.find((n) => n.primaryId === primary.id)!;
      const r = new Redis({ host: replica.host, port: replica.port });
      try {
        // As a Redis upgrade does it: the replica catches up, the primary stops writes, they swap.
        await r.call('CLUSTER', 'FAILOVER');
      } finally {
        r.disconnect();
      }
      await waitFor(
        "the replica promoted to the sale's slot",
        async () =>
          (await clusterNodes(seed)).some((n) => n.id === replica.id && n.primary && servesSlot(n, slot)),
        30_000,
        100,
      );
    } finally {
      seed.disconnect();
    }
    await expectSoldThroughFailover(f, activityId, attempts, loads);
  }, 240_000);
});

describe('Sentinel: a planned failover of the primary mid-sale', () => {
  const f = privateRedisSale('redis-sentinel');

  test('SENTINEL FAILOVER, RESERVE_ACK=replica: 503 for a moment, never 500; every 202 one order', async () => {
    const { activityId, attempts, loads } = await saleUnderLoad(f, 'sn-plfo', 'replica');
    const e = f.priv.env;
    const sentinel = f.servers.sentinel!.sentinels[0]!;
    const s = new Redis({ host: sentinel.host, port: sentinel.port });
    const primaryPort = async (): Promise<string> =>
      ((await s.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', e.REDIS_SENTINEL_MASTER!)) as string[])[1]!;
    try {
      await waitFor('the first reservations', async () => attempts.some((a) => a.status === 202), 30_000, 20);
      expect(await primaryPort()).toBe(e.REDIS_SENTINEL_PRIMARY_PORT);
      await s.call('SENTINEL', 'FAILOVER', e.REDIS_SENTINEL_MASTER!);
      await waitFor(
        'Sentinel to promote the replica',
        async () => (await primaryPort()) === e.REDIS_SENTINEL_REPLICA_PORT,
        30_000,
        100,
      );
    } finally {
      s.disconnect();
    }
    await expectSoldThroughFailover(f, activityId, attempts, loads);
  }, 240_000);
});

/**
 * A sale of a plain SKU and a SKU in stock buckets, each with 150 buyers (limit 1) arriving over a
 * few seconds and retrying every 5xx with the same requestId; every answer is kept.
 */
async function saleUnderLoad(
  f: PrivateSale,
  prefix: string,
  ack: 'local' | 'replica',
): Promise<{ activityId: string; attempts: BuyerAnswer[]; loads: Promise<BuyerAnswer[]>[] }> {
  // The block's previous test's sale, done with.
  await f.sale?.stop();
  f.sale = undefined;
  const activityId = uniqueId(prefix);
  await prepareActivity(f.servers, activityId, [
    { skuId: 'hot', name: '茅台 飞天 53度 500ml', price: '1499.00', stock: HOT_STOCK, limitPerUser: 1 },
    {
      skuId: 'bkt',
      name: '五常大米 5kg',
      price: '89.90',
      stock: BUCKETED_STOCK,
      limitPerUser: 1,
      buckets: BUCKETS,
    },
  ]);
  const sale = new Sale({
    servers: f.servers,
    activityId,
    env: { RESERVE_ACK: ack, ...(ack === 'replica' ? { RESERVE_ACK_TIMEOUT_MS: '500' } : {}) },
  });
  f.sale = sale;
  await sale.start();
  const attempts: BuyerAnswer[] = [];
  const loads = ['hot', 'bkt'].map((skuId) =>
    buyers(
      sale,
      activityId,
      Array.from({ length: 150 }, (_, i) => `${activityId}-${skuId}-${i}`),
      { skuId, concurrency: 3, pauseMs: 100, onAttempt: (a) => attempts.push(a) },
    ),
  );
  return { activityId, attempts, loads };
}

/**
 * Both SKUs sold out exactly (demand exceeds supply): every buyer answered for good, every 202
 * exactly one order, the pipeline drained with every invariant, and no unit left in any bucket.
 */
async function expectEveryUnitSold(
  f: PrivateSale,
  activityId: string,
  [hot, bkt]: BuyerAnswer[][],
): Promise<void> {
  expect(hot!.filter((a) => a.status === 202)).toHaveLength(HOT_STOCK);
  expect(bkt!.filter((a) => a.status === 202)).toHaveLength(BUCKETED_STOCK);
  const rec = await recoverAndCheck(f.servers, activityId);
  expect(rec.drained).toBe(true);
  expect(formatViolations(rec.violations)).toBe('');
  const sql = new pg.Pool({ connectionString: f.db.url, max: 1 });
  try {
    expect(formatViolations((await answersToOrders(sql, activityId, [...hot!, ...bkt!])).violations)).toBe(
      '',
    );
  } finally {
    await sql.end();
  }
  const redis = redisOf(f.servers);
  try {
    const stock = await readStock(redis, activityId);
    expect(stock.skus.map((s) => [s.skuId, s.remaining]).sort()).toEqual([
      ['bkt', 0],
      ['hot', 0],
    ]);
  } finally {
    redis.disconnect();
  }
}

/**
 * A failover's answers: `202`, `409 SOLD_OUT` or a `503` a buyer retries (`UNAVAILABLE`, or
 * `NOT_REPLICATED` until the new primary has a replica), never `500`; then every unit sold, each
 * 503 in the log.
 */
async function expectSoldThroughFailover(
  f: PrivateSale,
  activityId: string,
  attempts: BuyerAnswer[],
  loads: Promise<BuyerAnswer[]>[],
): Promise<void> {
  const answers = await Promise.all(loads);
  const allowed = ['202', '409 SOLD_OUT', '503 UNAVAILABLE', '503 NOT_REPLICATED'];
  expect(Object.keys(countBy(attempts)).filter((k) => !allowed.includes(k))).toEqual([]);
  await expectEveryUnitSold(f, activityId, answers);
  expect503sLoggedOnceASecond(f.sale!, attempts);
}

/**
 * Every 503 a buyer got is in the api's log, once a second at most: each line stands for itself
 * and the ones it left out (`unloggedSinceLast`), so their counts add up to the 503 answers, and
 * no line of a kind follows another within the second (runtime/api/problem.ts outageLog).
 */
function expect503sLoggedOnceASecond(sale: Sale, attempts: BuyerAnswer[]): void {
  const lines = readFileSync(join(sale.logDir, 'api.log'), 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { msg?: string; time: number; code?: string; unloggedSinceLast?: number })
    .filter((l) => l.msg === 'a dependency is unavailable' || l.msg === 'a request was answered 503; retry');
  const counted = lines.reduce((n, l) => n + 1 + (l.unloggedSinceLast ?? 0), 0);
  expect(counted).toBe(attempts.filter((a) => a.status === 503).length);
  const kinds = new Map<string, number[]>();
  for (const l of lines)
    kinds.set(`${l.msg} ${l.code ?? ''}`, [...(kinds.get(`${l.msg} ${l.code ?? ''}`) ?? []), l.time]);
  for (const times of kinds.values()) {
    for (let i = 1; i < times.length; i += 1) expect(times[i]! - times[i - 1]!).toBeGreaterThanOrEqual(990);
  }
}

function countBy(answers: BuyerAnswer[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const a of answers) {
    const k = `${a.status} ${a.code ?? ''}`.trim();
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}
