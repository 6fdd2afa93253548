/**
 * The activity definition the cache is loaded with, built from the resource, and the rules for
 * which spec edits may reach a live cache. Pure functions.
 */
import { Decimal } from 'decimal.js';
import type { LoadedDefinition } from '../../core/loaded-definition.js';
import type { ActivityDefinition, CatalogItem, GateState } from '../../core/model.js';
import type { FlashSaleActivity, ItemSpec, Phase } from '../api/v1alpha1/types.js';
import { Phase as P } from '../api/v1alpha1/types.js';

/** "1999" and "1999.0" become "1999.00": the catalog's numeric(14,2) form, so both compare equal. */
export function normalizePrice(price: string): string {
  return new Decimal(price).toFixed(2);
}

export function itemsFromSpec(items: readonly ItemSpec[]): CatalogItem[] {
  return items.map((i) => ({
    skuId: i.skuId,
    name: i.name,
    price: normalizePrice(i.price),
    stock: i.stock,
    limitPerUser: i.limitPerUser,
    // 1 stays: "not split" given by the spec is not left to the automatic choice.
    ...(i.buckets !== undefined ? { buckets: i.buckets } : {}),
  }));
}

export function buildDefinition(
  fsa: FlashSaleActivity,
  activityId: string,
  items: readonly CatalogItem[],
): ActivityDefinition {
  return {
    id: activityId,
    generation: fsa.metadata.generation,
    startAt: new Date(fsa.spec.schedule.startAt),
    endAt: new Date(fsa.spec.schedule.endAt),
    requireOrderCode: fsa.spec.requireOrderCode,
    reopenOnRelease: fsa.spec.reopenOnRelease,
    items: items.map((i) => ({ ...i, price: normalizePrice(i.price) })),
  };
}

export interface DefinitionDiff {
  /** Every difference, human-readable ("sku a: stock 10 -> 12"). */
  changes: string[];
  /** The differences that may not reach the cache in this phase. */
  unsafe: string[];
}

const LIVE: readonly Phase[] = [P.Active];
const ENDED: readonly Phase[] = [P.Draining, P.WritingBack, P.CleaningUp, P.Completed, P.Failed];

/**
 * The phase an edit is judged in: the recorded one, unless the gate is already past it. A step
 * changes the gate first and records its phase after, so a crash or a conflicting write in between
 * leaves an open gate under Ready (the sale is live) or a closed one under Active (it has ended);
 * an edit admitted for the recorded phase must still meet the rules of the one buyers meet.
 */
export function phaseOfGate(phase: Phase, gate: GateState): Phase {
  if (gate === 'closed' && (phase === P.Ready || phase === P.Active)) return P.Draining;
  if ((gate === 'open' || gate === 'paused') && phase === P.Ready) return P.Active;
  return phase;
}

/**
 * Compares the definition in the cache with the one the spec now asks for. Always unsafe: removing
 * an item, lowering stock (sold units cannot be un-sold). Unsafe once the sale is Active: moving
 * startAt, shortening endAt, changing an item's price, name or limit, changing the order-code or
 * release policy. Safe while Active: extending endAt, adding stock, adding items. Once the sale
 * has ended nothing may change.
 */
/** Differences named at most in one message (a status condition, an Event). */
export const CHANGES_LISTED = 20;

/**
 * The differences as one message: the first CHANGES_LISTED, then how many more. A catalog of
 * thousands of SKUs repriced at once would otherwise make a condition message longer than the CRD
 * allows (32768), and every status write after it fail.
 */
export function listChanges(changes: readonly string[]): string {
  const shown = changes.slice(0, CHANGES_LISTED).join('; ');
  const more = changes.length - CHANGES_LISTED;
  return more > 0 ? `${shown}; ... and ${more} more difference(s)` : shown;
}

export function diffDefinition(
  loaded: LoadedDefinition,
  desired: ActivityDefinition,
  phase: Phase,
): DefinitionDiff {
  const changes: string[] = [];
  const unsafe: string[] = [];
  const live = LIVE.includes(phase);
  const ended = ENDED.includes(phase);
  const note = (text: string, isUnsafe: boolean): void => {
    changes.push(text);
    if (isUnsafe || ended) unsafe.push(text);
  };
  const iso = (ms: number): string => new Date(ms).toISOString();
  const start = desired.startAt.getTime();
  const end = desired.endAt.getTime();
  if (start !== loaded.startMs) note(`startAt ${iso(loaded.startMs)} -> ${iso(start)}`, live);
  if (end !== loaded.endMs) {
    note(
      `endAt ${iso(loaded.endMs)} -> ${iso(end)}${end < loaded.endMs ? ' (shortened)' : ''}`,
      live && end < loaded.endMs,
    );
  }
  if (desired.requireOrderCode !== loaded.requireOrderCode) {
    note(`requireOrderCode ${loaded.requireOrderCode} -> ${desired.requireOrderCode}`, live);
  }
  if (desired.reopenOnRelease !== loaded.reopenOnRelease) {
    note(`reopenOnRelease ${loaded.reopenOnRelease} -> ${desired.reopenOnRelease}`, live);
  }
  const wanted = new Map(desired.items.map((i) => [i.skuId, i]));
  for (const old of loaded.items) {
    const next = wanted.get(old.skuId);
    if (!next) {
      note(`sku ${old.skuId} removed (items cannot be removed once loaded)`, true);
      continue;
    }
    if (next.stock !== old.stock) {
      const lower = next.stock < old.stock;
      note(
        `sku ${old.skuId}: stock ${old.stock} -> ${next.stock}${lower ? ' (stock can only grow)' : ''}`,
        lower,
      );
    }
    if (normalizePrice(next.price) !== normalizePrice(old.price || '0')) {
      note(`sku ${old.skuId}: price ${old.price} -> ${normalizePrice(next.price)}`, live);
    }
    if (next.name !== old.name) note(`sku ${old.skuId}: name changed`, live);
    if (next.limitPerUser !== old.limitPerUser) {
      note(`sku ${old.skuId}: limitPerUser ${old.limitPerUser} -> ${next.limitPerUser}`, live);
    }
    // The stock was split when it was loaded; the CRD refuses the edit, this catches the rest.
    if ((next.buckets ?? 1) !== (old.buckets ?? 1)) {
      note(`sku ${old.skuId}: buckets ${old.buckets ?? 1} -> ${next.buckets ?? 1} (fixed once loaded)`, true);
    }
  }
  const known = new Set(loaded.items.map((i) => i.skuId));
  for (const item of desired.items) {
    if (!known.has(item.skuId)) note(`sku ${item.skuId} added (stock ${item.stock})`, false);
  }
  return { changes, unsafe };
}
