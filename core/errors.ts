import { isTransientDbError } from './db/pool.js';

/**
 * Stable error codes of the platform. The HTTP layer turns a FlashSaleError into
 * `application/problem+json` with `code` as the machine-readable field; clients and dashboards
 * rely on these strings, so they never change meaning.
 */
export const ErrorCodes = {
  SOLD_OUT: { status: 409, title: 'Sold out' },
  LIMIT_REACHED: { status: 409, title: 'Per-buyer limit reached' },
  NOT_STARTED: { status: 409, title: 'The sale has not started' },
  ENDED: { status: 409, title: 'The sale has ended' },
  PAUSED: { status: 409, title: 'The sale is paused' },
  INVALID_ORDER_CODE: { status: 403, title: 'Invalid order code' },
  UNKNOWN_SKU: { status: 404, title: 'Unknown sku' },
  UNKNOWN_ACTIVITY: { status: 404, title: 'Unknown activity' },
  UNKNOWN_RESERVATION: { status: 404, title: 'Unknown reservation' },
  CANCELLED: { status: 409, title: 'The request was cancelled' },
  IDEMPOTENCY_CONFLICT: { status: 409, title: 'requestId reused with a different body' },
  ALREADY_PAID: { status: 409, title: 'The order is paid' },
  ORDER_CODES_DISABLED: { status: 409, title: 'This activity does not use order codes' },
  VALIDATION_ERROR: { status: 400, title: 'The request is not valid' },
  PAYLOAD_TOO_LARGE: { status: 413, title: 'The request body is too large' },
  UNSUPPORTED_MEDIA_TYPE: { status: 415, title: 'Use application/json' },
  UNAUTHORIZED: { status: 401, title: 'A valid bearer token is required' },
  NOT_FOUND: { status: 404, title: 'Not found' },
  METHOD_NOT_ALLOWED: { status: 405, title: 'Method not allowed' },
  FROZEN: { status: 409, title: 'Stock was written back; the cache is frozen' },
  MISMATCH: { status: 409, title: 'The reservation belongs to another buyer or sku' },
  RELEASED: { status: 409, title: 'The reservation was released' },
  STOCK_DECREASE: { status: 422, title: 'Initial stock can only grow' },
  STALE_GENERATION: { status: 409, title: 'An older generation than the one loaded' },
  NOT_LOADED: { status: 409, title: 'The activity is not loaded into the cache' },
  BAD_ARGUMENT: { status: 500, title: 'A script was called with bad arguments' },
  UNAVAILABLE: { status: 503, title: 'A dependency is unavailable; retry' },
  NOT_REPLICATED: {
    status: 503,
    title: 'The reservation is not on a replica yet; retry with the same requestId',
  },
  INTERNAL: { status: 500, title: 'Internal error' },
  BAD_SIGNATURE: { status: 401, title: 'The payment notification signature is not valid' },
  MERCHANT_MISMATCH: { status: 403, title: 'The notification is for another merchant or app' },
  UNKNOWN_ORDER: { status: 404, title: 'Unknown order' },
  TRADE_CONFLICT: { status: 409, title: 'The trade number is already recorded for another order or amount' },
  CANCEL_MARKER_LIMIT: {
    status: 429,
    title: 'Too many cancellations of submissions that never arrived; cancel by reservation id',
  },
  NOT_PAID: { status: 409, title: 'The order is not paid; there is nothing to refund' },
  ALREADY_REFUNDED: { status: 409, title: 'The order is refunded already' },
  UNKNOWN_REFUND: { status: 404, title: 'Unknown refund' },
  REFUND_CONFLICT: {
    status: 409,
    title: 'The refund notification does not match the refund recorded under its id',
  },
  RATE_LIMITED: { status: 429, title: 'Too many requests; retry after the time given' },
  OVERLOADED: { status: 503, title: 'The server is overloaded; retry after the time given' },
  BUYER_DENIED: { status: 403, title: 'This buyer may not take part in the sale' },
  NOT_REGISTERED: { status: 403, title: 'This sale requires pre-registration' },
  REGISTRATION_CLOSED: { status: 409, title: 'Registration for this sale is closed' },
  REGISTRATION_DISABLED: { status: 409, title: 'This activity does not use pre-registration' },
  ORDER_CODE_LIMIT: { status: 409, title: 'Order-code limit per buyer and sku reached' },
  BUCKETED: { status: 503, title: "The SKU's stock is split into buckets; retry" },
  NOT_WITHHELD: { status: 409, title: 'The reservation was not released with its unit withheld' },
  NOT_WRITTEN_BACK: {
    status: 503,
    title: 'The cache is frozen but the stock is not written back yet; retry',
  },
} as const satisfies Record<string, { status: number; title: string }>;

export type ErrorCode = keyof typeof ErrorCodes;

