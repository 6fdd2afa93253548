/**
 * Durable acknowledgement of reservations (docs/install.md, "Redis"): with `RESERVE_ACK=replica`
 * the api answers 202 only once Redis WAIT confirms that the replicas received every write up to
 * the reservation, so a failover to a replica cannot lose a reservation a buyer was told about.
 *
 * WAIT blocks the connection it runs on and covers that connection's writes, so it runs on the
 * api's shared command connection, one at a time: every request whose script completed joins the
 * next WAIT, and one WAIT acknowledges all of them (at most one in flight, the next queued behind
 * it). When the replicas do not confirm within the timeout the reservation exists on the primary
 * only: the buyer gets 503 NOT_REPLICATED with the reservation id, and a retry with the same
 * requestId replays the reservation and waits again (202 once it is replicated; a fresh
 * reservation or SOLD_OUT if a failover lost it). No 202 is ever given for a reservation that a
 * failover can lose.
 */
import type { Cluster, Redis } from 'ioredis';
import { FlashSaleError } from './errors.js';
import { activityKeys } from './keys.js';
import type { ScopeKeys } from './keys.js';

export interface ReservationAck {
  readonly mode: 'replica' | 'local';
  /** Resolves once the reservation is as durable as configured; throws NOT_REPLICATED if not. */
  confirm(activityId: string, reservationId: string, replayed: boolean, scope?: ScopeKeys): Promise<void>;
}

export const localAck: ReservationAck = {
  mode: 'local',
  confirm: async () => undefined,
};

export class ReplicaAck implements ReservationAck {
  readonly mode = 'replica' as const;
  private queued: Promise<number> | undefined;
  private running: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly redis: Redis,
    private readonly replicas: number,
    private readonly timeoutMs: number,
  ) {}

  async confirm(activityId: string, reservationId: string, replayed: boolean): Promise<void> {
    // A replay wrote nothing on this connection, and the original may have been written by another
    // api process: one write here first, so the WAIT covers the primary's stream up to now.
    if (replayed) await this.redis.incr(activityKeys(activityId).ackProbe);
    const acked = await this.next();
    if (acked < this.replicas) {
      throw new FlashSaleError(
        'NOT_REPLICATED',
        `the reservation reached ${acked} of ${this.replicas} replica(s) within ${this.timeoutMs} ms; retry with the same requestId`,
        { reservationId },
      );
    }
  }

  /** The next WAIT, issued after the caller's write completed and after the WAIT in flight. */
  private next(): Promise<number> {
    if (this.queued) return this.queued;
    const q = this.running.then(() => {
      // Callers from now on form the next batch: their writes may come after this WAIT.
      this.queued = undefined;
      return this.redis.wait(this.replicas, this.timeoutMs);
    });
    this.queued = q;
    this.running = q.catch(() => undefined);
    return q;
  }
}

/**
 * The same guarantee on a Redis Cluster: WAIT covers the writes of the connection it runs on, and
 * a cluster client has one connection per node, so the WAIT must reach the node of the
 * reservation's scope. A pipeline goes to the node of its keys: a write to the scope's probe key
 * and the WAIT behind it, on that node's connection (after the script's write, and after any
 * other process' write of a replayed reservation).
 */
export class ClusterReplicaAck implements ReservationAck {
  readonly mode = 'replica' as const;

  constructor(
    private readonly redis: Cluster,
    private readonly replicas: number,
    private readonly timeoutMs: number,
  ) {}

  async confirm(
    activityId: string,
    reservationId: string,
    _replayed: boolean,
    scope?: ScopeKeys,
  ): Promise<void> {
    const probe = (scope ?? activityKeys(activityId)).ackProbe;
    const replies = await this.redis.pipeline().incr(probe).wait(this.replicas, this.timeoutMs).exec();
    const [err, acked] = replies?.[1] ?? [new Error('no reply to WAIT'), 0];
    if (err) throw err;
    if (Number(acked) < this.replicas) {
      throw new FlashSaleError(
        'NOT_REPLICATED',
        `the reservation reached ${Number(acked)} of ${this.replicas} replica(s) within ${this.timeoutMs} ms; retry with the same requestId`,
        { reservationId },
      );
    }
  }
}

/** Replicas the primary has right now (INFO replication), for `RESERVE_ACK` unset. */
export async function connectedReplicas(redis: Redis): Promise<number> {
  const info = await redis.info('replication');
  const m = /^connected_slaves:(\d+)/m.exec(info);
  return m ? Number(m[1]) : 0;
}
