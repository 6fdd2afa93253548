// SIGTERM while orders flow (runtime/main.ts, runtime/roles/process.ts): each role process stops in
// the documented order (stop taking HTTP, finish the relay's and the consumer's batches in flight,
// stop jobs, close pools and clients) and exits 0, and nothing is lost: every answered
// reservation becomes exactly one order once the roles run again, and a relay stopped this way
// leaves no entry pending in its stream (its batch in flight was acknowledged by Kafka and deleted).
// The SIGKILL counterpart is crash-windows.test.ts.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Redis } from 'ioredis';
import pg from 'pg';
import { readOutbox } from '../../../core/activity-cache.js';
import { activityKeys } from '../../../core/keys.js';
import { SHUTDOWN_STAGES } from '../../../runtime/roles/process.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import {
  httpClient,
  IgnoredSigterm,
  pool,
  ROOT,
  setUpActivity,
  startRole,
  tokenFor,
  waitFor,
} from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

const BUYERS = 600;
/** Submitted and answered before the first SIGTERM: the backlog the relay and consumer work on. */
const FIRST = 200;

/** The `closing` log lines of a stopped process, in the order they were written. */
function closings(p: RoleProcess): { stage: string; closer: string }[] {
  return p
    .output()
    .split('\n')
    .flatMap((line) => {
      try {
        const j = JSON.parse(line) as { msg?: string; message?: string; stage?: string; closer?: string };
        return (j.msg ?? j.message) === 'closing' ? [{ stage: j.stage!, closer: j.closer! }] : [];
      } catch {
        return [];
      }
    });
}

function expectStageOrder(p: RoleProcess, closers: string[]): void {
  const seen = closings(p);
  expect({ role: p.role, closers: seen.map((c) => c.closer) }).toEqual({ role: p.role, closers });
  const ranks = seen.map((c) => SHUTDOWN_STAGES.indexOf(c.stage as (typeof SHUTDOWN_STAGES)[number]));
  expect(ranks.every((r, i) => r >= 0 && (i === 0 || r >= ranks[i - 1]!))).toBe(true);
}

