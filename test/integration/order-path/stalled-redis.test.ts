// A single Redis (no Sentinel, no replica to promote) that stalls: SIGSTOP freezes the process, its
// kernel still accepts connections and takes in every command, nothing is answered: a paused VM,
// a hung disk or a partition as a client sees it (a private Redis from test/env/start-redis.sh,
// never the shared one). The api must answer its buyers 503 UNAVAILABLE once a command has waited
// REDIS_COMMAND_TIMEOUT_MS, not hold them for as long as the stall; and once Redis runs again, a
// buyer's retry with the same requestId gets its reservation exactly once (the frozen Redis may
// have made it when it woke: then the retry replays it).
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
/** Longer than the command timeout the api is given, far shorter than a stall may last. */
const NO_ANSWER_MS = 15_000;

describe('the api with its Redis stalled', () => {
  const activityId = uniqueId('stall');
  let privateRedis: PrivateRedis | undefined;
  let redisPid = 0;
  let redisUrl = '';
  let db: FreshDatabase;
  let api: RoleProcess | undefined;

  beforeAll(async () => {
    privateRedis = startPrivateRedis('stalled-redis');
    redisUrl = privateRedis.url;
    redisPid = privateRedis.pid;
    db = await freshDatabase();
    await setUpActivity(
      activityId,
      [{ skuId: 'rice', name: '五常大米 5kg', price: '59.90', stock: 5, limitPerUser: 1 }],
      { redisUrl },
    );
    api = await startRole('api', {
      activityId,
      databaseUrl: db.url,
      env: { REDIS_URL: redisUrl, REDIS_COMMAND_TIMEOUT_MS: '2000' },
    });
  }, TIMEOUT_MS);

  afterAll(async () => {
    if (redisPid) process.kill(redisPid, 'SIGCONT');
    await api?.stop();
    await db?.drop();
    privateRedis?.stop();
  }, TIMEOUT_MS);

  /** One submission; a request with no answer within NO_ANSWER_MS fails the test by saying so. */
  const submit = async (
    buyer: string,
  ): Promise<{ status: number; contentType: string; retryAfter: unknown; json: Record<string, unknown> }> => {
    const r = await request(`${api!.url}/v1/activities/${activityId}/orders`, {
      method: 'POST',
      headers: { authorization: `Bearer ${await tokenFor(buyer)}`, 'content-type': 'application/json' },
      body: JSON.stringify({ skuId: 'rice', quantity: 1, requestId: `req-${buyer}` }),
      headersTimeout: NO_ANSWER_MS,
    }).catch((err: unknown) => {
      throw new Error(`no answer to ${buyer}'s submission within ${NO_ANSWER_MS} ms: ${String(err)}`);
    });
    return {
      status: r.statusCode,
      contentType: String(r.headers['content-type'] ?? ''),
      retryAfter: r.headers['retry-after'],
      json: (await r.body.json()) as Record<string, unknown>,
    };
  };

  test(
    'a stalled Redis gets buyers 503 UNAVAILABLE, not a hang; after it wakes a retry reserves once',
    async () => {
      expect((await submit('b1')).status).toBe(202);

      process.kill(redisPid, 'SIGSTOP');
      let stalled: Awaited<ReturnType<typeof submit>>;
      try {
        stalled = await submit('b2');
      } finally {
        process.kill(redisPid, 'SIGCONT');
      }
      expect(stalled.status).toBe(503);
      expect(stalled.contentType).toMatch(/^application\/problem\+json/);
      expect(stalled.json).toMatchObject({ code: 'UNAVAILABLE', status: 503 });
      expect(stalled.retryAfter).toBe('1');
      // Unanswered is not refused: the stalled Redis ran the script when it woke (ioredis had
      // sent it). The buyer is told so, with the reservation's id to poll, never "nothing was done".
      expect(stalled.json.detail).toMatch(/may have been made; retry with the same requestId/);
      expect(typeof stalled.json.reservationId).toBe('string');

      // Redis runs again: the same submission is answered 202 with that reservation, reserved once.
      const retried = await submit('b2');
      expect(retried.status).toBe(202);
      expect([retried.json.reservationId, retried.json.replayed]).toEqual([stalled.json.reservationId, true]);
      const again = await submit('b2');
      expect([again.status, again.json.reservationId]).toEqual([202, retried.json.reservationId]);
      const redis = new Redis(redisUrl);
      try {
        const stock = await readStock(redis, activityId);
        expect(stock.skus.map((s) => [s.skuId, s.remaining])).toEqual([['rice', 3]]);
        expect(await redis.hget(activityKeys(activityId).buyer('b2'), 'rice:qty')).toBe('1');
      } finally {
        redis.disconnect();
      }
    },
    TIMEOUT_MS,
  );
});
