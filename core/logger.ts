/**
 * The pino root logger. Levels: error = something is wrong and should be zero in a healthy
 * system; warn = a retry or a refused state change; info = lifecycle; debug = per request.
 * Secrets never reach a log line: connection URLs are redacted with redactUrl().
 */
import { pino } from 'pino';
import type { Logger } from 'pino';

export type { Logger };

export function createLogger(name: string, level = process.env.LOG_LEVEL ?? 'info'): Logger {
  return pino({
    name,
    level,
    base: { component: name },
    redact: {
      paths: ['*.password', '*.secret', '*.token', 'req.headers.authorization'],
      censor: '[redacted]',
    },
  });
}

/** postgres://user:secret@host/db -> postgres://user:***@host/db */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '[unparseable url]';
  }
}
