import pg from 'pg';

// numeric stays a string (decimal-safe); bigint ids become strings too, never lossy numbers.
pg.types.setTypeParser(pg.types.builtins.INT8, (v) => v);

export type Pool = pg.Pool;
export type PoolClient = pg.PoolClient;
export type Queryable = pg.Pool | pg.PoolClient;

/** The server ends any statement after this (statement_timeout). */
export const STATEMENT_TIMEOUT_MS = 30_000;

/**
 * The client gives up on a query after this (pg's query_timeout): 5 s above the server's own
 * limit, so it fires only when the server cannot answer at all (frozen, partitioned, a primary
 * gone behind a Service that now routes new connections elsewhere), where TCP alone would hold
 * the query for minutes or, with the peer's kernel still acknowledging, for ever.
 */
export const QUERY_TIMEOUT_MS = STATEMENT_TIMEOUT_MS + 5_000;

export interface PoolOptions {
  /**
   * Fail a query the server has not answered after this many ms (pg's client-side query_timeout;
   * off when absent). statement_timeout is enforced by the server, so a server that does not
   * answer at all (frozen, partitioned) holds a query until TCP gives up, minutes later; above
   * STATEMENT_TIMEOUT_MS it only fires then.
   */
  queryTimeoutMs?: number;
}

export function createPool(
  databaseUrl: string,
  max = 10,
  applicationName = 'flashsale',
  options: PoolOptions = {},
): pg.Pool {
  const pool = new pg.Pool({
    connectionString: databaseUrl,
    max,
    // Explicit UTF-8: item names in Chinese must round-trip byte for byte.
    client_encoding: 'UTF8',
    application_name: applicationName,
    connectionTimeoutMillis: 5_000,
    idleTimeoutMillis: 30_000,
    statement_timeout: STATEMENT_TIMEOUT_MS,
    ...(options.queryTimeoutMs !== undefined ? { query_timeout: options.queryTimeoutMs } : {}),
  });
  // An idle client the server terminates (restart, failover, admin kill) is emitted as 'error' on
  // the pool; unhandled, that would crash the process. The pool has already discarded the client
  // and the next query connects anew, so there is nothing else to do.
  pool.on('error', () => undefined);
  // A client checked out has no pool listener: the server ending it (a restart, a failover, an
  // admin kill), which pg emits as 'error' on the client even mid-query, would be unhandled and
  // end the process (every role: a consumer leaving its partitions stalled for its session
  // timeout, an api dropping its requests in flight). The caller's query is rejected with the
  // same error (a transient one: isTransientDbError), and the pool discards the client on release.
  pool.on('connect', (client) => client.on('error', () => undefined));
  return pool;
}

/**
 * pg's error for a query past query_timeout: the query is still the connection's active one, so
 * anything sent after it (a ROLLBACK included) waits behind it.
 */
function isQueryReadTimeout(err: unknown): boolean {
  return (err as Error | null)?.message === 'Query read timeout';
}

/**
 * Runs `fn` in a transaction; rolls back on any error. A connection whose rollback cannot run (a
 * query timed out on it, or the ROLLBACK failed) is destroyed rather than returned to the pool:
 * the server rolls back a transaction whose connection closes, and the next caller gets a fresh one.
 */
export async function inTransaction<T>(pool: pg.Pool, fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    await client.query('BEGIN');
    const result = await fn(client);
    await client.query('COMMIT');
    return result;
  } catch (err) {
    if (isQueryReadTimeout(err)) broken = err as Error;
    else
      await client.query('ROLLBACK').catch((rollbackErr: unknown) => {
        broken = rollbackErr instanceof Error ? rollbackErr : new Error(String(rollbackErr));
      });
    throw err;
  } finally {
    client.release(broken);
  }
}

/**
 * Runs `fn`'s reads in one snapshot (a REPEATABLE READ, READ ONLY transaction on one pooled
 * connection): figures read by several queries add up, whatever commits meanwhile. Read only,
 * so nothing is undone when it fails (a repeat reads anew).
 */
export async function inReadSnapshot<T>(pool: pg.Pool, fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
  return inTransaction(pool, async (c) => {
    await c.query('SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY');
    return fn(c);
  });
}

/**
 * Runs `fn` inside a savepoint of the caller's transaction: when it throws, or returns
 * `{ keep: false }`, only its own writes are undone and the transaction goes on.
 */
export async function inSavepoint<T>(
  c: pg.PoolClient,
  name: string,
  fn: () => Promise<{ keep: boolean; value: T }>,
  onError: (err: unknown) => T | undefined,
): Promise<T> {
  await c.query(`SAVEPOINT ${name}`);
  try {
    const r = await fn();
    await c.query(r.keep ? `RELEASE SAVEPOINT ${name}` : `ROLLBACK TO SAVEPOINT ${name}`);
    return r.value;
  } catch (err) {
    const handled = onError(err);
    if (handled === undefined) throw err;
    await c.query(`ROLLBACK TO SAVEPOINT ${name}`);
    return handled;
  }
}

/** Whether a statement failed on a unique key (SQLSTATE 23505). */
export function isUniqueViolation(err: unknown): boolean {
  return (err as { code?: unknown } | null)?.code === '23505';
}

/** Node's network error codes: the server is unreachable for now, not the message at fault. */
const NETWORK_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EAI_AGAIN',
  'ENOTFOUND',
]);

/**
 * SQLSTATEs of a server that cannot write for now, whatever it is asked: insufficient resources
 * (53000, disk full 53100, out of memory 53200, too many connections 53300; not 53400, a limit a
 * statement exceeds every time) and a read-only transaction (25006: a standby, or a demoted
 * primary the pool still reaches after a failover). System and I/O errors, class 58, are matched
 * by their prefix in isTransientDbError.
 */
const SERVER_REFUSALS = new Set(['53000', '53100', '53200', '53300', '25006']);

/**
 * Errors worth retrying: connection loss or refusal (Node codes), SQLSTATE classes 08 (connection),
 * 57P (shutdown/starting up) and 58 (system, I/O), a server refusing every write (SERVER_REFUSALS),
 * serialization failures, deadlocks, and pg's own connection messages. Anything else is the
 * message's fault and is not retried forever.
 */
export function isTransientDbError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string') {
    if (NETWORK_CODES.has(code) || SERVER_REFUSALS.has(code)) return true;
    if (
      code.startsWith('08') ||
      code.startsWith('57P') ||
      code.startsWith('58') ||
      ['40001', '40P01'].includes(code)
    )
      return true;
  }
  const msg = (err as Error | null)?.message ?? '';
  return /ECONNREFUSED|ECONNRESET|Connection terminated|not queryable|timeout|ETIMEDOUT|EPIPE/i.test(msg);
}
