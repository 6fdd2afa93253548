// A Redis primary that stalls instead of dying (SIGSTOP: the process is frozen, its kernel still
// accepts connections and takes in every command, nothing is answered), as a paused VM, a hung
// disk or a partition looks to a client. Sentinel (or the cluster) promotes the replica, but no
// client connection to the old primary breaks: a client that does not look for the new topology
// waits on it forever, and so does every buyer whose request reaches it.
//
// Each scenario makes the sale quiet first (every order in PostgreSQL, outbox and ledger empty,
// the replica at the primary's offset), so nothing acknowledged can be lost with the stalled node;
// then freezes the primary, waits for the promotion and sends a second wave of buyers while the old
// primary stays frozen. Expected: the second wave is answered and its orders reach PostgreSQL
// with the old primary still frozen; after it resumes (and rejoins as a replica) a last wave
// oversubscribes the stock and the invariants hold (every 202 exactly one live order, every unit
// sold, none oversold).
// Private servers (a Sentinel set, a six-node cluster): about a minute in the default suite.
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { formatViolations } from '../../faults/harness/invariants.js';
import { recordRun } from '../../faults/harness/results.js';
import { Sale, answerLog, buyers, prepareActivity, recoverAndCheck } from '../../faults/harness/sale.js';
import { privateRedisSale } from '../../faults/harness/private-sale.js';
import type { BuyerAnswer, Servers } from '../../faults/harness/sale.js';
import type { Violation } from '../../faults/harness/invariants.js';
import { waitFor } from '../../../dev/roles.js';
import { uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

const run = promisify(execFile);
/** How long the second wave may take with the old primary frozen (the promotion is a few seconds). */
const FROZEN_WAVE_DEADLINE_MS = 60_000;

async function cli(port: string, ...args: string[]): Promise<string> {
  return (await run('redis-cli', ['-p', port, ...args], { timeout: 5_000 })).stdout.trim();
}

/** Whether every replica of the primary on `port` has acknowledged its whole replication stream. */
async function replicasCaughtUp(port: string): Promise<boolean> {
  const info = await cli(port, 'info', 'replication');
  const offset = /^master_repl_offset:(\d+)/m.exec(info)?.[1];
  const replicas = [...info.matchAll(/^slave\d+:.*\boffset=(\d+)/gm)].map((m) => m[1]);
  return offset !== undefined && replicas.length > 0 && replicas.every((o) => o === offset);
}

/** The figures and checks every scenario shares, around its own freeze and promotion. */
async function stalledPrimarySale(o: {
  scenario: string;
  servers: Servers;
  db: FreshDatabase;
  primaryPort: string;
  primaryPid: () => number;
  /** Resolves once the topology names a new primary in place of the frozen one. */
  promoted: () => Promise<unknown>;
  /** Resolves once the resumed old primary is a replica. */
  rejoined: () => Promise<unknown>;
  items: { skuId: string; stock: number; buckets?: number; waves: [number, number, number] }[];
  onSale: (s: Sale) => void;
}): Promise<void> {
  const t0 = Date.now();
  const seconds = (ms: number): number => Math.round(ms / 100) / 10;
  const step = (what: string): void => console.log(`${o.scenario}: ${what} at ${seconds(Date.now() - t0)} s`);
  const activityId = uniqueId('f-stall');
  await prepareActivity(
    o.servers,
    activityId,
    o.items.map((i) => ({
      skuId: i.skuId,
      name: `${i.skuId} 500g`,
      price: '9.90',
      stock: i.stock,
      limitPerUser: 1,
      ...(i.buckets ? { buckets: i.buckets } : {}),
    })),
  );
  const sale = new Sale({ servers: o.servers, activityId, env: { RESERVE_ACK: 'local' } });
  o.onSale(sale);
  await sale.start();
  const sql = new pg.Pool({ connectionString: o.db.url, max: 1 });
  const load = new AbortController();
  const v: Violation[] = [];
  const seen = answerLog();
  let figures: Record<string, number | string> = {};
  let pid = 0;
  try {
    const liveOrders = async (): Promise<Set<string>> =>
      new Set(
        (
          await sql.query<{ reservation_id: string }>(
            `SELECT reservation_id FROM orders WHERE activity_id = $1 AND status <> 'CLOSED'`,
            [activityId],
          )
        ).rows.map((r) => r.reservation_id),
      );
    const wave = async (n: number): Promise<BuyerAnswer[]> =>
      (
        await Promise.all(
          o.items.map((i) =>
            buyers(
              sale,
              activityId,
              Array.from({ length: i.waves[n]! }, (_, k) => `${activityId}-${i.skuId}-w${n}-${k}`),
              {
                skuId: i.skuId,
                concurrency: 3,
                maxAttempts: 400,
                signal: load.signal,
                onAttempt: seen.onAttempt,
              },
            ),
          ),
        )
      ).flat();
    const ordered = async (answers: BuyerAnswer[], what: string): Promise<void> => {
      const want = answers.filter((a) => a.status === 202).map((a) => a.reservationId!);
      await waitFor(
        what,
        async () => {
          const live = await liveOrders();
          return want.every((r) => live.has(r));
        },
        60_000,
        200,
      );
    };

    const first = await wave(0);
    await ordered(first, 'the first wave in PostgreSQL');
    const quiet = await recoverAndCheck(o.servers, activityId, 60_000);
    if (!quiet.drained) throw new Error('the sale did not become quiet before the freeze');
    await waitFor('the replicas at the primary offset', () => replicasCaughtUp(o.primaryPort), 30_000, 100);
    step('first wave ordered, sale quiet');

    pid = o.primaryPid();
    process.kill(pid, 'SIGSTOP');
    const frozenAt = Date.now();
    step('primary frozen (SIGSTOP)');
    await o.promoted();
    const promotedAt = Date.now();
    step('replica promoted');

    // The second wave, with the old primary still frozen: bounded, so that a client that waits on
    // the frozen node fails the test with this step's name instead of hanging until the timeout.
    const second = await Promise.race([
      wave(1).then(async (answers) => {
        await ordered(answers, 'the second wave in PostgreSQL, the old primary still frozen');
        return answers;
      }),
      new Promise<never>((_, reject) =>
        setTimeout(
          () =>
            reject(
              new Error(
                `the second wave was not answered and ordered within ${FROZEN_WAVE_DEADLINE_MS / 1000} s ` +
                  'of the promotion while the old primary stayed frozen',
              ),
            ),
          FROZEN_WAVE_DEADLINE_MS,
        ).unref(),
      ),
    ]);
    const secondDoneAt = Date.now();
    step('second wave answered and ordered, old primary still frozen');

    process.kill(pid, 'SIGCONT');
    pid = 0;
    await o.rejoined();
    step('old primary resumed and rejoined as a replica');
    const last = await wave(2);
    step('last wave answered');
    const rec = await recoverAndCheck(o.servers, activityId, 120_000);
    v.push(...rec.violations);

    const answers = [...first, ...second, ...last];
    const accepted = answers.filter((a) => a.status === 202);
    const live = await sql.query<{ reservation_id: string; sku_id: string; n: string }>(
      `SELECT reservation_id, sku_id, count(*)::text AS n FROM orders
        WHERE activity_id = $1 AND status <> 'CLOSED' GROUP BY reservation_id, sku_id`,
      [activityId],
    );
    const byReservation = new Map(live.rows.map((r) => [r.reservation_id, r]));
    const lost = accepted.filter((a) => byReservation.get(a.reservationId!)?.n !== '1');
    if (lost.length > 0)
      v.push({ rule: 'missing-order', detail: `${lost.length} 202(s) without exactly one live order` });
    const undecided = answers.filter((a) => a.status === 0 || a.status >= 500);
    if (undecided.length > 0)
      v.push({ rule: 'missing-order', detail: `${undecided.length} buyer(s) never got a definitive answer` });
    // While the primary stalls a buyer gets 503 (a dependency outage), never 500.
    v.push(...seen.violations());
    for (const i of o.items) {
      const sold = live.rows.filter((r) => r.sku_id === i.skuId).length;
      if (sold !== i.stock)
        v.push({
          rule: 'stock-conservation',
          detail: `${i.skuId}: ${sold} live orders of a stock of ${i.stock}`,
        });
    }
    figures = {
      '202': accepted.length,
      'second wave 202': second.filter((a) => a.status === 202).length,
      'freeze to promotion s': seconds(promotedAt - frozenAt),
      'promotion to second wave ordered s': seconds(secondDoneAt - promotedAt),
      'answered 503 at least once': answers.filter((a) => a.attempts > 1).length,
      stock: o.items.reduce((n, i) => n + i.stock, 0),
      'live orders': live.rows.length,
    };
  } finally {
    if (pid) process.kill(pid, 'SIGCONT');
    load.abort();
    await sql.end();
    await sale.stop();
    const text = formatViolations(v);
    console.log(`${o.scenario} figures: ${JSON.stringify(figures)}`);
    recordRun({
      scenario: o.scenario,
      outcome: text === '' && Object.keys(figures).length > 0 ? 'pass' : 'fail',
      ms: Date.now() - t0,
      figures,
      ...(text ? { detail: text } : {}),
    });
  }
  expect(formatViolations(v)).toBe('');
}

describe('a stalled Redis primary (SIGSTOP) under Sentinel', () => {
  const f = privateRedisSale('redis-sentinel');

  test('the roles follow the promotion while the old primary stays frozen; nothing lost or oversold', async () => {
    const e = f.priv.env;
    const sentinelPort = String(f.servers.sentinel!.sentinels[0]!.port);
    const primaryNow = async (): Promise<string> =>
      await cli(sentinelPort, 'sentinel', 'get-master-addr-by-name', e.REDIS_SENTINEL_MASTER!);
    await stalledPrimarySale({
      scenario: 'stalled primary (Sentinel)',
      servers: f.servers,
      db: f.db,
      primaryPort: e.REDIS_SENTINEL_PRIMARY_PORT!,
      primaryPid: () => Number(readFileSync(join(f.priv.state, 'redis-sentinel-primary.pid'), 'utf8').trim()),
      promoted: () =>
        waitFor(
          'Sentinel to promote the replica',
          async () => (await primaryNow()).endsWith(e.REDIS_SENTINEL_REPLICA_PORT!),
          60_000,
          100,
        ),
      rejoined: () =>
        waitFor(
          'the old primary to rejoin as a replica',
          async () => /^role:slave/m.test(await cli(e.REDIS_SENTINEL_PRIMARY_PORT!, 'info', 'replication')),
          60_000,
          200,
        ),
      items: [{ skuId: 'rice', stock: 40, waves: [10, 10, 60] }],
      onSale: (s) => (f.sale = s),
    });
    f.sale = undefined;
  }, 420_000);
});

describe('a stalled Redis Cluster primary (SIGSTOP)', () => {
  const f = privateRedisSale('redis-cluster');

  test('the roles follow the promotion while the old primary stays frozen; nothing lost or oversold', async () => {
    const ports = f.priv.env.REDIS_CLUSTER_PORTS!.split(',');
    const frozen = ports[0]!;
    // The frozen primary's successor: a node other than it that now serves slot 0.
    const servesSlot0 = async (port: string): Promise<boolean> => {
      const nodes = await cli(port, 'cluster', 'nodes');
      return nodes
        .split('\n')
        .map((l) => l.trim().split(' '))
        .some(
          (f) =>
            !(f[1] ?? '').startsWith(`127.0.0.1:${frozen}@`) &&
            (f[2] ?? '').split(',').includes('master') &&
            !(f[2] ?? '').includes('fail') &&
            f.slice(8).some((r) => /^0(-|$)/.test(r)),
        );
    };
    await stalledPrimarySale({
      scenario: 'stalled primary (Redis Cluster)',
      servers: f.servers,
      db: f.db,
      primaryPort: frozen,
      // The first primary (slots 0-5460): some of the hot SKU's buckets and the buyers homed there.
      primaryPid: () => Number(readFileSync(join(f.priv.state, 'redis-cluster-1.pid'), 'utf8').trim()),
      promoted: () =>
        waitFor(
          'a replica promoted in place of the frozen primary, the cluster serving every slot',
          async () =>
            (await servesSlot0(ports[1]!)) &&
            /^cluster_state:ok/m.test(await cli(ports[1]!, 'cluster', 'info')),
          60_000,
          200,
        ),
      rejoined: () =>
        waitFor(
          'the old primary to rejoin as a replica',
          async () => /^role:slave/m.test(await cli(frozen, 'info', 'replication')),
          60_000,
          200,
        ),
      items: [
        { skuId: 'hot', stock: 64, buckets: 8, waves: [16, 16, 100] },
        { skuId: 'plain', stock: 16, waves: [4, 4, 24] },
      ],
      onSale: (s) => (f.sale = s),
    });
    f.sale = undefined;
  }, 420_000);
});
