/**
 * Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection package does
 * it (the JS client has none): candidates try every `retryPeriod` to take a Lease whose holder has
 * not renewed it for `leaseDuration` (measured on the candidate's own monotonic clock from when it
 * last saw the record change, so neither clock skew nor a stepped wall clock matters); the leader
 * renews every `retryPeriod` and
 * steps down when it could not renew for `renewDeadline`. Every write carries the Lease's
 * resourceVersion, so two candidates can never both win. `release()` (on SIGTERM) empties the
 * holder so a successor takes over at once instead of after the lease duration.
 *
 * A process restarted with the same identity (a container restart in the same pod) takes its own
 * Lease back immediately.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { CoordinationV1Api, V1Lease } from '@kubernetes/client-node';
import { within } from '../../core/deadline.js';
import type { Logger } from '../../core/logger.js';

export interface LeaderElectionOptions {
  api: CoordinationV1Api;
  namespace: string;
  name: string;
  identity: string;
  leaseDurationMs: number;
  renewDeadlineMs: number;
  retryPeriodMs: number;
  log: Logger;
  onStartedLeading: () => void;
  /** Leadership lost (not released): the process should stop reconciling at once. */
  onStoppedLeading: () => void;
  /**
   * Called when the reason this process cannot lead changes: the Lease can be neither read nor
   * created (its namespace is missing, RBAC forbids it), or undefined once an attempt got through.
   */
  onBlocked?: (reason: string | undefined) => void;
  /** Wall-clock milliseconds, written into the Lease (renewTime, acquireTime). */
  now?: () => number;
  /**
   * Monotonic milliseconds, for every duration this process measures (renew deadline, lease
   * expiry as seen here): a wall clock stepped back (an NTP step) would keep a leader that cannot
   * renew leading past its deadline, while a candidate takes the Lease. Default: `now` when given
   * (tests), else performance.now().
   */
  elapsed?: () => number;
  /** Waits between attempts (tests pass one that moves their clock); default: an unreferenced timer. */
  wait?: (ms: number) => Promise<void>;
}

/** metav1.MicroTime wants exactly six fractional digits; the client sends Dates with three. */
export function microTime(ms: number): Date {
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z') as unknown as Date;
}

function timeOf(value: Date | string | undefined): number | undefined {
  if (value === undefined || value === null) return undefined;
  const t = new Date(value).getTime();
  return Number.isNaN(t) ? undefined : t;
}

function isStatus(err: unknown, code: number): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === code;
}

/**
 * Why an acquire attempt that failed with `err` means this process cannot lead until someone
 * changes the cluster (undefined: a transient failure, retried quietly).
 */
export function blockingReason(err: unknown, namespace: string, name: string): string | undefined {
  if (isStatus(err, 403)) {
    return `forbidden to read or create the Lease ${namespace}/${name} (RBAC: bind the leader-election Role in ${namespace}, which must exist)`;
  }
  if (isStatus(err, 404))
    return `the Lease namespace ${namespace} does not exist (create it, or set LEASE_NAMESPACE)`;
  return undefined;
}

export class LeaderElector {
  private leading = false;
  private stopped = false;
  private observedRecord = '';
  private observedAt = 0;
  private lastRenewAt = 0;
  /** Set when the Lease shows another holder while this process believed it led. */
  private takenOver = false;
  private readonly now: () => number;
  private readonly elapsed: () => number;
  private readonly wait: (ms: number) => Promise<void>;
  private blocked: string | undefined;
  /** The acquire or renew attempt under way, if any (release() waits for it). */
  private attempt: Promise<unknown> | undefined;

  constructor(private readonly options: LeaderElectionOptions) {
    this.now = options.now ?? Date.now;
    this.elapsed = options.elapsed ?? options.now ?? (() => performance.now());
    // Unreferenced: a candidate waiting for its next try never keeps the process alive.
    this.wait = options.wait ?? ((ms) => sleep(ms, undefined, { ref: false }));
  }

  get isLeader(): boolean {
    return this.leading;
  }

  /** Why this process cannot lead (undefined when it leads, or may lead once the Lease is free). */
  get blockedReason(): string | undefined {
    return this.blocked;
  }

  private setBlocked(reason: string | undefined): void {
    if (reason === this.blocked) return;
    this.blocked = reason;
    if (reason)
      this.options.log.error(
        { lease: `${this.options.namespace}/${this.options.name}`, reason },
        'cannot lead',
      );
    this.options.onBlocked?.(reason);
  }

