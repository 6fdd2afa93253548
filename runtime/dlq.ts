/**
 * DLQ tooling: list, inspect and replay the messages the consumer dead-lettered.
 *
 *   node dist/runtime/dlq.js list    [--activity ID] [--limit N] [--json]
 *   node dist/runtime/dlq.js inspect <partition:offset> [--activity ID]
 *   node dist/runtime/dlq.js replay  <partition:offset>... | --all [--activity ID]
 *   node dist/runtime/dlq.js ack     <partition:offset>... | --all [--activity ID]
 *   (also `node dist/runtime/main.js dlq ...`; in development `node --import tsx runtime/dlq.ts ...`)
 *
 * Environment: KAFKA_BROKERS (required), KAFKA_TOPIC_PREFIX (default flashsale), ACTIVITY_ID
 * (instead of --activity).
 *
 * Replay produces the message's original key and value to the activity's order topic with the
 * idempotent producer, and only while the activity's consumer group has a member (else it refuses,
 * exit 1: nothing would make the replayed message an order) (the dlq-* headers are replaced by dlq-replayed-from). Replaying is safe any
 * number of times: the consumer's unique keys (reservation id; live buyer slot) turn a repeated
 * message into the same single order. The DLQ itself is never modified: its retention ages
 * messages out, and `list` shows each message's replay command.
 *
 * Handled offsets: a replayed message, and one acknowledged with `ack` (looked at and decided not
 * to replay), is handled. Each partition's handled offset (a consumer group's committed offset,
 * core/kafka.ts `commitHandled`) moves over the handled messages that follow it in order; the
 * messages after it are `flashsale_dlq_unhandled`, which the DLQ alert watches. A message behind
 * one still unhandled cannot be recorded handled: `replay` and `ack` refuse it (exit 1, nothing
 * done), naming the earlier ones to handle first or with it.
 */
import { randomBytes } from 'node:crypto';
import type { Admin, IHeaders, Kafka } from 'kafkajs';
import {
  advanceHandled,
  commitHandled,
  createKafka,
  handledOffsets,
  idempotentProducer,
  topicsFor,
} from '../core/kafka.js';
import { isSafeId } from '../core/keys.js';
import { UsageError, cliCommand, commandLine, missingVariable, runIfMain } from './cli.js';

export interface DlqMessage {
  partition: number;
  offset: string;
  timestamp: string;
  key: string | null;
  value: string;
  headers: Record<string, string>;
}

function headerText(headers: IHeaders | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers ?? {})) {
    if (v === undefined) continue;
    out[k] = (Array.isArray(v) ? v.map((x) => x.toString()).join(',') : v.toString()) ?? '';
  }
  return out;
}

/** Reads every message currently in `topic` (a throwaway consumer group, deleted afterwards). */
export async function readTopic(kafka: Kafka, topic: string, timeoutMs = 60_000): Promise<DlqMessage[]> {
  const admin = kafka.admin();
  await admin.connect();
  const groupId = `flashsale-dlq-tool-${randomBytes(6).toString('hex')}`;
  try {
    const offsets = await admin.fetchTopicOffsets(topic);
    const remaining = new Map<number, bigint>();
    for (const p of offsets)
      if (BigInt(p.high) > BigInt(p.low)) remaining.set(p.partition, BigInt(p.high) - 1n);
    if (remaining.size === 0) return [];
    const consumer = kafka.consumer({ groupId, maxWaitTimeInMs: 200, allowAutoTopicCreation: false });
    const messages: DlqMessage[] = [];
    await consumer.connect();
    try {
      await consumer.subscribe({ topic, fromBeginning: true });
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`timed out reading ${topic}`)), timeoutMs);
        consumer
          .run({
            autoCommit: false,
            eachMessage: async ({ partition, message }) => {
              messages.push({
                partition,
                offset: message.offset,
                timestamp: new Date(Number(message.timestamp)).toISOString(),
                key: message.key ? message.key.toString('utf8') : null,
                value: message.value ? message.value.toString('utf8') : '',
                headers: headerText(message.headers),
              });
              const last = remaining.get(partition);
              if (last !== undefined && BigInt(message.offset) >= last) remaining.delete(partition);
              if (remaining.size === 0) {
                clearTimeout(timer);
                resolve();
              }
            },
          })
          .catch(reject);
      });
    } finally {
      await consumer.disconnect();
    }
    return messages.sort((x, y) => x.partition - y.partition || Number(BigInt(x.offset) - BigInt(y.offset)));
  } finally {
    await admin.deleteGroups([groupId]).catch(() => undefined);
    await admin.disconnect();
  }
}

export const replayedFromHeader = 'dlq-replayed-from';

