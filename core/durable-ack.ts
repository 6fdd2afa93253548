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
 *
 * A WAIT only speaks for the server it ran on. When the connection is replaced between the script's
 * answer and the WAIT's (the WAIT queued behind another, the primary lost, the client reconnected
 * to the promoted replica and resent the queued WAIT there), a WAIT that succeeds confirms the new
 * primary's writes, not the reservation, which may have died with the old one. So a caller counts
 * a WAIT only if it was answered on the connection its own script was answered on (or, on a
 * cluster, by the node its scope lived on); anything else, and a WAIT that failed, is
 * NOT_REPLICATED, and the retry with the same requestId settles it on the server of the moment.
 */
import calculateSlot from 'cluster-key-slot';
import type { Cluster, Redis } from 'ioredis';
import { FlashSaleError } from './errors.js';
import { ACK_PROBE_TTL_SECONDS, activityKeys } from './keys.js';
import type { ScopeKeys } from './keys.js';
import { isCluster } from './redis.js';
import type { RedisClient } from './scripts.js';

export type AckMode = 'replica' | 'local';

/** Where a write was answered: a connection (single primary) or a cluster node. */
export type AnsweredOn = unknown;

export interface ReservationAck {
  /**
   * Resolves once the reservation is as durable as configured; throws NOT_REPLICATED if not.
   * `answeredOn` (from `answeredOn()` as the write's answer arrived) is required to be where the
   * WAIT runs: a write answered by a server the client has left since is never confirmed.
   */
  confirm(
    activityId: string,
    reservationId: string,
    replayed: boolean,
    scope?: ScopeKeys,
    answeredOn?: AnsweredOn,
  ): Promise<void>;
  /** The connection (or node) a write of `scope` is answered on now: called as its answer arrives. */
  answeredOn(activityId: string, scope?: ScopeKeys): AnsweredOn;
  /** Decides what is not decided yet (AckDecidedOnFirstUse), before writes whose answers it will judge. */
  ready?(): Promise<void>;
}

export const localAck: ReservationAck = {
  confirm: async () => undefined,
  answeredOn: () => undefined,
};

export class ReplicaAck implements ReservationAck {
  private queued: Promise<AckedOn> | undefined;
  private running: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly redis: Redis,
    private readonly replicas: number,
    private readonly timeoutMs: number,
  ) {}

  answeredOn(): AnsweredOn {
    return this.redis.stream;
  }

  async confirm(
    activityId: string,
    reservationId: string,
    replayed: boolean,
    _scope?: ScopeKeys,
    answeredOn?: AnsweredOn,
  ): Promise<void> {
    // Called as the script's answer arrives (no I/O in between): the connection that answered it,
    // unless the caller says which one did (writes answered earlier, confirmed together later).
    const connection = this.redis.stream;
    let acked = 0;
    if (answeredOn !== undefined && answeredOn !== connection)
      throw notReplicated(reservationId, acked, this.replicas, this.timeoutMs);
    try {
      // A replay wrote nothing on this connection, and the original may have been written by
      // another api process: one write here first, so the WAIT covers the primary's stream up to now.
      if (replayed) await this.redis.set(activityKeys(activityId).ackProbe, '1', 'EX', ACK_PROBE_TTL_SECONDS);
      if (this.redis.stream === connection) {
        const waited = await this.next();
        if (waited.connection === connection) acked = waited.acked;
      }
    } catch {
      // The WAIT (or the probe) failed with the connection: nothing confirms the reservation.
    }
    if (acked < this.replicas) throw notReplicated(reservationId, acked, this.replicas, this.timeoutMs);
  }

  /** The next WAIT, issued after the caller's write completed and after the WAIT in flight. */
  private next(): Promise<AckedOn> {
    if (this.queued) return this.queued;
    const q = this.running.then(async () => {
      // Callers from now on form the next batch: their writes may come after this WAIT.
      this.queued = undefined;
      const acked = await this.redis.wait(this.replicas, this.timeoutMs);
      // Read as the answer arrives: the connection the WAIT ran on (a resent WAIT has a new one).
      return { acked, connection: this.redis.stream };
    });
    this.queued = q;
    this.running = q.catch(() => undefined);
    return q;
  }
}

/** Replicas a WAIT counted, and the connection it was answered on. */
interface AckedOn {
  acked: number;
  connection: unknown;
}

function notReplicated(
  reservationId: string,
  acked: number,
  replicas: number,
  timeoutMs: number,
): FlashSaleError {
  return new FlashSaleError(
    'NOT_REPLICATED',
    `the reservation reached ${acked} of ${replicas} replica(s) within ${timeoutMs} ms; retry with the same requestId`,
    { reservationId },
  );
}

/**
 * The same guarantee on a Redis Cluster: WAIT covers the writes of the connection it runs on, and
 * a cluster client has one connection per node, so the WAIT must reach the node that answered the
 * reservation's script: the node serving the scope's slot as the answer arrives. A write to the
 * scope's probe key and the WAIT behind it go to that node's connection (after the script's write,
 * and after any other process' write of a replayed reservation). If that node no longer serves the
 * slot (a failover or resharding since), the probe is refused there (MOVED, or READONLY on a
 * demoted node) and the reservation is NOT_REPLICATED: a WAIT on the slot's new node would speak
 * for that node's writes, not for the reservation.
 *
 * As in ReplicaAck, reservations share the WAIT: every caller whose script completed joins its
 * node's next pipeline (at most one in flight per node, the next queued behind it): one probe
 * write and one WAIT per batch instead of per reservation, however many stock buckets the node
 * holds.
 */
