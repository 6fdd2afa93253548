// A Redis that answers but refuses: out of memory under `noeviction` (OOM), a primary demoted to a
// replica with no Sentinel to move the clients (READONLY), writes stopped after a failed save
// (MISCONF: here its data directory removed under it). Redis refuses a script only before its
// first write, so nothing of the submission was written: the api must answer 503 UNAVAILABLE (a
// retry with the same requestId is safe), not 500 INTERNAL, log the refusals at most once a second
// rather than once per buyer, and reserve the retry once Redis takes writes again. A private Redis
// (test/env/start-redis.sh), never the shared one.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { request } from 'undici';
import { readStock } from '../../../core/activity-cache.js';
import { activityKeys } from '../../../core/keys.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { setUpActivity, startRole, tokenFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import { startPrivateRedis } from '../../fixtures/private-redis.js';
import type { PrivateRedis } from '../../fixtures/private-redis.js';

const TIMEOUT_MS = 180_000;
/** Buyers refused at once per refusal: enough that a log line per request would show. */
const BURST = 200;

interface Refusal {
  name: string;
  /** The start of Redis' reply that the api must have met. */
  reply: RegExp;
  refuse: (admin: Redis) => Promise<void>;
  mend: (admin: Redis) => Promise<void>;
}

const refusals: Refusal[] = [
  {
    name: 'out of memory under noeviction',
    reply: /^OOM command not allowed/,
    refuse: async (admin) => {
      await admin.config('SET', 'maxmemory-policy', 'noeviction');
      await admin.config('SET', 'maxmemory', '1');
    },
    mend: async (admin) => {
      await admin.config('SET', 'maxmemory', '0');
    },
  },
  {
    name: 'a primary demoted to a replica (no Sentinel to move the clients)',
    reply: /^READONLY You can't write against a read only replica/,
    // A primary that cannot be reached: this node keeps its data and serves reads, refuses writes.
    refuse: async (admin) => {
      await admin.call('REPLICAOF', '127.0.0.1', '9');
    },
    mend: async (admin) => {
      await admin.call('REPLICAOF', 'NO', 'ONE');
    },
  },
  {
    name: 'writes stopped after a failed save (its data directory removed)',
    reply: /^MISCONF /,
    refuse: async (admin) => {
      const [, dir] = (await admin.config('GET', 'dir')) as [string, string];
      await admin.config('SET', 'save', '3600 1');
      rmSync(path.resolve(dir), { recursive: true, force: true });
      await admin.bgsave();
      for (let i = 0; i < 100; i += 1) {
        if (/rdb_last_bgsave_status:err/.test(await admin.info('persistence'))) return;
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error('the save did not fail');
    },
    // What an operator does once the disk is back: the next save will tell.
    mend: async (admin) => {
      await admin.config('SET', 'save', '');
    },
  },
];

describe('the api with a Redis that refuses writes', () => {
  const activityId = uniqueId('refuse');
  let privateRedis: PrivateRedis | undefined;
  let admin: Redis;
  let db: FreshDatabase;
  let api: RoleProcess | undefined;
  const logDir = mkdtempSync(path.join(tmpdir(), 'flashsale-refusing-redis-'));
  const logFile = path.join(logDir, 'api.log');

  beforeAll(async () => {
    privateRedis = startPrivateRedis('refusing-redis');
    db = await freshDatabase();
    admin = new Redis(privateRedis.url);
    await setUpActivity(
      activityId,
      [{ skuId: 'rice', name: '五常大米 5kg', price: '59.90', stock: 50, limitPerUser: 1 }],
      { redisUrl: privateRedis.url },
    );
    api = await startRole('api', {
      activityId,
      databaseUrl: db.url,
      env: { REDIS_URL: privateRedis.url },
      logFile,
    });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.stop();
    admin?.disconnect();
    await db?.drop();
    privateRedis?.stop();
    rmSync(logDir, { recursive: true, force: true });
  }, TIMEOUT_MS);

  const submit = async (
    buyer: string,
  ): Promise<{ status: number; retryAfter: unknown; json: Record<string, unknown> }> => {
    const r = await request(`${api!.url}/v1/activities/${activityId}/orders`, {
      method: 'POST',
      headers: { authorization: `Bearer ${await tokenFor(buyer)}`, 'content-type': 'application/json' },
      body: JSON.stringify({ skuId: 'rice', quantity: 1, requestId: `req-${buyer}` }),
    });
    return {
      status: r.statusCode,
      retryAfter: r.headers['retry-after'],
      json: (await r.body.json()) as Record<string, unknown>,
    };
  };
  const remaining = async (): Promise<number | undefined> =>
    (await readStock(admin, activityId)).skus.find((s) => s.skuId === 'rice')?.remaining;
  /** The api's log lines about an unavailable dependency, from its whole log. */
  const outageLines = (): Record<string, unknown>[] =>
    readFileSync(logFile, 'utf8')
      .split('\n')
      .filter((l) => l.includes('a dependency is unavailable'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);

  test(
    'each refusal gets buyers 503 UNAVAILABLE with nothing written, one log line a second, and the retry reserves once',
    async () => {
      expect((await submit('first')).status).toBe(202);
      let expected = 49;
      for (const [k, refusal] of refusals.entries()) {
        // Past the last logged line's second: each refusal's first failure is logged.
        await new Promise((r) => setTimeout(r, 1100));
        await refusal.refuse(admin);
        const linesBefore = outageLines().length;
        const buyers = Array.from({ length: BURST }, (_, i) => `r${k}-${i}`);
        const started = Date.now();
        let answers: Awaited<ReturnType<typeof submit>>[];
        try {
          answers = await Promise.all(buyers.map((b) => submit(b)));
        } finally {
          await refusal.mend(admin);
        }
        const burstMs = Date.now() - started;
        expect({ refusal: refusal.name, statuses: [...new Set(answers.map((a) => a.status))] }).toEqual({
          refusal: refusal.name,
          statuses: [503],
        });
        expect(answers[0]!.json).toMatchObject({ code: 'UNAVAILABLE', status: 503 });
        // Told when to come back, so the buyers' clients do not all retry at once into the outage.
        expect(answers[0]!.retryAfter).toBe('1');
        // Nothing written: the stock and the buyers' slots as before.
        expect(await remaining()).toBe(expected);
        expect(await admin.exists(...buyers.map((b) => activityKeys(activityId).buyer(b)))).toBe(0);
        // One line a second at most, naming the refusal; not one per buyer.
        // The api's output reaches the file a moment after its answers.
        // Every failure is counted: a line stands for itself and the ones it left out, the last of
        // them written as its second ends, without waiting for a next failure.
        const counted = (ls: Record<string, unknown>[]): number =>
          ls.reduce((n, l) => n + 1 + Number(l.unloggedSinceLast), 0);
        let lines = outageLines().slice(linesBefore);
        for (let i = 0; i < 50 && counted(lines) < BURST; i += 1) {
          await new Promise((r) => setTimeout(r, 100));
          lines = outageLines().slice(linesBefore);
        }
        expect([refusal.name, counted(lines)]).toEqual([refusal.name, BURST]);
        expect(lines.length).toBeLessThanOrEqual(Math.ceil(burstMs / 1000) + 1);
        expect(lines[0]).toMatchObject({
          outage: 'refused',
          err: { message: expect.stringMatching(refusal.reply) },
        });

        // Redis takes writes again: a buyer's retry with the same requestId reserves once.
        const retried = await submit(buyers[0]!);
        expect([refusal.name, retried.status]).toEqual([refusal.name, 202]);
        const again = await submit(buyers[0]!);
        expect([again.status, again.json.reservationId]).toEqual([202, retried.json.reservationId]);
        expected -= 1;
        expect(await remaining()).toBe(expected);
        expect(await admin.hget(activityKeys(activityId).buyer(buyers[0]!), 'rice:qty')).toBe('1');
      }
    },
    TIMEOUT_MS,
  );
});
