/**
 * The activities' traffic policies as this api process knows them: read from Redis (written by the
 * operator, core/traffic-policy.ts) at most once per refresh interval per activity, so a flood of
 * requests costs one GET per interval. An activity with no policy in Redis gets the defaults.
 */
import type { Logger } from '../../core/logger.js';
import type { RedisClient } from '../../core/scripts.js';
import { DEFAULT_TRAFFIC_POLICY, readTrafficPolicy } from '../../core/traffic-policy.js';
import type { TrafficPolicy } from '../../core/traffic-policy.js';

interface Entry {
  policy: TrafficPolicy;
  /** When the entry should be read again (Date.now() ms). */
  staleAt: number;
  refreshing?: Promise<TrafficPolicy> | undefined;
}

/** Bounds memory when clients name many (unknown) activities. */
const MAX_ENTRIES = 10_000;

export class PolicyCache {
  private readonly entries = new Map<string, Entry>();

  constructor(
    private readonly redis: RedisClient,
    private readonly refreshMs: number,
    private readonly logger: Logger,
    /**
     * The policy of an activity with none in Redis (the operator writes one for every activity it
     * runs): this very object, so a caller can tell such an activity (a made-up id) by identity.
     */
    readonly fallback: TrafficPolicy = DEFAULT_TRAFFIC_POLICY,
  ) {}

  /**
   * The policy when it is known without waiting: fresh, or stale while one read refreshes it (the
   * read starts here). Undefined only for an activity this process has not read yet. The buyer
   * routes' stages call this on every request, so a known policy costs no promise.
   */
  known(activityId: string): TrafficPolicy | undefined {
    const entry = this.entries.get(activityId);
    if (!entry) return undefined;
    if (entry.refreshing === undefined) {
      const now = Date.now();
      // Serve the known policy while one read refreshes it.
      if (entry.staleAt <= now) entry.refreshing = this.read(activityId, now);
    }
    return entry.policy;
  }

  async get(activityId: string): Promise<TrafficPolicy> {
    return this.known(activityId) ?? this.read(activityId, Date.now());
  }

  private async read(activityId: string, now: number): Promise<TrafficPolicy> {
    let policy: TrafficPolicy;
    try {
      policy = (await readTrafficPolicy(this.redis, activityId)) ?? this.fallback;
    } catch (err) {
      // Redis unreachable: keep what we had (or the defaults); the reservation itself will fail
      // with UNAVAILABLE anyway, and the limiters fall back to their in-memory insurance.
      this.logger.warn({ err, activityId }, 'traffic policy not readable; using the last known one');
      policy = this.entries.get(activityId)?.policy ?? this.fallback;
    }
    if (this.entries.size >= MAX_ENTRIES && !this.entries.has(activityId)) {
      const oldest = this.entries.keys().next().value;
      if (oldest !== undefined) this.entries.delete(oldest);
    }
    this.entries.set(activityId, { policy, staleAt: now + this.refreshMs });
    return policy;
  }
}
