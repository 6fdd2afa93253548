// A Redis Cluster resharded mid-sale: the slot that holds an activity's keys moves to another
// primary while buyers reserve, the way `redis-cli --cluster reshard` (or an operator adding a
// primary) moves it. While a slot migrates, Redis answers a script whose keys are split between
// the two nodes, or partly missing, with TRYAGAIN, and ioredis retries it for 16 × 100 ms only:
// a migration that takes longer (a big sale's slot holds many keys) must be a 503 with
// Retry-After for the buyer, never a 500, and the sale must sell exactly its stock on the new node.
// A private cluster (test/env/start-redis-cluster.sh): moving a slot changes the cluster for good.
import { Redis } from 'ioredis';
import calculateSlot from 'cluster-key-slot';
import { activityKeys, BucketKeys } from '../../../core/keys.js';
import { readStock } from '../../../core/activity-cache.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import { Sale, buyers, prepareActivity, recoverAndCheck, redisOf, sleep } from '../../faults/harness/sale.js';
import { privateRedisSale } from '../../faults/harness/private-redis.js';
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
    const activityId = uniqueId('cl-resh');
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
    f.sale = new Sale({ servers: f.servers, activityId, env: { RESERVE_ACK: 'local' } });
    await f.sale.start();
    // The activity's slot (the plain SKU, every buyer's window and claim) and one bucket's slot.
    const activitySlot = calculateSlot(activityKeys(activityId).policy);
    const bucketSlot = calculateSlot(new BucketKeys(activityId, 'bkt', 1, BUCKETS).sku('bkt'));
    const seedAddr = f.servers.cluster![0]!;
    const seed = new Redis({ host: seedAddr.host, port: seedAddr.port });

    const attempts: BuyerAnswer[] = [];
    const load = (skuId: string): Promise<BuyerAnswer[]> =>
      buyers(
        f.sale!,
        activityId,
        Array.from({ length: 150 }, (_, i) => `${activityId}-${skuId}-${i}`),
        { skuId, concurrency: 3, pauseMs: 100, onAttempt: (a) => attempts.push(a) },
      );
    const loads = [load('hot'), load('bkt')];
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
    const [hot, bkt] = await Promise.all(loads);
    const seen = countBy(attempts);
    // While a slot moved, its scripts were refused (TRYAGAIN) past ioredis' retries: 503s, no 500.
    expect(Object.keys(seen).sort()).toEqual(['202', '409 SOLD_OUT', '503 UNAVAILABLE']);
    expect(hot!.filter((a) => a.status === 202)).toHaveLength(HOT_STOCK);
    expect(bkt!.filter((a) => a.status === 202)).toHaveLength(BUCKETED_STOCK);
    expect([...hot!, ...bkt!].filter((a) => a.status !== 202 && a.status !== 409)).toEqual([]);

    const rec = await recoverAndCheck(f.servers, activityId);
    expect(rec.drained).toBe(true);
    expect(formatViolations(rec.violations)).toBe('');
    const redis = redisOf(f.servers);
    try {
      // Every unit sold, in every bucket: none stranded by the move.
      const stock = await readStock(redis, activityId);
      expect(stock.skus.map((s) => [s.skuId, s.remaining]).sort()).toEqual([
        ['bkt', 0],
        ['hot', 0],
      ]);
    } finally {
      redis.disconnect();
    }
  }, 240_000);
});

function countBy(answers: BuyerAnswer[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const a of answers) {
    const k = `${a.status} ${a.code ?? ''}`.trim();
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}