/** Produces the messages back to `topic` (idempotent producer, acks from all in-sync replicas). */
export async function replayMessages(kafka: Kafka, topic: string, messages: DlqMessage[]): Promise<number> {
  if (messages.length === 0) return 0;
  const producer = idempotentProducer(kafka);
  await producer.connect();
  try {
    await producer.send({
      topic,
      acks: -1,
      messages: messages.map((m) => {
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(m.headers)) if (!k.startsWith('dlq-')) headers[k] = v;
        headers[replayedFromHeader] = `${m.partition}:${m.offset}`;
        return { key: m.key, value: m.value, headers };
      }),
    });
  } finally {
    await producer.disconnect();
  }
  return messages.length;
}

const USAGE = `usage: dlq <list|inspect|replay|ack> [options]
  list [--limit N] [--json]              messages in the activity's DLQ (oldest first), handled or not
  inspect <partition:offset>             headers and value of one message
  replay <partition:offset>... | --all   produce the messages back into the order topic (marks them handled);
                                         --all: the messages not handled yet
  ack <partition:offset>... | --all      mark the messages handled without replaying them
options: --activity ID (default $ACTIVITY_ID); env KAFKA_BROKERS, KAFKA_TOPIC_PREFIX`;

interface Args {
  command: string;
  activity: string;
  refs: string[];
  all: boolean;
  json: boolean;
  limit: number;
}

function readArgs(argv: string[], env: NodeJS.ProcessEnv): Args {
  const parsed = commandLine(argv, {
    activity: { type: 'string' },
    limit: { type: 'string' },
    all: { type: 'boolean' },
    json: { type: 'boolean' },
  });
  const [command = '', ...refs] = parsed.positionals;
  const { values } = parsed;
  const args: Args = {
    command,
    activity: values.activity ?? env.ACTIVITY_ID ?? '',
    refs,
    all: values.all ?? false,
    json: values.json ?? false,
    limit: values.limit === undefined ? 1000 : Number(values.limit),
  };
  const odd = refs.find((r) => !/^\d+:\d+$/.test(r));
  if (odd !== undefined) throw new UsageError(`unexpected argument ${odd}`);
  if (!['list', 'inspect', 'replay', 'ack'].includes(command)) throw new UsageError('unknown command');
  if (!isSafeId(args.activity)) throw new UsageError('set --activity or ACTIVITY_ID to a valid activity id');
  if (!Number.isInteger(args.limit) || args.limit < 1)
    throw new UsageError('--limit must be a positive integer');
  if (command === 'inspect' && args.refs.length !== 1)
    throw new UsageError('inspect takes one partition:offset');
  if ((command === 'replay' || command === 'ack') && args.refs.length === 0 && !args.all) {
    throw new UsageError(`${command} needs partition:offset references or --all`);
  }
  return args;
}

