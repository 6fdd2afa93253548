/**
 * Order-gap repair (docs/sources seed 000): a reservation still without an order after the threshold
 * (checkOrderGap's `missing`) is
 *   - re-published from its ledger entry to the activity topic with the idempotent producer (the
 *     consumer's unique keys make a duplicate harmless), at most ORDER_GAP_MAX_REPUBLISH times,
 *     ORDER_GAP_REPUBLISH_INTERVAL_SECONDS apart, whatever the number of job replicas (a send that
 *     fails gives its attempt back, so a Kafka outage does not use up the cap); or
 *   - held back while the consumer would refuse it against the activity's item in PostgreSQL
 *     (core/order-refusal.ts: price, limit per buyer, unknown SKU): a copy would only be
 *     dead-lettered again. The first copy is already in the DLQ; once the item is corrected the
 *     next run re-publishes it; or
 *   - compensated when it provably can never become an order: another live order holds the
 *     buyer's slot (the database would refuse it), or its ledger entry cannot form a valid order.
 *     Compensation inserts the order CLOSED first (so a late message cannot create it) and settles
 *     it through the settlement path. An invalid entry found once the gate is frozen (a drain
 *     that timed out before its compensation) cannot be released any more: its unit, held in the
 *     write-back snapshot, goes back to activity_stock once that is committed, and the entry
 *     leaves the ledger (compensateFrozen). A slot held by another live order means Redis forgot that
 *     order's reservation and its stock decrement with it, so (as for the consumer's stock guard,
 *     which closes the same conflict `BUYER_LIMIT_EXCEEDED`) its unit is withheld and the slot kept
 *     (`GAP_COMPENSATED`, core/order-lifecycle.ts guardRelease).
 * Every action is journaled and counted (flashsale_order_gap_repairs_total{action}).
 */
import type { Sender } from '../../core/kafka.js';
import { appendJournal } from '../../core/db/journal-store.js';
import {
  claimFrozenReturn,
  claimRepublish,
  recordGapAction,
  releaseRepublishClaim,
} from '../../core/db/gap-repairs-store.js';
import { inTransaction } from '../../core/db/pool.js';
import { readWriteBack, returnStock } from '../../core/db/stock-store.js';
import { FlashSaleError } from '../../core/errors.js';
import { readActivityItems } from '../../core/db/activity-items-store.js';
import type { ActivityItem } from '../../core/db/activity-items-store.js';
import { findLiveSlotHolder } from '../../core/db/orders-store.js';
import { isValidOrderMessage } from '../../core/order-message.js';
import { refusalOf } from '../../core/order-refusal.js';
import { closeInFlight, settleStock } from '../../core/order-lifecycle.js';
import type { LifecycleDeps } from '../../core/order-lifecycle.js';
import { locateReservation, orderMessageOf, release } from '../../core/reservations.js';
import type { ReservationRecord } from '../../core/reservations.js';

export interface GapRepairDeps extends LifecycleDeps {
  activityId: string;
  topic: string;
  producer: Sender;
  republishIntervalSeconds: number;
  maxRepublish: number;
}

export interface GapRepairReport {
  republished: string[];
  compensated: string[];
  abandoned: string[];
  /** Held back: the consumer would refuse the message (its first copy is in the DLQ). */
  refused: string[];
  waiting: string[];
  skipped: string[];
  failed: string[];
}

export async function repairOrderGap(d: GapRepairDeps, missing: string[]): Promise<GapRepairReport> {
  const report: GapRepairReport = {
    republished: [],
    compensated: [],
    abandoned: [],
    refused: [],
    waiting: [],
    skipped: [],
    failed: [],
  };
  const a = d.activityId;
  const count = (action: keyof GapRepairReport, rid: string) => {
    report[action].push(rid);
    d.metrics?.orderGapRepairs.inc({ activity: a, action });
  };
  // Read once a run, when the first reservation needs them: a corrected item counts from the next run.
  let items: Promise<Map<string, ActivityItem>> | undefined;
  const itemsOf = () => (items ??= readActivityItems(d.pool, a));
  for (const rid of missing) {
    try {
      await repairOne(d, rid, itemsOf, count);
    } catch (err) {
      d.logger.warn(
        { activity: a, reservationId: rid, err: (err as Error).message },
        'order-gap repair failed; retried next run',
      );
      count('failed', rid);
    }
  }
  if (missing.length > 0) {
    d.logger.warn(
      {
        activity: a,
        republished: report.republished.length,
        compensated: report.compensated.length,
        abandoned: report.abandoned.length,
        refused: report.refused.length,
        waiting: report.waiting.length,
        skipped: report.skipped.length,
        failed: report.failed.length,
      },
      'order-gap repair',
    );
  }
  return report;
}

