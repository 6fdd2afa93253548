/**
 * kafkajs' log lines through the process's pino logger, with repeats held back.
 *
 * Why: kafkajs writes its own JSON (its `level` a word, its own `timestamp`) straight to the
 * console, so a log pipeline reading the runtime's pino lines saw two formats, and with Kafka away
 * it logs one ERROR per connection attempt of every client (every few seconds per producer,
 * consumer and admin). Here each line becomes a pino line (`lib: "kafkajs"`, kafkajs' namespace
 * and fields kept), and a line that repeats one already logged within `repeatWindowMs` (the same
 * level, namespace, message, broker, error) is counted instead of written; the next one after the
 * window is written with `repeated: <how many were held back>`. The first of every kind always
 * gets out, so an outage is in the log from its first second.
 *
 * kafkajs' ERROR becomes pino's warn (`kafkajsLevel: "ERROR"` kept): kafkajs logs at ERROR every
 * failed attempt it then retries (a refused connection, "the group coordinator is not available"),
 * which is a retry in this project's levels (core/logger.ts). What finally fails reaches the
 * caller as a rejected promise, and the caller logs that at its own level.
 */
import { logLevel } from 'kafkajs';
import type { LogEntry, logCreator } from 'kafkajs';
import type { Logger } from './logger.js';

export interface KafkaLogOptions {
  /** How long after a line its repeats are counted rather than written (default 60 s). */
  repeatWindowMs?: number;
  /** Clock (tests). */
  now?: () => number;
}

/** Fields that change from one repeat of the same event to the next; never part of its identity. */
const VOLATILE = new Set([
  'timestamp',
  'logger',
  'message',
  'stack',
  'correlationId',
  'retryCount',
  'retryTime',
  'size',
]);
/** Above this many kinds of line remembered, the ones whose window has passed are forgotten. */
const MAX_REMEMBERED = 512;

type Level = 'warn' | 'info' | 'debug';

/** A field's value as text for a line's identity; never throws (circular values, BigInt). */
function textOf(v: unknown): string {
  if (typeof v === 'string') return v;
  try {
    return JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}

function levelOf(level: logLevel): Level | undefined {
  switch (level) {
    case logLevel.ERROR:
      return 'warn';
    case logLevel.WARN:
      return 'warn';
    case logLevel.INFO:
      return 'info';
    case logLevel.DEBUG:
      return 'debug';
    default:
      return undefined;
  }
}

/** The kafkajs `logCreator` that writes to `logger` (see the module comment). */
export function kafkajsLogCreator(logger: Logger, options: KafkaLogOptions = {}): logCreator {
  const windowMs = options.repeatWindowMs ?? 60_000;
  const now = options.now ?? Date.now;
  const log = logger.child({ lib: 'kafkajs' });
  /** Per kind of line: when it was last written and how many repeats were held back since. */
  const seen = new Map<string, { writtenAt: number; heldBack: number }>();

  const forgetOld = (t: number): void => {
    if (seen.size < MAX_REMEMBERED) return;
    for (const [key, s] of seen) if (t - s.writtenAt >= windowMs) seen.delete(key);
  };

  const write = ({ namespace, level, label, log: entry }: LogEntry): void => {
    const method = levelOf(level);
    if (!method) return;
    // kafkajs passes an Error as the message in places (cluster/brokerPool.js).
    const raw: unknown = entry.message;
    const message = raw instanceof Error ? `${raw.name}: ${raw.message}` : String(raw);
    const fields: Record<string, unknown> = { namespace, kafkajsLevel: label };
    for (const [k, v] of Object.entries(entry))
      if (k !== 'timestamp' && k !== 'logger' && k !== 'message') fields[k] = v;
    const identity = [
      label,
      namespace,
      message,
      ...Object.entries(entry)
        .filter(([k]) => !VOLATILE.has(k))
        .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        .map(([k, v]) => `${k}=${textOf(v)}`),
    ].join('\u0000');
    const t = now();
    const s = seen.get(identity);
    if (s && t - s.writtenAt < windowMs) {
      s.heldBack += 1;
      return;
    }
    if (s && s.heldBack > 0) fields.repeated = s.heldBack;
    forgetOld(t);
    seen.set(identity, { writtenAt: t, heldBack: 0 });
    log[method](fields, message);
  };

  // kafkajs calls its logger inside its own retry and rebalance paths: a line that cannot be
  // written must never throw into them.
  return () =>
    (entry: LogEntry): void => {
      try {
        write(entry);
      } catch {
        // nothing to do: the line is lost, kafkajs carries on
      }
    };
}
