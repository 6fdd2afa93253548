// A Redis Cluster primary SIGKILLed mid-sale and its replica promoted, with a hot SKU in 8 stock
// buckets (over all three primaries) and an ordinary SKU: with RESERVE_ACK=replica the api answers
// 202 only for reservations a replica has (core/durable-ack.ts ClusterReplicaAck), so every 202 is
// exactly one order, nothing is oversold, and every unit is sold (demand exceeds supply; buckets
// emptied by the failover are refilled by transfers). The killed node comes back as a replica.
// Heavy (a private six-node cluster): it runs under `make faults` (FAULT_HEAVY=1) only.
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { readStock } from '../../../core/activity-cache.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import {
  Sale,
  answerLog,
  buyers,
  prepareActivity,
  recoverAndCheck,
  redisOf,
  sleep,
} from '../../faults/harness/sale.js';
import { privateRedisSale } from '../../faults/harness/private-sale.js';
import { restartRedisAsReplica } from '../../faults/harness/servers.js';
import { waitFor } from '../../../dev/roles.js';
import { uniqueId } from '../../../dev/servers.js';

const run = promisify(execFile);
const heavy = process.env.FAULT_HEAVY === '1';
const HOT = 64;
const PLAIN = 16;

(heavy ? describe : describe.skip)('window 18 (Redis part): a cluster primary SIGKILLed mid-sale', () => {
  const f = privateRedisSale('redis-cluster');

  test('0 oversold, every unit sold, every 202 exactly one order (RESERVE_ACK=replica)', async () => {
    const activityId = uniqueId('f-clfail');
    await prepareActivity(f.servers, activityId, [
      {
        skuId: 'hot',
        name: '茅台 飞天 53度 500ml',
        price: '1499.00',
        stock: HOT,
        limitPerUser: 1,
        buckets: 8,
      },
      { skuId: 'plain', name: '五常大米 5kg', price: '89.90', stock: PLAIN, limitPerUser: 1 },
    ]);
    f.sale = new Sale({
      servers: f.servers,
      activityId,
      env: { RESERVE_ACK: 'replica', RESERVE_ACK_TIMEOUT_MS: '500' },
    });
    const s = f.sale;
    await s.start();
    const seen = answerLog();
    const hotLoad = buyers(
      s,
      activityId,
      Array.from({ length: 160 }, (_, i) => `${activityId}-h${i}`),
      { skuId: 'hot', concurrency: 6, maxAttempts: 400, onAttempt: seen.onAttempt },
    );
    const plainLoad = buyers(
      s,
      activityId,
      Array.from({ length: 40 }, (_, i) => `${activityId}-p${i}`),
      { skuId: 'plain', concurrency: 2, maxAttempts: 400, onAttempt: seen.onAttempt },
    );

    const watcher = redisOf(f.servers, { maxRetriesPerRequest: 3 });
    try {
      await waitFor('a fifth of the hot stock reserved', async () => {
        const st = await readStock(watcher, activityId);
        return st.reserved >= HOT / 5;
      });
    } finally {
      watcher.disconnect();
    }
    // The first primary (slots 0-5460: the first buckets of the hot SKU) dies without a word.
    const ports = f.priv.env.REDIS_CLUSTER_PORTS!.split(',');
    process.kill(Number(readFileSync(join(f.priv.state, 'redis-cluster-1.pid'), 'utf8').trim()), 'SIGKILL');
    const cli = async (port: string, ...args: string[]): Promise<string> =>
      (await run('redis-cli', ['-p', port, ...args], { timeout: 5_000 })).stdout;
    // CLUSTER NODES flags of the killed node: 'fail' once the majority agrees, not 'fail?' (PFAIL,
    // one node's suspicion, before any failover). Restarting the node before its replica is
    // promoted brings it back as the primary and tests nothing.
    const nodesOf = async (port: string): Promise<{ addr: string; flags: string[]; slots: string[] }[]> =>
      (await cli(port, 'cluster', 'nodes'))
        .split('\n')
        .filter((l) => l.trim() !== '')
        .map((l) => {
          const f = l.trim().split(' ');
          return { addr: f[1] ?? '', flags: (f[2] ?? '').split(','), slots: f.slice(8) };
        });
    const killed = (addr: string): boolean => addr.startsWith(`127.0.0.1:${ports[0]!}@`);
    await waitFor(
      'the cluster to mark the killed primary failed',
      async () => (await nodesOf(ports[1]!)).some((n) => killed(n.addr) && n.flags.includes('fail')),
      60_000,
      200,
    );
    await waitFor(
      'a replica promoted in its place and the cluster serving every slot',
      async () =>
        (await nodesOf(ports[1]!)).some(
          (n) =>
            !killed(n.addr) &&
            n.flags.includes('master') &&
            !n.flags.includes('fail') &&
            n.slots.some((r) => /^0(-|$)/.test(r)),
        ) && /^cluster_state:ok/m.test(await cli(ports[1]!, 'cluster', 'info')),
      60_000,
      200,
    );
    await sleep(500);
    // The killed node restarts (as its pod would) and rejoins as a replica of its successor.
    await restartRedisAsReplica(f.priv.env.REDIS_CLUSTER_CONF_1!, ports[0]!);

    const answers = [...(await hotLoad), ...(await plainLoad)];
    const rec = await recoverAndCheck(f.servers, activityId, 180_000);
    await s.stop();
    f.sale = undefined;
    expect(rec.drained).toBe(true);
    expect(formatViolations(rec.violations)).toBe('');
    // While the slots were unserved (CLUSTERDOWN) and moved to the promoted replica, 503s only.
    expect(formatViolations(seen.violations())).toBe('');

    const accepted = answers.filter((a) => a.status === 202);
    const sql = new pg.Pool({ connectionString: f.db.url, max: 1 });
    try {
      const rows = (
        await sql.query<{ reservation_id: string; sku_id: string }>(
          `SELECT reservation_id, sku_id FROM orders WHERE activity_id = $1 AND status <> 'CLOSED'`,
          [activityId],
        )
      ).rows;
      const live = new Set(rows.map((r) => r.reservation_id));
      // Every 202 is a live order; nothing oversold; every unit sold.
      expect(accepted.filter((a) => !live.has(a.reservationId!))).toEqual([]);
      expect(rows.filter((r) => r.sku_id === 'hot')).toHaveLength(HOT);
      expect(rows.filter((r) => r.sku_id === 'plain')).toHaveLength(PLAIN);
    } finally {
      await sql.end();
    }
    // Above the steps' own deadlines (60 + 60 + 60 + 180 s), so an overrun fails with a named step.
  }, 420_000);
});