export class FlashSaleError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly extra: Readonly<Record<string, unknown>>;

  constructor(code: ErrorCode, detail?: string, extra: Record<string, unknown> = {}) {
    super(detail ?? ErrorCodes[code].title);
    this.name = 'FlashSaleError';
    this.code = code;
    this.status = ErrorCodes[code].status;
    this.extra = extra;
  }
}

/**
 * The one mapping from the Lua scripts' negative return codes (documented in each script's
 * header) to error codes.
 */
export const ScriptErrorCodes: Readonly<Record<number, ErrorCode>> = {
  [-1]: 'NOT_STARTED',
  [-2]: 'ENDED',
  [-3]: 'PAUSED',
  [-4]: 'SOLD_OUT',
  [-5]: 'LIMIT_REACHED',
  [-6]: 'UNKNOWN_SKU',
  [-7]: 'INVALID_ORDER_CODE',
  [-8]: 'CANCELLED',
  [-9]: 'NOT_LOADED',
  [-10]: 'IDEMPOTENCY_CONFLICT',
  [-11]: 'FROZEN',
  [-12]: 'UNKNOWN_RESERVATION',
  [-13]: 'ALREADY_PAID',
  [-14]: 'MISMATCH',
  [-15]: 'RELEASED',
  [-16]: 'BAD_ARGUMENT',
  [-17]: 'STOCK_DECREASE',
  [-18]: 'STALE_GENERATION',
  [-19]: 'CANCEL_MARKER_LIMIT',
  [-20]: 'BUCKETED',
  [-21]: 'NOT_WITHHELD',
  // Eligibility (reserve-9.lua's eligibility block, issueOrderCode-3.lua): numbered apart from the
  // codes above so other scripts can grow without renumbering these.
  [-40]: 'BUYER_DENIED',
  [-41]: 'NOT_REGISTERED',
  [-42]: 'ORDER_CODE_LIMIT',
  // The per-buyer rate limit counted inside the scripts (reserve-9.lua, soldOutChecks-var.lua,
  // countWindow-1.lua); the reply's next element is the window's rest in ms.
  [-43]: 'RATE_LIMITED',
};

export function scriptError(script: string, code: number, data: (string | number)[] = []): FlashSaleError {
  const mapped = ScriptErrorCodes[code];
  if (!mapped) return new FlashSaleError('INTERNAL', `script ${script} returned unknown code ${code}`);
  return new FlashSaleError(mapped, undefined, data.length > 0 ? { script, data } : { script });
}

/**
 * Redis error replies that refuse a command before it runs: out of memory under `noeviction`
 * (OOM), writes stopped after a failed save (MISCONF), a replica or a demoted primary (READONLY),
 * a node still loading its data (LOADING), a replica whose primary is gone (MASTERDOWN), a cluster
 * that cannot serve the slot (CLUSTERDOWN, TRYAGAIN), fewer replicas than min-replicas-to-write
 * (NOREPLICAS), a script running past its time (BUSY), and a cluster's redirections (MOVED, ASK)
 * that reached the caller unfollowed. A script is refused only at its first write (Redis lets a
 * script that has written go on whatever the server's state, to keep it atomic), so a refused
 * script wrote nothing.
 */
const REDIS_REFUSAL =
  /^(?:OOM|MISCONF|READONLY|LOADING|MASTERDOWN|CLUSTERDOWN|TRYAGAIN|NOREPLICAS|BUSY|MOVED|ASK) /;

/**
 * ioredis' Cluster gives up on a command after `maxRedirections` (16) MOVED, ASK, TRYAGAIN or
 * CLUSTERDOWN answers or closed connections, and names the last one: while a slot migrates
 * (resharding), every script whose keys are split between the two nodes, or are partly new, is
 * answered TRYAGAIN for as long as the migration takes, far longer than the 16 × 100 ms ioredis
 * retries.
 */
const CLUSTER_GAVE_UP = /^Too many Cluster redirections\. Last error: (?:ReplyError: )?/;

/**
 * Why a dependency could not serve a request, when a retry may succeed: `unanswered` (refused,
 * reset or closed connection, retries used up, a command or query that timed out: ioredis says
 * `Command timed out`, pg `Query read timeout`; and every PostgreSQL failure `isTransientDbError`
 * retries: a connection ended by a restart or a failover, a server starting up or shutting down,
 * too many connections, a serialization failure or deadlock, whose transaction was rolled back) or
 * `refused` (a Redis refusal above: nothing was written). The HTTP layer answers 503 UNAVAILABLE
 * for both rather than 500. Undefined for any other error, a FlashSaleError included.
 */
export function dependencyOutage(err: unknown): 'unanswered' | 'refused' | undefined {
  if (err instanceof FlashSaleError) return undefined;
  const message = (err as Error | null)?.message ?? '';
  if (REDIS_REFUSAL.test(message.replace(CLUSTER_GAVE_UP, ''))) return 'refused';
  if (
    isTransientDbError(err) ||
    /ECONNREFUSED|ECONNRESET|Connection is closed|MaxRetriesPerRequest|timeout|timed out/i.test(message)
  )
    return 'unanswered';
  return undefined;
}