/**
 * An invalid ledger entry once the gate is frozen: Redis refuses every release, and the write-back
 * snapshot counted the entry's unit as held. Once that snapshot is committed (NOT_WRITTEN_BACK
 * until then: retried next run) the unit goes back to activity_stock in one transaction with its
 * claim (exactly once, whatever the number of job replicas) and its journal row; then the entry
 * leaves the ledger (a plain ZREM: the freeze stops scripts, not this). Left in the ledger it kept
 * the order-gap gauge up and cleanup, which waits for an empty ledger, refused for good. True when
 * this call returned the unit.
 */
async function compensateFrozen(
  d: GapRepairDeps,
  ledger: string,
  rid: string,
  rsv: ReservationRecord,
): Promise<boolean> {
  const a = d.activityId;
  const claimed = await inTransaction(d.pool, async (c) => {
    if (!(await readWriteBack(c, a))) {
      throw new FlashSaleError('NOT_WRITTEN_BACK', `activity ${a} is frozen but not written back`);
    }
    if (!(await claimFrozenReturn(c, a, rid))) return false;
    const quantity = Number.isInteger(rsv.quantity) && rsv.quantity > 0 ? rsv.quantity : 0;
    const r = quantity > 0 ? await returnStock(c, a, rsv.skuId, quantity) : { returned: 0, trimmed: 0 };
    await appendJournal(c, [
      {
        activityId: a,
        reservationId: rid,
        event: 'GAP_COMPENSATED',
        toStatus: 'RELEASED',
        traceId: rsv.traceId,
        detail: {
          why: 'invalid ledger entry',
          after: 'write-back',
          returned: r.returned,
          trimmed: r.trimmed,
        },
      },
    ]);
    return true;
  });
  // Also when another run claimed it: that run may have died before this line.
  await d.redis.zrem(ledger, rid);
  return claimed;
}