describe('graceful shutdown of the role processes', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let redis: Redis;
  const http = httpClient(16);
  const running: RoleProcess[] = [];

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
    redis = new Redis(testEnv().redisUrl);
  });

  afterAll(async () => {
    await Promise.all(running.map((r) => r.stop()));
    await http.close();
    await sql.end();
    redis.disconnect();
    await db.drop();
  });

  test('SIGTERM mid-sale: exit 0, closers in order, every answered reservation becomes one order', async () => {
    const activityId = uniqueId('sigterm');
    await setUpActivity(
      activityId,
      [{ skuId: 'tea', name: '安吉白茶 明前 250g', price: '128.00', stock: BUYERS, limitPerUser: 1 }],
      { databaseUrl: db.url },
    );
    const common = { activityId, databaseUrl: db.url };
    // Small batches so that several are in flight when SIGTERM arrives; info logs show the closers.
    const env = {
      LOG_LEVEL: 'info',
      RELAY_BATCH_SIZE: '5',
      RELAY_CONCURRENCY: '2',
      CONSUMER_BATCH_SIZE: '5',
      JOBS_IN_CONSUMER: 'false',
    };
    const start = async (role: string): Promise<RoleProcess> => {
      const p = await startRole(role, { ...common, env });
      running.push(p);
      return p;
    };
    const api = await start('api');
    const relay = await start('relay');
    const consumer = await start('consumer');

    const buyers = Array.from({ length: BUYERS }, (_, i) => `${activityId}-b${i}`);
    const tokens = new Map<string, string>();
    for (const b of buyers) tokens.set(b, await tokenFor(b));
    const accepted: string[] = [];
    const submit = (batch: string[]): Promise<void[]> =>
      pool(
        8,
        batch.map((b) => async () => {
          try {
            const r = await http.post(
              `${api.url}/v1/activities/${activityId}/orders`,
              { skuId: 'tea', quantity: 1, requestId: `req-${b}` },
              tokens.get(b),
            );
            if (r.status === 202) accepted.push(r.json.reservationId as string);
          } catch {
            // Refused once the api stopped taking connections: never answered, never counted.
          }
        }),
      );
    const orders = async (): Promise<string[]> =>
      (
        await sql.query<{ reservation_id: string }>(
          'SELECT reservation_id FROM orders WHERE activity_id = $1',
          [activityId],
        )
      ).rows.map((r) => r.reservation_id);

    // Mid-work: a backlog of FIRST reservations in the outbox and on Kafka (small batches), and
    // buyers still submitting while the relay and the consumer get SIGTERM.
    await submit(buyers.slice(0, FIRST));
    expect(accepted).toHaveLength(FIRST);
    const load = submit(buyers.slice(FIRST));
    expect(await Promise.all([relay.stop(), consumer.stop()])).toEqual([0, 0]);
    // The relay finished its batches in flight: nothing of its group is left pending.
    const k = activityKeys(activityId);
    const pending = (await redis.xpending(k.outbox, 'relay')) as [number, ...unknown[]];
    expect(pending[0]).toBe(0);

    await waitFor(
      'more answers after the relay and consumer stopped',
      async () => accepted.length >= FIRST + 50,
    );
    expect(await api.stop()).toBe(0);
    await load;

    expectStageOrder(api, [
      'service port',
      'metrics port',
      'admission control',
      'restock subscriber',
      'postgres pool',
      'redis',
    ]);
    expectStageOrder(relay, ['service port', 'metrics port', 'relay loops', 'outbox gauges', 'redis']);
    expectStageOrder(consumer, ['service port', 'metrics port', 'order consumer', 'postgres pool', 'redis']);

    // The roles run again: every reservation the script recorded becomes exactly one order.
    await start('relay');
    await start('consumer');
    const reserved = Number(await redis.hget(k.counters, 'reservations'));
    expect(reserved).toBeGreaterThanOrEqual(accepted.length);
    await waitFor('every reservation an order', async () => (await orders()).length === reserved, 120_000);
    const written = await orders();
    expect(new Set(written).size).toBe(written.length);
    expect(accepted.filter((rid) => !written.includes(rid))).toEqual([]);
    expect((await readOutbox(redis, activityId)).halfMessages).toBe(0);
  });
  test('a role that does not exit on SIGTERM is SIGKILLed after its grace, and stop() says which', async () => {
    const activityId = uniqueId('spin');
    await setUpActivity(
      activityId,
      [{ skuId: 'tea', name: '安吉白茶 明前 250g', price: '128.00', stock: 1, limitPerUser: 1 }],
      { databaseUrl: db.url },
    );
    const spinner = pathToFileURL(join(ROOT, 'test', 'fixtures', 'spin-on-sigterm.mjs')).href;
    const api = await startRole('api', {
      activityId,
      databaseUrl: db.url,
      env: { NODE_OPTIONS: `--import=${spinner}`, SHUTDOWN_TIMEOUT_MS: '1000' },
    });
    const began = Date.now();
    const err = await api.stop().then(
      (code) => new Error(`stop() resolved with exit code ${code}`),
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(IgnoredSigterm);
    // The grace is the role's own SHUTDOWN_TIMEOUT_MS plus the margin, and then it is gone.
    expect((err as IgnoredSigterm).graceMs).toBe(11_000);
    expect(Date.now() - began).toBeGreaterThanOrEqual(11_000);
    expect((err as IgnoredSigterm).message).toMatch(
      /^api \(pid \d+\) was still running 11000 ms after SIGTERM and was SIGKILLed/,
    );
    expect(api.proc.signalCode).toBe('SIGKILL');

    // The same role without the spinner exits 0 within that grace.
    const plain = await startRole('api', {
      activityId,
      databaseUrl: db.url,
      env: { SHUTDOWN_TIMEOUT_MS: '1000' },
    });
    expect(await plain.stop()).toBe(0);
  });
});
