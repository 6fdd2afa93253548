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
import calculateSlot from 'cluster-key-slot';
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
 *
 * As in ReplicaAck, reservations share the WAIT: every caller whose script completed joins its
 * node's next pipeline (at most one in flight per node, the next queued behind it): one probe
 * write and one WAIT per batch instead of per reservation, however many stock buckets the node
 * holds.
 */
export class ClusterReplicaAck implements ReservationAck {
  readonly mode = 'replica' as const;
  /** Per node: the batch waiting to be sent (the probes of its callers' scopes), and the one in flight. */
  private readonly batches = new Map<
    string,
    {
      queued: { probes: Set<string>; acked: Promise<Map<string, number>> } | undefined;
      running: Promise<unknown>;
    }
  >();

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
    const acked = (await this.next(probe)).get(probe) ?? 0;
    if (acked < this.replicas) {
      throw new FlashSaleError(
        'NOT_REPLICATED',
        `the reservation reached ${acked} of ${this.replicas} replica(s) within ${this.timeoutMs} ms; retry with the same requestId`,
        { reservationId },
      );
    }
  }

  /** The node's next batch, sent after the caller's script completed and after the batch in flight. */
  private next(probe: string): Promise<Map<string, number>> {
    // The node serving the probe's slot now (the same as the script's: one slot per scope).
    const node = this.redis.slots[calculateSlot(probe)]?.[0] ?? probe;
    let batch = this.batches.get(node);
    if (!batch) {
      batch = { queued: undefined, running: Promise.resolve() };
      this.batches.set(node, batch);
    }
    if (batch.queued) {
      batch.queued.probes.add(probe);
      return batch.queued.acked;
    }
    const b = batch;
    const probes = new Set([probe]);
    const acked = b.running.then(() => {
      // Callers from now on form the next batch: their scripts may complete after this pipeline.
      b.queued = undefined;
      return this.waitOn([...probes]);
    });
    b.queued = { probes, acked };
    const running: Promise<unknown> = acked
      .catch(() => undefined)
      .then(() => {
        // Nobody queued behind it: forget the node (nodes come and go with failovers).
        if (b.running === running && !b.queued && this.batches.get(node) === b) this.batches.delete(node);
      });
    b.running = running;
    return acked;
  }

  /**
   * One probe write and one WAIT on the node of the batch's scopes; replicas acknowledged, per probe.
   * The WAIT covers every write that preceded the probe's on that node (the replication offset is
   * the node's, not the connection's), so one probe covers every scope of the batch that is still
   * on that node; a scope the slot map now puts elsewhere (a failover or resharding since it joined)
   * waits on its own node.
   */
  private async waitOn(probes: string[]): Promise<Map<string, number>> {
    const nodeOf = (k: string): string | undefined => this.redis.slots[calculateSlot(k)]?.[0];
    const once = async (probe: string): Promise<number> => {
      const replies =
        (await this.redis.pipeline().incr(probe).wait(this.replicas, this.timeoutMs).exec()) ?? [];
      for (const [err] of replies) if (err) throw err;
      return Number(replies[1]?.[1] ?? 0);
    };
    const groups = new Map<string, string[]>();
    for (const k of probes) {
      const node = nodeOf(k) ?? k;
      groups.set(node, [...(groups.get(node) ?? []), k]);
    }
    const acked = new Map<string, number>();
    await Promise.all(
      [...groups.values()].map(async (keys) => {
        const n = await once(keys[0]!);
        for (const k of keys) acked.set(k, n);
      }),
    );
    return acked;
  }
}

/** Replicas the primary has right now (INFO replication), for `RESERVE_ACK` unset. */
export async function connectedReplicas(redis: Redis): Promise<number> {
  const info = await redis.info('replication');
  const m = /^connected_slaves:(\d+)/m.exec(info);
  return m ? Number(m[1]) : 0;
}
