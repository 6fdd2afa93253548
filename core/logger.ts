/**
 * The pino root logger. Levels: error = something is wrong and should be zero in a healthy
 * system; warn = a retry or a refused state change; info = lifecycle; debug = per request.
 * Secrets never reach a log line: connection URLs are redacted with redactUrl().
 */
import { destination, pino } from 'pino';
import type { Logger } from 'pino';

export type { Logger };

export function createLogger(name: string, level = process.env.LOG_LEVEL ?? 'info'): Logger {
  return pino(
    {
      name,
      level,
      base: { component: name },
      redact: {
        paths: ['*.password', '*.secret', '*.token', 'req.headers.authorization'],
        censor: '[redacted]',
      },
    },
    // Synchronous, like Node's own stdout on a pipe. pino's default stdout stream writes
    // asynchronously, and the flush it runs at process.exit can overtake a write still in
    // flight: the last lines of a graceful shutdown came out of order (the shutdown order is read
    // from them). Per-request lines are debug-level, so the hot path does not pay for this.
    destination({ dest: 1, sync: true }),
  );
}

/** Query parameters that carry credentials (libpq's `password`, `sslpassword`, tokens, keys …). */
const SECRET_PARAM = /pass|pwd|secret|token|key|auth|credential|signature|sig$/i;

/**
 * postgres://user:secret@host/db?sslpassword=x -> postgres://user:***@host/db?sslpassword=***
 * The password of the authority and every query parameter whose name looks like a credential are
 * masked; drivers accept passwords in either place.
 */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    for (const name of [...new Set(u.searchParams.keys())]) {
      if (SECRET_PARAM.test(name)) u.searchParams.set(name, '***');
    }
    return u.toString();
  } catch {
    return '[unparseable url]';
  }
}
