// Fault window 13 with RESERVE_ACK=replica under Sentinel (docs/faults.md): the Redis primary's
// machine is lost mid-sale under load (SIGKILL, its data files removed) and the node restarts
// empty. The api answered 202 only for reservations the replica had (core/durable-ack.ts), so:
//
// - failover first (the node stays down longer than Sentinel's down-after-milliseconds, as a
//   lost machine does): Sentinel promotes the replica, the empty node rejoins as its replica, the
//   operator's restore step (operator/reconcile/restore-cache.ts, run pass after pass throughout,
//   as the reconciler would) finds the cache consistent; 0 oversold, every 202 is exactly one
//   order, 0 of them read FAILED.
// - restart first (the empty node answers again before down-after-milliseconds): Sentinel never
//   sees it down, the replica resynchronises from the empty primary and drops everything, whatever
//   the ack mode. The restore step restores from PostgreSQL; 0 oversold, and the acknowledged
//   reservations still in the outbox read FAILED (the case docs/install.md's Redis settings rule out).
//
// Heavy (its own primary, replica and three Sentinels from test/env/start-redis-sentinel.sh): it
// runs under `make faults` (FAULT_HEAVY=1) only.
import { DEFAULT_TRAFFIC_POLICY } from '../../../core/traffic-policy.js';
import { execFile } from 'node:child_process';
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { readStock } from '../../../core/activity-cache.js';
import { recordActivitySkus } from '../../../core/db/activity-skus-store.js';
import { openRestore, restoresOf } from '../../../core/db/cache-restores-store.js';
import { createPool } from '../../../core/db/pool.js';
import type { Pool } from '../../../core/db/pool.js';
import { activityKeys } from '../../../core/keys.js';
import { createLogger } from '../../../core/logger.js';
import { createOperatorMetrics } from '../../../core/metrics.js';
import { parseSentinels } from '../../../core/redis.js';
import type { RedisClient } from '../../../core/scripts.js';
import { registerScripts } from '../../../core/scripts.js';
import type { EffectiveSchedule } from '../../../operator/api/v1alpha1/funcs.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import type { FlashSaleActivity } from '../../../operator/api/v1alpha1/types.js';
import type { OperatorConfig } from '../../../operator/config.js';
import { ReconcileContext } from '../../../operator/reconcile/context.js';
import type { ReconcileDeps } from '../../../operator/reconcile/context.js';
import { KafkaAdminAccess } from '../../../operator/reconcile/kafka-access.js';
import { restoreCache } from '../../../operator/reconcile/restore-cache.js';
import { formatViolations } from '../../faults/harness/invariants.js';
import type { Violation } from '../../faults/harness/invariants.js';
import { recordRun } from '../../faults/harness/results.js';
import { Sale, answerLog, buyers, prepareActivity, redisOf, sleep } from '../../faults/harness/sale.js';
import type { Servers } from '../../faults/harness/sale.js';
import { startPrivateServers, stopPrivateServers } from '../../faults/harness/servers.js';
import type { PrivateServers } from '../../faults/harness/servers.js';
import { httpClient, tokenFor, waitFor } from '../../../dev/roles.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

const run = promisify(execFile);
const heavy = process.env.FAULT_HEAVY === '1';
const STOCK = 60;
const BUYERS = 150;

async function redisCli(port: string, ...args: string[]): Promise<string> {
  return (await run('redis-cli', ['-p', port, ...args])).stdout.trim();
}

type Order = 'failover first' | 'restart first';

/** The last lines of each Sentinel's log and of the restarted node's, for a failed wait. */
function sentinelLogTails(state: string, nodeDir: string): string {
  const tail = (path: string): string => {
    try {
      return readFileSync(path, 'utf8').trimEnd().split('\n').slice(-15).join('\n');
    } catch (err) {
      return `(unreadable: ${(err as Error).message})`;
    }
  };
  const base = join(state, 'redis-sentinel');
  const sentinels = readdirSync(base).filter((d) => /^s\d+$/.test(d));
  return [
    ...sentinels.map((d) => `--- ${d}/sentinel.log\n${tail(join(base, d, 'sentinel.log'))}`),
    `--- restarted node's redis.log\n${tail(join(nodeDir, 'redis.log'))}`,
  ].join('\n');
}