export class ClusterReplicaAck implements ReservationAck {
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

  answeredOn(activityId: string, scope?: ScopeKeys): AnsweredOn {
    return this.nodeOf((scope ?? activityKeys(activityId)).ackProbe);
  }

  async confirm(
    activityId: string,
    reservationId: string,
    _replayed: boolean,
    scope?: ScopeKeys,
    answeredOn?: AnsweredOn,
  ): Promise<void> {
    const probe = (scope ?? activityKeys(activityId)).ackProbe;
    // Called as the script's answer arrives (no I/O in between): the node that answered it, unless
    // the caller says which one did (writes answered earlier, confirmed together later).
    const node = this.nodeOf(probe);
    let acked = 0;
    if (node !== undefined && (answeredOn === undefined || answeredOn === node)) {
      try {
        acked = (await this.next(node, probe)).get(probe) ?? 0;
      } catch {
        // The probe or the WAIT failed on the node: nothing confirms the reservation.
      }
    }
    if (acked < this.replicas) throw notReplicated(reservationId, acked, this.replicas, this.timeoutMs);
  }

  /** The node serving the key's slot in the client's slot map ("host:port"). */
  private nodeOf(key: string): string | undefined {
    return this.redis.slots[calculateSlot(key)]?.[0];
  }

  /** The node's next batch, sent after the caller's script completed and after the batch in flight. */
  private next(node: string, probe: string): Promise<Map<string, number>> {
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
      return this.waitOn(node, [...probes]);
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
   * One probe write and one WAIT on the node's own connection; replicas acknowledged, per probe.
   * The WAIT covers every write that preceded the probe's on that node (the replication offset is
   * the node's, not the connection's), so one probe covers every scope of the batch whose slot the
   * node still serves; a scope the slot map now puts elsewhere gets 0.
   */
  private async waitOn(node: string, probes: string[]): Promise<Map<string, number>> {
    const acked = new Map<string, number>(probes.map((k) => [k, 0]));
    const here = probes.filter((k) => this.nodeOf(k) === node);
    const connection = this.redis
      .nodes('master')
      .find((n) => `${n.options.host ?? ''}:${n.options.port ?? ''}` === node);
    if (here.length === 0 || !connection) return acked;
    const replies =
      (await connection
        .pipeline()
        .set(here[0]!, '1', 'EX', ACK_PROBE_TTL_SECONDS)
        .wait(this.replicas, this.timeoutMs)
        .exec()) ?? [];
    for (const [err] of replies) if (err) throw err;
    const n = Number(replies[1]?.[1] ?? 0);
    for (const k of here) acked.set(k, n);
    return acked;
  }
}

/** The acknowledgement for `mode`: per node on a cluster, on the one commands connection otherwise. */
export function reservationAckOf(
  redis: RedisClient,
  mode: AckMode,
  replicas: number,
  timeoutMs: number,
): ReservationAck {
  if (mode === 'local') return localAck;
  return isCluster(redis)
    ? new ClusterReplicaAck(redis, replicas, timeoutMs)
    : new ReplicaAck(redis, replicas, timeoutMs);
}

/**
 * `RESERVE_ACK` unset: `replica` whenever there is a replica to fail over to (the primary reached
 * through Sentinel, a cluster, or a primary with replicas right now), else `local`.
 */
export async function defaultAckMode(redis: RedisClient, sentinel: boolean): Promise<AckMode> {
  if (sentinel || isCluster(redis)) return 'replica';
  return (await connectedReplicas(redis)) > 0 ? 'replica' : 'local';
}

/**
 * An acknowledgement decided at its first use, and again after a decision that failed: a role
 * that only settles stock now and then (the jobs, the after-sale sweeper) must start while Redis
 * is unreachable, which deciding at start (INFO replication) would not allow.
 */
export class AckDecidedOnFirstUse implements ReservationAck {
  private decided: Promise<ReservationAck> | undefined;
  private resolved: ReservationAck | undefined;

  constructor(private readonly decide: () => Promise<ReservationAck>) {}

  async ready(): Promise<void> {
    await this.decidedAck();
  }

  /** Undecided yet: a token no connection is, so writes answered before the decision are not confirmed. */
  answeredOn(activityId: string, scope?: ScopeKeys): AnsweredOn {
    return this.resolved ? this.resolved.answeredOn(activityId, scope) : UNDECIDED;
  }

  async confirm(
    activityId: string,
    reservationId: string,
    replayed: boolean,
    scope?: ScopeKeys,
    answeredOn?: AnsweredOn,
  ): Promise<void> {
    return (await this.decidedAck()).confirm(activityId, reservationId, replayed, scope, answeredOn);
  }

  private decidedAck(): Promise<ReservationAck> {
    this.decided ??= this.decide().then(
      (ack) => {
        this.resolved = ack;
        return ack;
      },
      (err: unknown) => {
        this.decided = undefined;
        throw err;
      },
    );
    return this.decided;
  }
}

const UNDECIDED: AnsweredOn = Symbol('undecided');

/** Replicas the primary has right now (INFO replication), for `RESERVE_ACK` unset. */
export async function connectedReplicas(redis: Redis): Promise<number> {
  const info = await redis.info('replication');
  const m = /^connected_slaves:(\d+)/m.exec(info);
  return m ? Number(m[1]) : 0;
}