  /** Runs until stop(): acquire, then renew; calls the callbacks on changes. */
  async run(): Promise<void> {
    while (!this.stopped) {
      // A Lease write took effect at the latest when the attempt ended, at the earliest when it
      // began: the deadline counts from the beginning, so however late the answer came the leader
      // steps down before any candidate can see the Lease expire.
      const attemptAt = this.elapsed();
      if (!this.leading) {
        let failed = false;
        const won = await within(
          this.attempted(),
          this.options.renewDeadlineMs,
          'lease acquire attempt',
        ).catch((err: unknown) => {
          failed = true;
          const reason = blockingReason(err, this.options.namespace, this.options.name);
          // A blocking reason is logged once as an error (setBlocked), not as a warning per retry.
          if (!reason) this.options.log.warn({ err: String(err) }, 'lease acquire attempt failed');
          this.setBlocked(reason ?? this.blocked);
          return false;
        });
        if (!failed) this.setBlocked(undefined);
        if (won && !this.stopped) {
          this.leading = true;
          this.lastRenewAt = attemptAt;
          this.options.log.info(
            { lease: `${this.options.namespace}/${this.options.name}`, identity: this.options.identity },
            'became leader',
          );
          this.options.onStartedLeading();
        }
      } else {
        // An API server that does not answer must not hold the leader past its renew deadline:
        // a candidate takes the Lease once it expires, and this process must have stopped by then.
        const left = Math.max(0, this.options.renewDeadlineMs - (attemptAt - this.lastRenewAt));
        const renewed = await within(this.attempted(), left, 'lease renewal').catch((err: unknown) => {
          this.options.log.warn({ err: String(err) }, 'lease renewal failed');
          return false;
        });
        if (renewed) this.lastRenewAt = attemptAt;
        else if (this.takenOver || this.elapsed() - this.lastRenewAt >= this.options.renewDeadlineMs) {
          this.leading = false;
          this.options.log.error(
            { identity: this.options.identity, takenOver: this.takenOver },
            'leadership lost: the lease was not renewed in time',
          );
          this.options.onStoppedLeading();
          return;
        }
      }
      // A leader waits no longer than its renew deadline leaves: client-go's renew loop steps down
      // exactly at the deadline; a whole retry period past it could outlast the lease a candidate
      // waits out (deadline + period > duration is a valid setting), two leaders at once.
      const left = this.options.renewDeadlineMs - (this.elapsed() - this.lastRenewAt);
      await this.wait(
        this.leading ? Math.min(this.options.retryPeriodMs, Math.max(0, left)) : this.options.retryPeriodMs,
      );
    }
  }

  stop(): void {
    this.stopped = true;
  }

  private attempted(): Promise<boolean> {
    const attempt = this.tryAcquireOrRenew();
    this.attempt = attempt;
    return attempt;
  }

  /**
   * Gives the Lease up (holder emptied) if this process holds it. Until then the run loop keeps
   * renewing it (a stopping operator's passes may still be running). A renewal under way is waited
   * for first: one that read the Lease after this release emptied it would take it again, and a
   * standby would wait for it to expire.
   */
  async release(): Promise<void> {
    this.stopped = true;
    if (this.attempt)
      await within(this.attempt, this.options.renewDeadlineMs, 'lease renewal').catch(() => undefined);
    if (!this.leading) return;
    this.leading = false;
    try {
      const lease = await this.options.api.readNamespacedLease({
        name: this.options.name,
        namespace: this.options.namespace,
      });
      if (lease.spec?.holderIdentity !== this.options.identity) return;
      const now = this.now();
      await this.options.api.replaceNamespacedLease({
        name: this.options.name,
        namespace: this.options.namespace,
        body: {
          metadata: {
            name: this.options.name,
            namespace: this.options.namespace,
            resourceVersion: lease.metadata?.resourceVersion,
          },
          spec: {
            ...lease.spec,
            holderIdentity: '',
            leaseDurationSeconds: 1,
            acquireTime: microTime(now),
            renewTime: microTime(now),
          },
        },
      });
      this.options.log.info({ identity: this.options.identity }, 'lease released');
    } catch (err) {
      this.options.log.warn({ err: String(err) }, 'lease release failed');
    }
  }

  /** One attempt; true when this process holds the Lease afterwards. */
  private async tryAcquireOrRenew(): Promise<boolean> {
    const now = this.now();
    const { api, namespace, name, identity } = this.options;
    const durationSeconds = Math.max(1, Math.round(this.options.leaseDurationMs / 1000));
    let lease: V1Lease;
    try {
      lease = await api.readNamespacedLease({ name, namespace });
    } catch (err) {
      if (!isStatus(err, 404)) throw err;
      await api.createNamespacedLease({
        namespace,
        body: {
          metadata: { name, namespace },
          spec: {
            holderIdentity: identity,
            leaseDurationSeconds: durationSeconds,
            acquireTime: microTime(now),
            renewTime: microTime(now),
            leaseTransitions: 0,
          },
        },
      });
      return true;
    }
    const spec = lease.spec ?? {};
    const record = `${spec.holderIdentity ?? ''}|${String(timeOf(spec.renewTime) ?? '')}|${spec.leaseTransitions ?? 0}`;
    const seenAt = this.elapsed();
    if (record !== this.observedRecord) {
      this.observedRecord = record;
      this.observedAt = seenAt;
    }
    const holder = spec.holderIdentity ?? '';
    const heldByUs = holder === identity;
    const leaseMs = (spec.leaseDurationSeconds ?? durationSeconds) * 1000;
    if (this.leading && !heldByUs) {
      this.takenOver = true; // released or taken by someone else: never take it back while leading
      return false;
    }
    if (holder !== '' && !heldByUs && this.observedAt + leaseMs > seenAt) return false;
    const transitions = (spec.leaseTransitions ?? 0) + (heldByUs ? 0 : 1);
    try {
      await api.replaceNamespacedLease({
        name,
        namespace,
        body: {
          metadata: { name, namespace, resourceVersion: lease.metadata?.resourceVersion },
          spec: {
            holderIdentity: identity,
            leaseDurationSeconds: durationSeconds,
            acquireTime:
              heldByUs && spec.acquireTime ? microTime(timeOf(spec.acquireTime) ?? now) : microTime(now),
            renewTime: microTime(now),
            leaseTransitions: transitions,
          },
        },
      });
    } catch (err) {
      if (isStatus(err, 409)) return false; // someone else wrote it first
      throw err;
    }
    return true;
  }
}
