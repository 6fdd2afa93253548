/**
 * The one place that composes Redis keys and channel names. Every key of an activity carries the
 * hash tag `{<activityId>}` so all of them live in one Redis Cluster slot and every script that
 * touches them stays atomic. Nothing else in the code base concatenates key strings.
 */
const PREFIX = 'fs';

/** Activity and SKU ids become parts of keys: keep them to a safe alphabet. */
const SAFE_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

export function isSafeId(id: string): boolean {
  return SAFE_ID.test(id);
}

function assertSafe(kind: string, id: string): string {
  if (!SAFE_ID.test(id)) throw new Error(`${kind} "${id}" is not a safe identifier (${SAFE_ID.source})`);
  return id;
}

export class ActivityKeys {
  readonly activityId: string;
  /** Prefix shared by every key of this activity; cleanup scans exactly this prefix. */
  readonly prefix: string;

  constructor(activityId: string) {
    this.activityId = assertSafe('activity id', activityId);
    this.prefix = `${PREFIX}:{${activityId}}:`;
  }

  /** Hash: gate, load generation, sale window, policies. */
  get meta(): string {
    return `${this.prefix}meta`;
  }
  /** Hash: aggregate counters (reserved / released quantities, reservations). */
  get counters(): string {
    return `${this.prefix}counters`;
  }
  /** Stream: the outbox of half messages, one entry per reservation, until Kafka acknowledged it. */
  get outbox(): string {
    return `${this.prefix}outbox`;
  }
  /** Sorted set (score = reserved-at ms): reservations not yet confirmed as orders in PostgreSQL. */
  get ledger(): string {
    return `${this.prefix}ledger`;
  }
  /** Hash: reservation id -> buyer-visible result JSON. Kept with a TTL after cleanup. */
  get results(): string {
    return `${this.prefix}results`;
  }
  /** Set: every sku id of the activity. */
  get skuIndex(): string {
    return `${this.prefix}skus`;
  }
  /** Hash per SKU: stock, initial, limit, price, name, gen. */
  sku(skuId: string): string {
    return `${this.prefix}sku:${assertSafe('sku id', skuId)}`;
  }
  /** Hash per buyer: `<sku>:qty` held quantity, `<sku>:slot:<n>` reservation id. */
  buyer(userId: string): string {
    return `${this.prefix}buyer:${userId}`;
  }
  /** Hash per reservation: the reservation ledger entry. */
  reservation(reservationId: string): string {
    return `${this.prefix}rsv:${reservationId}`;
  }
  /** String per one-time order code: "<user>|<sku>", short TTL. */
  orderCode(code: string): string {
    return `${this.prefix}code:${code}`;
  }
  /**
   * Counter the api increments before a replayed reservation's replica wait: a write on its own
   * connection, so Redis WAIT covers every earlier write on the primary (the original included).
   */
  get ackProbe(): string {
    return `${this.prefix}ackprobe`;
  }
  /** String: the activity's traffic policy (JSON, core/traffic-policy.ts), written by the operator. */
  get policy(): string {
    return `${this.prefix}policy`;
  }
  /** Set: buyers the deny list marked (so a later list can clear the ones it no longer names). */
  get denied(): string {
    return `${this.prefix}denied`;
  }
  /**
   * Key prefix of a rate limiter's counters (rate-limiter-flexible appends `:<subject>`): inside
   * the activity's hash tag, so cleanup's scan removes them with the rest of the activity.
   */
  rateLimitPrefix(kind: 'buyer' | 'address'): string {
    return `${this.prefix}rl:${kind}`;
  }
  /** Placeholder in the same slot for scripts whose optional key is absent. */
  get none(): string {
    return `${this.prefix}none`;
  }
  /** SCAN pattern covering every key of this activity and nothing else. */
  get scanPattern(): string {
    // `{`, `}` and the id's characters are not glob metacharacters except `[`/`*`/`?`, which
    // SAFE_ID excludes, so the prefix matches literally.
    return `${this.prefix}*`;
  }
  /** Pub/sub channel announcing that stock of a SKU came back (resets sold-out flags). */
  get restockChannel(): string {
    return `${this.prefix}restock`;
  }
}

export function activityKeys(activityId: string): ActivityKeys {
  return new ActivityKeys(activityId);
}

/** Pattern matching every activity's restock channel (for api replicas serving all activities). */
export const RESTOCK_CHANNEL_PATTERN = `${PREFIX}:{*}:restock`;

/** The activity id of a restock channel name, or undefined for anything else. */
export function activityOfRestockChannel(channel: string): string | undefined {
  const m = /^fs:\{([^}]+)\}:restock$/.exec(channel);
  return m?.[1];
}