/** Runs the command; returns the process exit code. Output goes to `out`. */
export const runDlqCli = cliCommand(USAGE, readArgs, async (args, env, out, err) => {
  const brokers = (env.KAFKA_BROKERS ?? '')
    .split(',')
    .map((b) => b.trim())
    .filter(Boolean);
  if (brokers.length === 0) return missingVariable('KAFKA_BROKERS', err);
  const topics = topicsFor(args.activity, env.KAFKA_TOPIC_PREFIX || 'flashsale');
  const kafka = createKafka(brokers, `flashsale-dlq-${process.pid}`);
  const all = await readTopic(kafka, topics.dlq);
  const ref = (m: DlqMessage) => `${m.partition}:${m.offset}`;
  if (args.command === 'list') {
    const handled = await withAdmin(kafka, (admin) => handledOffsets(admin, topics));
    const isHandled = (m: DlqMessage) => BigInt(m.offset) < (handled.get(m.partition) ?? 0n);
    const shown = all.slice(0, args.limit).map((m) => ({ ...m, handled: isHandled(m) }));
    if (args.json) out(JSON.stringify(shown, null, 2));
    else {
      out(
        `${all.length} message(s) in ${topics.dlq}, ${all.filter((m) => !isHandled(m)).length} not handled`,
      );
      for (const m of shown) {
        let rid = m.headers['reservation-id'] ?? '';
        if (!rid) {
          try {
            rid = String((JSON.parse(m.value) as { reservationId?: unknown }).reservationId ?? '');
          } catch {
            rid = '(unparseable)';
          }
        }
        out(
          `${ref(m)}\t${m.handled ? 'handled' : 'UNHANDLED'}\t${m.timestamp}\treservation=${rid || '?'}\tattempts=${m.headers['dlq-attempts'] ?? '?'}\terror=${m.headers['dlq-error'] ?? ''}`,
        );
      }
    }
    return 0;
  }
  const byRef = new Map(all.map((m) => [ref(m), m]));
  const missing = args.refs.filter((r) => !byRef.has(r));
  if (missing.length > 0) {
    err(`not in ${topics.dlq}: ${missing.join(', ')}\n`);
    return 1;
  }
  if (args.command === 'inspect') {
    const m = byRef.get(args.refs[0]!)!;
    let value: unknown = m.value;
    try {
      value = JSON.parse(m.value);
    } catch {
      // shown as the raw string
    }
    out(JSON.stringify({ ...m, value }, null, 2));
    return 0;
  }
  // --all takes what is not handled yet: a message acknowledged as refused, sent again, would be
  // refused again and dead-lettered anew, a new copy on every later --all. A message named by its
  // reference is taken whatever its state (replaying a valid order again is safe).
  const handled = await withAdmin(kafka, (admin) => handledOffsets(admin, topics));
  const notHandled = (m: DlqMessage): boolean => BigInt(m.offset) >= (handled.get(m.partition) ?? 0n);
  const chosen = args.all ? all.filter(notHandled) : args.refs.map((r) => byRef.get(r)!);
  // The handled state is one offset per partition: a message handled behind one still unhandled
  // cannot be recorded, and is counted, and taken by a later --all, as if nobody had handled it.
  // An acknowledged one must not be sent again (it is refused anew, or becomes an order for a
  // reservation released by hand), so `ack` refuses it; a replay may be repeated (one order of
  // every copy), so it goes ahead, saying what stays counted.
  const firstOpen = new Map<number, bigint>();
  if (!args.all) {
    const named = new Set(chosen.map(ref));
    for (const m of all) {
      if (!notHandled(m) || named.has(ref(m))) continue;
      const o = BigInt(m.offset);
      if (o < (firstOpen.get(m.partition) ?? o + 1n)) firstOpen.set(m.partition, o);
    }
  }
  const behind = chosen.filter(
    (m) => notHandled(m) && BigInt(m.offset) > (firstOpen.get(m.partition) ?? BigInt(m.offset)),
  );
  const after = (m: DlqMessage): string =>
    `${ref(m)} comes after ${m.partition}:${firstOpen.get(m.partition)!}`;
  if (behind.length > 0 && args.command === 'ack') {
    err(
      `nothing done: ${behind.map(after).join('; ')}, not handled yet. The handled offset moves over a ` +
        "partition's messages in order, so a later one cannot be recorded handled before it: handle " +
        'the earlier one first, or name it in the same command\n',
    );
    return 1;
  }
  if (args.command === 'replay') {
    // A replay is handled once Kafka has it; only a consumer makes it an order. With none in the
    // group (an activity Completed, its consumer scaled to zero) the order would never be written
    // while the count of unhandled dead letters, and its alert, went to zero.
    if (
      chosen.length > 0 &&
      (await withAdmin(kafka, (admin) => groupMembers(admin, topics.consumerGroup))) === 0
    ) {
      err(
        `no consumer reads ${topics.orders} (its group ${topics.consumerGroup} has no member): ` +
          'a replayed message would become no order, yet count as handled. Replay while the ' +
          "activity's consumer runs (an activity stays in Settling, its consumer running, until " +
          'its dead letters are handled); otherwise write the order by hand, then `ack` it\n',
      );
      return 1;
    }
    const n = await replayMessages(kafka, topics.orders, chosen);
    out(`replayed ${n} message(s) from ${topics.dlq} into ${topics.orders}`);
    if (behind.length > 0)
      out(
        `still counted (handle the earlier ones, then replay or ack these again): ${behind.map(after).join('; ')}`,
      );
  }
  // Only after the replay was acknowledged by Kafka: a replay that failed leaves them unhandled.
  const done = new Set(chosen.map(ref));
  const offsets = await withAdmin(kafka, (admin) =>
    commitHandled(admin, topics, (current) => advanceHandled(current, all, done)),
  );
  const unhandled = all.filter((m) => BigInt(m.offset) >= (offsets.get(m.partition) ?? 0n)).length;
  out(
    `handled offsets ${[...offsets].map(([p, o]) => `${p}:${o}`).join(' ') || '(none)'}; ${unhandled} message(s) not handled`,
  );
  return 0;
});

/** Members of a consumer group now (0 for a group that is empty or never existed). */
async function groupMembers(admin: Admin, groupId: string): Promise<number> {
  const { groups } = await admin.describeGroups([groupId]);
  return groups.find((g) => g.groupId === groupId)?.members.length ?? 0;
}

async function withAdmin<T>(kafka: Kafka, f: (admin: Admin) => Promise<T>): Promise<T> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    return await f(admin);
  } finally {
    await admin.disconnect();
  }
}

runIfMain(import.meta.url, runDlqCli);
