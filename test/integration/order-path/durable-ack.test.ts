// Durable acknowledgement (RESERVE_ACK=replica): the api answers 202 only once Redis WAIT confirms
// the reservation on the replicas. Against the suite's Redis, which has no replica, the wait times
// out: the decided answer is 503 NOT_REPLICATED with the reservation id, the reservation stays on
// the primary (the buyer's poll shows it QUEUED), and a retry with the same requestId replays it
// and waits again (here satisfied by a configuration that needs 0 replicas).
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { ReplicaAck } from '../../../core/durable-ack.js';
import type { ReservationAck } from '../../../core/durable-ack.js';
import { loadActivity, setGate } from '../../../core/activity-cache.js';
import { registeredBuyers } from '../../../core/db/registrations-store.js';
import { ACK_PROBE_TTL_SECONDS, activityKeys } from '../../../core/keys.js';
import { uniqueId } from '../../../dev/servers.js';
import { DEFAULT_TRAFFIC_POLICY, writeTrafficPolicy } from '../../../core/traffic-policy.js';
import { readReservation } from '../../../core/reservations.js';
import { createApiApp } from '../../../runtime/api/app.js';
import { SoldOutFlags } from '../../../runtime/api/sold-out.js';
import {
  JWT_SECRET,
  TIMEOUT_MS,
  buyerCall,
  openActivity,
  setUp,
  type Api,
  type Fixture,
} from '../after-sale/fixture.js';

describe('durable acknowledgement of reservations (Redis WAIT)', () => {
  let f: Fixture;
  const apis: Api[] = [];

  beforeAll(async () => {
    f = await setUp();
  }, TIMEOUT_MS);

  afterAll(async () => {
    for (const a of apis) await a.close();
    await f?.close();
  }, TIMEOUT_MS);

  const apiWith = async (reservationAck: ReservationAck): Promise<Api> => {
    const app = await createApiApp({
      metrics: f.metrics,
      ready: async () => true,
      redis: f.redis,
      pool: f.pool,
      soldOut: new SoldOutFlags(0),
      activityId: undefined,
      orderCodeTtlSeconds: 30,
      auth: { JWT_HS256_SECRET: JWT_SECRET },
      bodyLimit: '8kb',
      logger: f.logger,
      reservationAck,
    });
    const server: Server = await new Promise((resolve) => {
      const s = app.listen(0, '127.0.0.1', () => resolve(s));
    });
    const { port } = server.address() as AddressInfo;
    const api: Api = {
      url: `http://127.0.0.1:${port}`,
      close: () =>
        new Promise<void>((resolve) => {
          server.close(() => resolve());
          server.closeAllConnections();
        }),
    };
    apis.push(api);
    return api;
  };

  it(
    'no replica confirms: 503 NOT_REPLICATED with the reservation id, no 202; a retry replays and waits again',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: 3 });
      const strict = await apiWith(new ReplicaAck(f.redis, 1, 100));
      const body = { skuId, quantity: 1, requestId: 'req-durable-1' };
      const path = `/v1/activities/${activityId}/orders`;

      const first = await buyerCall(strict, 'POST', path, 'durable-buyer', body);
      expect(first.status).toBe(503);
      expect(first.body).toMatchObject({ code: 'NOT_REPLICATED' });
      const rid = first.body.reservationId as string;
      expect(typeof rid).toBe('string');
      // The reservation exists on the primary: the buyer's poll shows it, and it holds its stock.
      expect((await readReservation(f.redis, activityId, rid))?.state).toBe('RESERVED');
      const poll = await buyerCall(strict, 'GET', `${path}/${rid}`, 'durable-buyer');
      expect(poll.status).toBe(200);
      expect(poll.body).toMatchObject({ status: 'QUEUED' });

      // Still no replica: the retry is a replay, and it is refused the same way (never a 202).
      const again = await buyerCall(strict, 'POST', path, 'durable-buyer', body);
      expect(again).toMatchObject({ status: 503, body: { code: 'NOT_REPLICATED', reservationId: rid } });
      // The replay wrote the probe before its wait, with a lifetime: a wait under way while the
      // activity is cleaned up must not leave a key behind for ever.
      const probeTtl = await f.redis.ttl(activityKeys(activityId).ackProbe);
      expect(probeTtl).toBeGreaterThan(0);
      expect(probeTtl).toBeLessThanOrEqual(ACK_PROBE_TTL_SECONDS);

      // Once the wait is satisfied the same requestId gets its 202, for the same reservation.
      const satisfied = await apiWith(new ReplicaAck(f.redis, 0, 100));
      const ok = await buyerCall(satisfied, 'POST', path, 'durable-buyer', body);
      expect(ok.status).toBe(202);
      expect(ok.body).toMatchObject({ reservationId: rid, status: 'QUEUED', replayed: true });
      const counted = (await f.metrics.reservations.get()).values.find(
        (v) => v.labels.activity === activityId && v.labels.result === 'not_replicated',
      );
      expect(counted?.value).toBe(2);
    },
    TIMEOUT_MS,
  );

  it(
    'a registration is answered only once a replica has its flags: 503 NOT_REPLICATED, then registered on a repeat',
    async () => {
      const activityId = uniqueId('regack');
      const now = Date.now();
      await loadActivity(f.redis, {
        id: activityId,
        generation: 1,
        startAt: new Date(now + 3_600_000),
        endAt: new Date(now + 7_200_000),
        requireOrderCode: false,
        reopenOnRelease: false,
        items: [{ skuId: 'tea', name: '茶', price: '5.00', stock: 5, limitPerUser: 1 }],
      });
      await setGate(f.redis, activityId, 'pending');
      await writeTrafficPolicy(f.redis, activityId, {
        ...DEFAULT_TRAFFIC_POLICY,
        eligibility: { ...DEFAULT_TRAFFIC_POLICY.eligibility, preRegistration: true },
      });
      const path = `/v1/activities/${activityId}/registrations`;

      // No replica confirms the flags: not "registered" (a failover could lose them, and nobody can
      // register after the start), but recorded in PostgreSQL already.
      const strict = await apiWith(new ReplicaAck(f.redis, 1, 100));
      const first = await buyerCall(strict, 'POST', path, 'reg-buyer', {});
      expect(first.status).toBe(503);
      expect(first.body).toMatchObject({ code: 'NOT_REPLICATED' });
      expect(await registeredBuyers(f.pool, activityId, '', 10)).toEqual(['reg-buyer']);

      // Confirmed: the repeat answers registered (the flag was written by the first call).
      const satisfied = await apiWith(new ReplicaAck(f.redis, 0, 100));
      const again = await buyerCall(satisfied, 'POST', path, 'reg-buyer', {});
      expect([again.status, again.body]).toEqual([200, { registered: true }]);
      const fresh = await buyerCall(satisfied, 'POST', path, 'reg-other', {});
      expect([fresh.status, fresh.body]).toEqual([201, { registered: true }]);
    },
    TIMEOUT_MS,
  );
});
