// Durable acknowledgement across a failover (core/durable-ack.ts ReplicaAck): a WAIT queued behind
// another is resent by the client on its new connection when the old one is lost. After a
// failover that connection is to the promoted replica, whose WAIT confirms its own writes, not the
// reservation, which may have died with the old primary. The api must then answer NOT_REPLICATED
// (the buyer's retry settles it on the new primary), never count that WAIT.
//
// Two real primaries with a replica each, on loopback: the buyer's reservation is written on the
// first while its replica is stopped (SIGSTOP), so its WAIT blocks; the client is then moved to
// the second primary, as ioredis' Sentinel connector moves it to a promoted replica, and the
// queued WAIT is resent there, where it is answered at once.
import { Redis } from 'ioredis';
import { ReplicaAck } from '../../../core/durable-ack.js';
import { redisServer, stopRedisServers } from '../../fixtures/redis-server.js';
import type { RedisServer } from '../../fixtures/redis-server.js';

describe('durable acknowledgement across a failover', () => {
  const servers: RedisServer[] = [];
  let client: Redis | undefined;

  afterAll(() => {
    client?.disconnect();
    stopRedisServers(servers);
  });

  it('a WAIT resent on another server never confirms the reservation: NOT_REPLICATED', async () => {
    const oldPrimary = await redisServer();
    servers.push(oldPrimary);
    const oldReplica = await redisServer(oldPrimary.port);
    servers.push(oldReplica);
    const newPrimary = await redisServer();
    servers.push(newPrimary);
    servers.push(await redisServer(newPrimary.port));

    client = new Redis({ port: oldPrimary.port, host: '127.0.0.1', retryStrategy: () => 50 });
    client.on('error', () => undefined);
    const ack = new ReplicaAck(client, 1, 3_000);

    // The healthy case first: the replica confirms.
    await client.set('reservation:1', 'RESERVED');
    await expect(ack.confirm('a', 'rid-1', false)).resolves.toBeUndefined();

    // The replica stops acknowledging; the reservation's WAIT blocks on the old primary.
    oldReplica.process.kill('SIGSTOP');
    await client.set('reservation:2', 'RESERVED');
    const confirmed = ack.confirm('a', 'rid-2', false).then(
      () => 'confirmed',
      (err: unknown) => (err as { code?: string }).code,
    );
    await new Promise((r) => setTimeout(r, 200));
    // The failover as the client sees it: its connection is lost and it reconnects to the
    // promoted server, resending the WAIT in flight there.
    client.options.port = newPrimary.port;
    client.disconnect(true);

    expect(await confirmed).toBe('NOT_REPLICATED');
    // The resent WAIT itself was answered on the new primary, by its replica: without the check of
    // the connection that answered it, that answer would have confirmed the reservation.
    expect(client.options.port).toBe(newPrimary.port);
    expect(await client.wait(1, 3_000)).toBe(1);
    expect(await client.exists('reservation:2')).toBe(0);

    // A reservation written and confirmed on the new primary's connection is confirmed.
    await client.set('reservation:3', 'RESERVED');
    await expect(ack.confirm('a', 'rid-3', false)).resolves.toBeUndefined();
  }, 60_000);
});