async function repairOne(
  d: GapRepairDeps,
  rid: string,
  itemsOf: () => Promise<Map<string, ActivityItem>>,
  count: (action: keyof GapRepairReport, rid: string) => void,
): Promise<void> {
  const a = d.activityId;
  // In whichever scope holds it: the activity's, or a stock bucket's.
  const found = await locateReservation(d.redis, a, rid);
  const rsv = found?.record;
  if (!rsv || rsv.state !== 'RESERVED') {
    // Released or cancelled entries leave the ledger in the same script; anything else is odd.
    if (found && rsv && (rsv.state === 'RELEASED' || rsv.state === 'CANCELLED')) {
      await d.redis.zrem(found.scope.ledger, rid);
    } else
      d.logger.warn({ activity: a, reservationId: rid, state: rsv?.state }, 'order gap: odd ledger entry');
    count('skipped', rid);
    return;
  }
  const message = orderMessageOf(a, rsv);
  if (!isValidOrderMessage(message)) {
    // The consumer would refuse it (core/order-message.ts), so it cannot become an order: nothing to close in PostgreSQL, only the stock to give back.
    // What was read above may be stale: another replica's repair (JOBS_IN_CONSUMER runs one per
    // consumer pod, on the same tick) can release the entry in between. Only the release that
    // returned the unit compensates; one that finds it released did nothing.
    let released;
    try {
      released = await release(d.redis, {
        activityId: a,
        reservationId: rid,
        userId: rsv.userId,
        skuId: rsv.skuId,
        reason: 'GAP_COMPENSATED',
      });
    } catch (err) {
      if (!(err instanceof FlashSaleError && err.code === 'FROZEN')) throw err;
      // The freeze refuses every release, of released entries too: under it the state is final,
      // so read it again. An entry released before the freeze had its unit in Redis, which the
      // write-back counted: returning it to PostgreSQL once more would make a unit from nothing.
      const now = await locateReservation(d.redis, a, rid);
      if (now?.record.state !== 'RESERVED') {
        if (now) await d.redis.zrem(now.scope.ledger, rid);
        count('skipped', rid);
        return;
      }
      count((await compensateFrozen(d, found.scope.ledger, rid, rsv)) ? 'compensated' : 'skipped', rid);
      return;
    }
    if (released.kind === 'already-released') {
      count('skipped', rid);
      return;
    }
    await appendJournal(d.pool, [
      {
        activityId: a,
        reservationId: rid,
        event: 'GAP_COMPENSATED',
        toStatus: 'RELEASED',
        traceId: rsv.traceId,
        detail: { why: 'invalid ledger entry' },
      },
    ]);
    await recordGapAction(d.pool, a, rid, 'compensated');
    count('compensated', rid);
    return;
  }
  const holder = await findLiveSlotHolder(d.pool, a, rsv.userId, rsv.skuId, rsv.slot);
  if (holder && holder.reservationId !== rid) {
    const r = await closeInFlight(d, a, rsv, 'GAP_COMPENSATED', rsv.traceId, {
      slotHeldBy: holder.reservationId,
    });
    if (r.kind === 'closed') {
      await appendJournal(d.pool, [
        {
          activityId: a,
          reservationId: rid,
          orderId: r.order.id,
          event: 'GAP_COMPENSATED',
          toStatus: 'CLOSED',
          traceId: rsv.traceId,
          detail: { why: 'buyer slot held by another live order', slotHeldBy: holder.reservationId },
        },
      ]);
      await recordGapAction(d.pool, a, rid, 'compensated');
      count('compensated', rid);
    } else {
      if (r.order?.status === 'CLOSED') await settleStock(d, [r.order]);
      count('skipped', rid); // an order appeared meanwhile: no gap any more
    }
    return;
  }
  const refusal = refusalOf(message, (await itemsOf()).get(message.skuId));
  if (refusal) {
    d.logger.warn(
      { activity: a, reservationId: rid, reason: refusal[0], detail: refusal[1], traceId: rsv.traceId },
      "order gap: not re-published, the consumer would refuse it against the activity's item; correct the item, or decide on the dead letter",
    );
    count('refused', rid);
    return;
  }
  const claim = await claimRepublish(d.pool, a, rid, d.republishIntervalSeconds, d.maxRepublish);
  if (!claim.claimed) {
    if (claim.attempts >= d.maxRepublish) {
      d.logger.error(
        { activity: a, reservationId: rid, attempts: claim.attempts, traceId: rsv.traceId },
        'ORDER GAP: reservation re-published the maximum number of times and still has no order; check the DLQ',
      );
      count('abandoned', rid);
    } else count('waiting', rid);
    return;
  }
  try {
    await d.producer.send({
      topic: d.topic,
      acks: -1,
      messages: [
        {
          key: message.userId,
          value: JSON.stringify(message),
          headers: {
            'trace-id': message.traceId,
            'reservation-id': rid,
            'gap-repair-attempt': String(claim.attempt),
          },
        },
      ],
    });
  } catch (err) {
    // Not sent (as far as we know; a copy that did arrive is deduplicated by the consumer's keys):
    // the attempt is given back, so a Kafka outage does not use up the cap.
    await releaseRepublishClaim(d.pool, a, rid, claim.attempt).catch(() => false);
    throw err;
  }
  await appendJournal(d.pool, [
    {
      activityId: a,
      reservationId: rid,
      event: 'GAP_REPUBLISHED',
      toStatus: 'RESERVED',
      traceId: rsv.traceId,
      detail: { attempt: claim.attempt, topic: d.topic },
    },
  ]);
  count('republished', rid);
}
