// An in-process stand-in for relay + consumer, for the after-sale scenarios (windows 7-9) that
// exercise PostgreSQL/Redis functions rather than the processes: it takes every half message from
// the outbox, inserts the orders with the consumer's statement (insertOrders) and their
// ORDER_CREATED journal rows in one transaction (as the consumer does), records the
// buyers' results (which confirms the ledger) and deletes the entries, as the relay does after
// Kafka acked them.
import type { Redis } from 'ioredis';
import { recordResults } from '../../../core/activity-cache.js';
import { appendJournal } from '../../../core/db/journal-store.js';
import { insertOrders } from '../../../core/db/orders-store.js';
import { inTransaction } from '../../../core/db/pool.js';
import type { Pool } from '../../../core/db/pool.js';
import { activityKeys } from '../../../core/keys.js';
import type { OrderMessage } from '../../../core/model.js';

export async function drainOutbox(
  redis: Redis,
  pool: Pool,
  activityId: string,
  paymentTimeoutSeconds: number,
): Promise<Map<string, string>> {
  const k = activityKeys(activityId);
  const ids = new Map<string, string>();
  for (;;) {
    const entries = await redis.xrange(k.outbox, '-', '+', 'COUNT', 500);
    if (entries.length === 0) return ids;
    const messages: OrderMessage[] = entries.map(([, fields]) => {
      const i = fields.indexOf('m');
      return JSON.parse(fields[i + 1]!) as OrderMessage;
    });
    const byRid = new Map(messages.map((m) => [m.reservationId, m]));
    const outcome = await inTransaction(pool, async (c) => {
      const o = await insertOrders(c, messages, paymentTimeoutSeconds);
      await appendJournal(
        c,
        [...o.inserted].map(([rid, orderId]) => ({
          activityId,
          reservationId: rid,
          orderId,
          event: 'ORDER_CREATED',
          toStatus: 'UNPAID',
          traceId: byRid.get(rid)?.traceId ?? '',
        })),
      );
      return o;
    });
    await recordResults(redis, activityId, [
      ...[...outcome.inserted].map(([rid, orderId]) => ({
        reservationId: rid,
        userId: byRid.get(rid)!.userId,
        result: { status: 'CREATED' as const, orderId },
      })),
      ...[...outcome.existing].map(([rid, o]) => ({
        reservationId: rid,
        userId: byRid.get(rid)!.userId,
        result:
          o.status === 'CLOSED'
            ? { status: 'FAILED' as const, reason: 'CLOSED' }
            : { status: 'CREATED' as const, orderId: o.id },
      })),
    ]);
    for (const [rid, id] of outcome.inserted) ids.set(rid, id);
    for (const [rid, o] of outcome.existing) ids.set(rid, o.id);
    await redis.xdel(k.outbox, ...entries.map(([id]) => id));
  }
}