(heavy ? describe : describe.skip)(
  'window 13 with RESERVE_ACK=replica: the primary machine lost mid-sale',
  () => {
    let priv: PrivateServers | undefined;
    let db: FreshDatabase | undefined;
    let pool: Pool | undefined;
    let sale: Sale | undefined;
    let kafka: KafkaAdminAccess | undefined;
    let redis: RedisClient | undefined;
    let reconciling = false;

    afterEach(async () => {
      reconciling = false;
      await sale?.stop();
      sale = undefined;
      await kafka?.close();
      kafka = undefined;
      redis?.disconnect();
      redis = undefined;
      await pool?.end();
      pool = undefined;
      await db?.drop();
      db = undefined;
      if (priv) await stopPrivateServers(priv);
      priv = undefined;
    }, 180_000);

    async function window13(order: Order): Promise<Record<string, number | string>> {
      priv = await startPrivateServers(['redis-sentinel']);
      db = await freshDatabase();
      const e = priv.env;
      const servers: Servers = {
        databaseUrl: db.url,
        redisUrl: `redis://127.0.0.1:${e.REDIS_SENTINEL_PRIMARY_PORT!}`,
        kafkaBrokers: testEnv().kafkaBrokers,
        sentinel: {
          sentinels: parseSentinels(e.REDIS_SENTINELS!.split(',')),
          sentinelMaster: e.REDIS_SENTINEL_MASTER!,
        },
      };
      const p = createPool(db.url, 4, 'restore-replica-test');
      pool = p;
      const activityId = uniqueId('f-restore-rep');
      const item = {
        skuId: 'rice',
        name: '五常大米 稻花香 5kg',
        price: '89.90',
        stock: STOCK,
        limitPerUser: 1,
      };
      await prepareActivity(servers, activityId, [item]);
      // As the operator does before loading the cache: PostgreSQL's copy of the stock.
      await recordActivitySkus(p, activityId, [item], 'spec');
      sale = new Sale({
        servers,
        activityId,
        env: { RESERVE_ACK: 'replica', RESERVE_ACK_TIMEOUT_MS: '500', RELAY_CONCURRENCY: '1' },
      });
      const s = sale;
      await s.start();

      // The operator's restore step, as in restore.test.ts: a fresh context from the recorded status
      // each pass, its Redis client through Sentinel like the operator's (core/redis.ts).
      const r = redisOf(servers, { maxRetriesPerRequest: 3 });
      redis = r;
      registerScripts(r);
      const k = activityKeys(activityId);
      const log = createLogger('restore-replica-test', 'silent');
      const events: string[] = [];
      kafka = new KafkaAdminAccess({
        brokers: servers.kafkaBrokers,
        clientId: `restore-rep-${activityId}`,
        topicPrefix: 'flashsale',
        partitions: 2,
        replicationFactor: 1,
      });
      const metrics = createOperatorMetrics();
      const deps = {
        redis: r,
        pool: p,
        kafka,
        identity: 'restore-replica-test',
        now: () => new Date(),
        log,
        config: {
          drainCheckMs: 200,
          restoreSettleMs: 2000,
          trafficPolicy: DEFAULT_TRAFFIC_POLICY,
        } as OperatorConfig,
        metrics,
        events: {
          record: async (_f: FlashSaleActivity, type: string, reason: string) => {
            events.push(`${type} ${reason}`);
          },
        },
      } as unknown as ReconcileDeps;
      const t0 = new Date();
      const fsa = {
        apiVersion: 'flashsale.io/v1alpha1',
        kind: 'FlashSaleActivity',
        metadata: { name: activityId, namespace: 'default', generation: 1, uid: activityId },
        spec: { paused: false, requireOrderCode: false, reopenOnRelease: true },
        status: {
          conditions: enterPhase(undefined, Phase.Active, 'test', 1, t0),
          cache: { loadedGeneration: 1 },
        },
      } as unknown as FlashSaleActivity;
      const schedule = {
        warmUpAt: new Date(t0.getTime() - 60_000),
        startAt: new Date(t0.getTime() - 1000),
        endAt: new Date(t0.getTime() + 3_600_000),
      } as EffectiveSchedule;
      const violations: Violation[] = [];
      let passErrors = 0;
      const pass = async (): Promise<void> => {
        const ctx = new ReconcileContext(deps, structuredClone(fsa), activityId, schedule, log);
        ctx.ownsActivityId = true;
        try {
          await restoreCache(ctx);
        } catch {
          // Redis unreachable during the failover: the reconciler retries the pass.
          passErrors += 1;
          return;
        }
        fsa.status = ctx.status;
        const open = await openRestore(p, activityId);
        const gate = await r.hget(k.meta, 'gate').catch(() => null);
        if (open && open.step !== 'reloaded' && gate !== null && gate !== 'paused') {
          violations.push({
            rule: 'stock-conservation',
            detail: `gate ${gate} while restore ${open.epoch} is at step ${open.step} (before the reload)`,
          });
        }
      };
      await pass();
      expect(events).toEqual([]);

      // The operator keeps reconciling through the whole fault, as it would.
      reconciling = true;
      const operatorLoop = (async () => {
        while (reconciling) {
          await pass();
          await sleep(300);
        }
      })();

      // The relay stalls (stopped, not dead) before the load: the acknowledged reservations wait in
      // the outbox, which is in Redis only, when the machine is lost.
      const relay = s.current.get('relay')!.proc;
      relay.kill('SIGSTOP');
      const ids = Array.from({ length: BUYERS }, (_, i) => `${activityId}-b${i}`);
      const seen = answerLog();
      const load = buyers(s, activityId, ids, {
        skuId: 'rice',
        concurrency: 6,
        maxAttempts: 400,
        onAttempt: seen.onAttempt,
      });
      const primaryPort = e.REDIS_SENTINEL_PRIMARY_PORT!;
      const sentinelPort = String(servers.sentinel!.sentinels[0]!.port);
      const masterPort = async (port = sentinelPort): Promise<string> =>
        (await redisCli(port, 'sentinel', 'get-master-addr-by-name', e.REDIS_SENTINEL_MASTER!)).split(
          '\n',
        )[1] ?? '';
      let outboxAtLoss = 0;
      try {
        await waitFor(
          'a fifth of the stock reserved',
          async () => (await readStock(r, activityId)).reserved >= STOCK / 5,
          60_000,
          50,
        );
        outboxAtLoss = await r.xlen(k.outbox);
        if (order === 'restart first') {
          // A down-after-milliseconds longer than the restart takes (a node restarted in place at once):
          // made certain here, not left to the machine's speed.
          for (const sentinel of servers.sentinel!.sentinels)
            await redisCli(
              String(sentinel.port),
              'sentinel',
              'set',
              e.REDIS_SENTINEL_MASTER!,
              'down-after-milliseconds',
              '30000',
            );
        }
        // The machine loss: SIGKILL, the data files gone (AOF directory, RDB), the config kept
        // (it is the pod's ConfigMap).
        const conf = e.REDIS_SENTINEL_PRIMARY_CONF!;
        process.kill(
          Number(readFileSync(join(priv.state, 'redis-sentinel-primary.pid'), 'utf8').trim()),
          'SIGKILL',
        );
        const dir = dirname(conf);
        await waitFor('the primary to die', async () => {
          try {
            await redisCli(primaryPort, 'ping');
            return false;
          } catch {
            return true;
          }
        });
        for (const f of readdirSync(dir))
          if (f !== 'redis.conf' && f !== 'redis.log') rmSync(join(dir, f), { recursive: true, force: true });
        if (order === 'failover first') {
          // Every Sentinel, not only the first to hear of it: a lost machine comes back minutes
          // later, when they all agree. A node restarted while one of them still names it is an
          // empty primary to a client asking that Sentinel (one make faults run on 2026-12-06: the
          // operator found the cache empty and restored, although the promoted replica kept all).
          await waitFor(
            'every Sentinel to name the promoted replica',
            async () => {
              const named = await Promise.all(
                servers.sentinel!.sentinels.map((x) => masterPort(String(x.port)).catch(() => '')),
              );
              return named.every((port) => port === e.REDIS_SENTINEL_REPLICA_PORT!);
            },
            60_000,
            100,
          );
        }
        // The node restarts empty (as its pod would, on a new machine).
        await run('redis-server', [conf]);
        if (order === 'failover first') {
          await waitFor(
            'the empty node to rejoin as a replica',
            async () => /master_link_status:up/.test(await redisCli(primaryPort, 'info', 'replication')),
            60_000,
            200,
          ).catch((err: unknown) => {
            // Sentinel reconfigures the node, not the product: its logs say why it did not.
            throw new Error(`${(err as Error).message}\n${sentinelLogTails(priv!.state, dir)}`);
          });
        }
      } finally {
        relay.kill('SIGCONT');
      }
      const answers = await load;
      // The activity is in the cache again before the drain is judged: kept by the replica, or
      // reloaded by the operator's restore. On an emptied cache the outbox and the ledger are empty
      // at once, so the waits below would pass before the operator had a chance to notice the loss
      // (a load that finished before the loss left it exactly that way).
      await waitFor(
        'the activity loaded in the cache (kept, or reloaded by a restore)',
        async () => Boolean(await r.hget(k.meta, 'gen').catch(() => null)),
        180_000,
        300,
      );
      // Everything acknowledged becomes an order (or a status) before the last passes.
      await waitFor(
        'every reservation an order',
        async () => {
          const [len, ledger] = await Promise.all([r.xlen(k.outbox), r.zcard(k.ledger)]);
          return len === 0 && ledger === 0;
        },
        180_000,
        300,
      );
      await waitFor(
        'no restore open',
        async () => (await openRestore(p, activityId)) === undefined,
        120_000,
        300,
      );
      reconciling = false;
      await operatorLoop;
      const finalMaster = await masterPort();

      const accepted = answers.filter((a) => a.status === 202);
      const undecided = answers.filter((a) => a.status === 0 || a.status >= 500);
      if (undecided.length > 0)
        violations.push({ rule: 'missing-order', detail: `${undecided.length} buyer(s) never answered` });
      violations.push(...seen.violations());
      const perRsv = await p.query<{ reservation_id: string; n: string; live: string }>(
        `SELECT reservation_id, count(*)::text AS n, count(*) FILTER (WHERE status <> 'CLOSED')::text AS live
         FROM orders WHERE activity_id = $1 GROUP BY reservation_id`,
        [activityId],
      );
      const orders = new Map(perRsv.rows.map((x) => [x.reservation_id, x]));
      const dup = perRsv.rows.filter((x) => Number(x.n) > 1);
      if (dup.length > 0)
        violations.push({
          rule: 'missing-order',
          detail: `${dup.length} reservation(s) with several orders`,
        });
      const live = await p.query<{ q: string; prevented: string }>(
        `SELECT coalesce(sum(quantity) FILTER (WHERE status <> 'CLOSED'), 0)::text AS q,
              count(*) FILTER (WHERE close_reason IN ('OVERSELL_PREVENTED', 'BUYER_LIMIT_EXCEEDED'))::text AS prevented
         FROM orders WHERE activity_id = $1`,
        [activityId],
      );
      const sold = Number(live.rows[0]!.q);
      if (sold > STOCK)
        violations.push({ rule: 'stock-conservation', detail: `${sold} live units of ${STOCK}` });
      const stock = await readStock(r, activityId);
      if (stock.remaining + sold !== STOCK) {
        violations.push({
          rule: 'stock-conservation',
          detail: `Redis remaining ${stock.remaining} + PostgreSQL live ${sold} != ${STOCK}`,
        });
      }
      // Every 202: exactly one live order, or a FAILED/CLOSED status its buyer reads from the api.
      let withOrder = 0;
      let failedReads = 0;
      const http = httpClient(4);
      try {
        for (const a of accepted) {
          if (orders.get(a.reservationId!)?.live === '1') {
            withOrder += 1;
            continue;
          }
          const view = await http.get(
            `${s.url('api')}/v1/activities/${activityId}/orders/${a.reservationId!}`,
            await tokenFor(a.buyer),
          );
          if (view.status === 200 && (view.json.status === 'FAILED' || view.json.status === 'CLOSED')) {
            failedReads += 1;
          } else {
            violations.push({
              rule: 'missing-order',
              detail: `202 for ${a.reservationId!}: no live order and the buyer reads ${view.status} ${JSON.stringify(view.json)}`,
            });
          }
        }
      } finally {
        await http.close();
      }
      await s.stop();
      sale = undefined;
      const restores = await restoresOf(p, activityId);
      const figures: Record<string, number | string> = {
        '202': accepted.length,
        'with one live order': withOrder,
        '202 read as FAILED': failedReads,
        oversold: Math.max(0, sold - STOCK),
        'live units': sold,
        stock: STOCK,
        'outbox at the loss': outboxAtLoss,
        restores: restores.map((x) => `${x.reason}:${x.step}`).join(' ') || 'none',
        'guard closed': Number(live.rows[0]!.prevented),
        'primary after': finalMaster === primaryPort ? 'restarted node' : 'promoted replica',
        'operator passes failed (Redis down)': passErrors,
      };
      const text = formatViolations(violations);
      const scenario = `window 13 (RESERVE_ACK=replica, Sentinel, ${order})`;
      console.log(`${scenario} figures: ${JSON.stringify(figures)} events: ${JSON.stringify(events)}`);
      recordRun({
        scenario,
        outcome: text === '' ? 'pass' : 'fail',
        ms: Date.now() - t0.getTime(),
        figures,
        ...(text ? { detail: text } : {}),
      });
      expect(text).toBe('');
      return { ...figures, failedReads, withOrder, accepted: accepted.length, finalMaster, primaryPort };
    }

    test('failover before the restart: nothing acknowledged lost, 0 of the 202s read FAILED', async () => {
      const f = await window13('failover first');
      expect(f.finalMaster).not.toBe(f.primaryPort);
      expect(f.restores).toBe('none');
      expect({ failed: f.failedReads, withOrder: f.withOrder }).toEqual({ failed: 0, withOrder: f.accepted });
      expect(f.accepted).toBe(STOCK); // oversubscribed: the whole stock, once
    }, 600_000);

    test('restart before the failover: the empty node stays primary and the replica drops everything', async () => {
      const f = await window13('restart first');
      // Sentinel never saw the node down: it is still the primary, now empty, and its replica
      // resynchronised from it. The operator restored the cache from PostgreSQL.
      expect(f.finalMaster).toBe(f.primaryPort);
      expect(f.restores).toBe('CacheEmpty:resumed');
      // The acknowledged reservations the relay had not sent are lost despite WAIT: their buyers read FAILED.
      expect(f.failedReads).toBeGreaterThan(0);
    }, 600_000);
  },
);
