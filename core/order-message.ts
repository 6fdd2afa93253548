/**
 * The order message (the half message), defined once. reserve-9.lua writes it twice in the same
 * step: as the reservation hash (short field names, the ledger entry that gap repair and the after
 * order paths read back) and as the outbox stream entry (the JSON message, plus the Kafka key and
 * headers as separate fields so that the relay forwards the entry without parsing it). The type,
 * the consumer's validation, the gap repair's check and the reservation record all derive from the
 * schema below; test/integration/invariants/order-message.test.ts checks that what the script
 * writes is exactly what this file knows.
 */
import { z } from 'zod';

/** States of a reservation hash (its `state` field). */
export type ReservationState = 'RESERVED' | 'RELEASED' | 'CANCELLED' | 'PAID';

/**
 * What the consumer accepts. Nothing arriving on Kafka is trusted (ARCHITECTURE.md): the bounds
 * below are the shape only; the consumer checks the content against the activity's items.
 */
export const orderMessageSchema = z.object({
  reservationId: z.string().min(1).max(64),
  activityId: z.string().min(1).max(63),
  // The alphabet the api accepts for a buyer id (runtime/api/auth.ts).
  userId: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$/),
  skuId: z.string().min(1).max(63),
  quantity: z.number().int().min(1).max(1_000_000),
  slot: z.number().int().min(1).max(32_767),
  unitPrice: z.string().regex(/^\d{1,12}(\.\d{1,2})?$/),
  itemName: z.string().min(1),
  reservedAt: z.number().int().positive(),
  traceId: z.string(),
  requestId: z.string(),
});

/** The half message: the outbox entry written by reserve-9.lua, relayed to Kafka verbatim. */
export type OrderMessage = z.infer<typeof orderMessageSchema>;

/** Whether a message (e.g. rebuilt from a ledger entry) is one the consumer would accept. */
export function isValidOrderMessage(m: unknown): m is OrderMessage {
  return orderMessageSchema.safeParse(m).success;
}

type LedgerField = Exclude<keyof OrderMessage, 'reservationId' | 'activityId'>;

/**
 * The reservation hash's field for each message field (reserve-9.lua's HSET). The key is the
 * hash's own key (reservation id) and the activity is in its hash tag, so those two are not
 * stored. `satisfies` makes a schema field without a hash field (or the reverse) a compile error.
 */
export const RESERVATION_HASH_FIELDS = {
  userId: 'user',
  skuId: 'sku',
  quantity: 'qty',
  slot: 'slot',
  unitPrice: 'price',
  itemName: 'name',
  reservedAt: 'ts',
  traceId: 'trace',
  requestId: 'req',
} as const satisfies Record<LedgerField, string>;

/**
 * Fields the lifecycle scripts add to a reservation hash besides the message: its state, and when
 * and why it was released or cancelled (release-6.lua, cancelBeforeReserve-3.lua) or taken back
 * (reclaimPaid-5.lua).
 */
export const RESERVATION_STATE_FIELDS = ['state', 'releasedAt', 'reason', 'reclaimedAt'] as const;

/**
 * A reservation as read back from its hash: the message's fields (but the activity, implied by
 * the key) and its state. A cancel marker has only `state` and `userId`; the other fields are
 * empty then, which `isValidOrderMessage` refuses.
 */
export type ReservationRecord = Omit<OrderMessage, 'activityId'> & { state: ReservationState };

const numeric = (field: LedgerField): boolean => orderMessageSchema.shape[field] instanceof z.ZodNumber;

/** A reservation hash (HGETALL) as a record; undefined when there is no reservation. */
/**
 * The state of a claim (lua/claimRequest-2.lua): a hash in the activity's scope under the id of a
 * reservation made in a stock bucket. Not a reservation: readers look in the bucket.
 */
export const CLAIM_STATE = 'ELSEWHERE';

/**
 * The state of a cancel marker (lua/cancelBeforeReserve-3.lua): a buyer's cancellation of a
 * submission that had not reserved when it arrived. No script gives a reservation this state (a
 * cancelled reservation is RELEASED with reason CANCELLED).
 */
export const CANCEL_MARKER_STATE = 'CANCELLED' satisfies ReservationState;

export function reservationRecordOf(
  reservationId: string,
  hash: Record<string, string>,
): ReservationRecord | undefined {
  if (!hash.state || hash.state === CLAIM_STATE) return undefined;
  const record: Record<string, string | number> = { reservationId, state: hash.state };
  for (const [field, hashField] of Object.entries(RESERVATION_HASH_FIELDS) as [LedgerField, string][]) {
    const v = hash[hashField];
    record[field] = numeric(field) ? Number(v ?? 0) : (v ?? '');
  }
  return record as ReservationRecord;
}

/** Rebuilds the half message of a reservation from its ledger entry (order-gap repair). */
export function orderMessageOf(activityId: string, r: ReservationRecord): OrderMessage {
  const { state: _state, reservationId, ...rest } = r;
  return { reservationId, activityId, ...rest };
}

/**
 * The fields of an outbox stream entry (reserve-9.lua's XADD). `key` and `trace` repeat the
 * message's buyer and trace id so that the relay builds the Kafka message from the fields alone;
 * entries written before they existed carry only `rid` and `m` (the relay parses `m` for those).
 */
export const OUTBOX_FIELDS = {
  reservationId: 'rid',
  /** The Kafka partition key: the buyer id (one buyer's messages in order on one partition). */
  key: 'key',
  traceId: 'trace',
  /** The order message as JSON: the Kafka message's value, byte for byte. */
  message: 'm',
} as const;

/**
 * Order batches on Kafka. The relay puts the half messages of one partition into one Kafka
 * message: their JSON texts byte for byte, one per line (a JSON text never holds a raw newline),
 * with the header `orders` giving their number. A message without that header is one order, as
 * every message was before batches; the consumer takes both. Kafka's cost is mostly per record
 * (encoding, CRC, the broker's per-record work, the consumer's decoding), so a batch of a few
 * hundred orders costs about what one order did (docs/benchmarks.md, "Order batches").
 */
export const ORDER_BATCH_HEADER = 'orders';

/**
 * Largest batch message in bytes: well below Kafka's default `message.max.bytes` (1 MB), which a
 * broker or topic may keep. A half message is about 300 bytes, so this bounds a batch only when
 * item names are long.
 */
export const ORDER_BATCH_MAX_BYTES = 512 * 1024;

/** Most orders in one batch message (the relay's RELAY_ORDERS_PER_MESSAGE at most). */
export const ORDER_BATCH_MAX_ORDERS = 10_000;

/**
 * The order texts of a Kafka message's value: one per line when batched, else the whole value.
 * Undefined for a batch that is not one the relay writes: its `orders` header is not a count of
 * 1..ORDER_BATCH_MAX_ORDERS, or the value does not hold that many lines. Such a message is dead-
 * lettered whole, once, instead of line by line (a megabyte of newlines is a million "orders").
 */
export function orderTextsOf(value: string, batchHeader: string | undefined): string[] | undefined {
  if (batchHeader === undefined) return [value];
  const count = Number(batchHeader);
  if (!Number.isInteger(count) || count < 1 || count > ORDER_BATCH_MAX_ORDERS) return undefined;
  // Counted before splitting: a value of far more lines is refused without an array of them.
  let lines = 1;
  for (let at = value.indexOf('\n'); at !== -1; at = value.indexOf('\n', at + 1)) {
    lines += 1;
    if (lines > count) return undefined;
  }
  return lines === count ? value.split('\n') : undefined;
}
