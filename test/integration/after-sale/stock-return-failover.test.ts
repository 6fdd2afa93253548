// A stock return confirmed across a failover (core/order-lifecycle.ts durablyReleased, with
// RESERVE_ACK=replica): the sweeper releases a timed-out order's unit on the primary, and the
// primary is left before the WAIT that would confirm it (Sentinel moved the client to the promoted
// replica, which never saw the release and still holds the reservation RESERVED, while its own
// replica confirms any WAIT at once). That release must not be recorded: recorded, the unit and the
// buyer's slot would be stranded on the new primary for good, nothing retrying them. The sweep's
// next attempt releases it there, and the unit comes back once.
//
// Three real Redis servers on loopback: the old primary, its replica (promoted below) and the
// promoted one's own replica; the real PostgreSQL.
import { ReplicaAck } from '../../../core/durable-ack.js';
import type { ReservationAck } from '../../../core/durable-ack.js';
import { findLifecycleByReservationId } from '../../../core/db/orders-store.js';
import { readReservation } from '../../../core/reservations.js';
import { sweepExpiredOrders } from '../../../runtime/jobs/payment-timeout.js';
import { waitFor } from '../../../dev/roles.js';
import { redisServer, stopRedisServers } from '../../fixtures/redis-server.js';
import type { RedisServer } from '../../fixtures/redis-server.js';
import {
  TIMEOUT_MS,
  expireAll,
  materialize,
  openActivity,
  reserveFor,
  setUp,
  skuStock,
  type Fixture,
} from './fixture.js';
import { Redis } from 'ioredis';

describe('stock returns across a failover', () => {
  const servers: RedisServer[] = [];
  let f: Fixture | undefined;

  afterAll(async () => {
    await f?.close();
    stopRedisServers(servers);
  });

  it(
    'a release answered by the old primary is not confirmed by the new one: deferred, then released there and settled once',
    async () => {
      const oldPrimary = await redisServer();
      const promoted = await redisServer(oldPrimary.port);
      const promotedReplica = await redisServer(promoted.port);
      servers.push(oldPrimary, promoted, promotedReplica);
      const fixture = await setUp(4, `redis://127.0.0.1:${oldPrimary.port}`);
      f = fixture;
      const { activityId, skuId } = await openActivity(fixture.redis, { stock: 5 });
      const [rid] = await reserveFor(fixture.redis, activityId, skuId, ['failover-buyer']);
      const orderId = (await materialize(fixture.pool, fixture.redis, activityId, [rid!])).get(rid!)!;
      await expireAll(fixture.pool, activityId);
      // Everything so far is on the replica about to be promoted.
      expect(await fixture.redis.wait(1, 5_000)).toBe(1);
      const admin = new Redis({ port: promoted.port, host: '127.0.0.1' });
      try {
        await admin.replicaof('NO', 'ONE');
        await waitFor(
          'the promoted server with its own replica',
          async () => /^connected_slaves:1/m.test(await admin.info('replication')),
          20_000,
        );
      } finally {
        admin.disconnect();
      }

      // The release runs on the old primary; before its WAIT the client is moved to the promoted
      // server, as ioredis' Sentinel connector moves it after a failover.
      const replicaAck = new ReplicaAck(fixture.redis, 1, 3_000);
      let failedOver = false;
      const failingOver: ReservationAck = {
        answeredOn: () => replicaAck.answeredOn(),
        confirm: async (...args) => {
          if (!failedOver) {
            failedOver = true;
            fixture.redis.options.port = promoted.port;
            fixture.redis.disconnect(true);
            await waitFor('the client on the promoted server', async () => {
              const info = await fixture.redis.info('server').catch(() => '');
              return new RegExp(`^tcp_port:${promoted.port}\\b`, 'm').test(info);
            });
          }
          return replicaAck.confirm(...args);
        },
      };
      const sweep = (stockAck: ReservationAck) =>
        sweepExpiredOrders({
          ...fixture.deps,
          activityId,
          batchSize: 10,
          maxBatches: 1,
          settleGraceSeconds: 0,
          stockAck,
        });

      // The sweep closes the order and releases its unit on the old primary; that release is not
      // confirmed (deferred). Its pass over the closures still unsettled then releases the unit on
      // the promoted server, whose replica confirms it: settled there, once.
      const first = await sweep(failingOver);
      expect(failedOver).toBe(true);
      expect(first.closed).toBe(1);
      expect(first.settled).toMatchObject({ redis: 1, deferred: 1, unresolved: 0 });
      expect((await readReservation(fixture.redis, activityId, rid!))?.state).toBe('RELEASED');
      expect(await skuStock(fixture.redis, activityId, skuId)).toBe(5);
      expect(await findLifecycleByReservationId(fixture.pool, rid!)).toMatchObject({
        id: orderId,
        status: 'CLOSED',
        stockReturnVia: 'redis',
      });
      const returned = await fixture.pool.query(
        `SELECT count(*)::int AS n FROM order_journal WHERE order_id = $1 AND event = 'STOCK_RETURNED'`,
        [orderId],
      );
      expect(returned.rows[0]).toEqual({ n: 1 });

      // Nothing left to settle: a later sweep changes nothing.
      const next = await sweep(replicaAck);
      expect(next.settled).toMatchObject({ redis: 0, deferred: 0, unresolved: 0 });
      expect(await skuStock(fixture.redis, activityId, skuId)).toBe(5);
    },
    TIMEOUT_MS,
  );
});
