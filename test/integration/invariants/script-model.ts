// A reference model of the activity's Redis state and of the Lua scripts that change it
// (lua/reserve-9.lua, release-6.lua, confirmPaid-2.lua, setGate-1.lua, loadItems-var.lua) plus the
// two non-script writers the model-based test drives (the relay deleting acknowledged outbox
// entries, the consumer confirming orders with recordResults) and cleanupActivity.
//
// It is deliberately small and written the way the scripts read, one method per script, so that a
// change of semantics is a change of one method. Parts that other work is expected to change are
// marked "SEMANTICS:" (see docs/faults.md, "Adapting the model").
//
// Every method returns the answer as a string, normalised the same way as the real answers in
// scripts-model.test.ts (`answerOf`): `reserved left=3`, `replayed RESERVED`, `ERR SOLD_OUT 0`, ...
import type { GateState, ReservationState } from '../../../core/model.js';

export interface ModelSku {
  skuId: string;
  stock: number;
  limit: number;
  price: string;
  name: string;
}

export interface ModelConfig {
  activityId: string;
  skus: ModelSku[];
  /** reopenOnRelease: a release gives the buyer their limit back. */
  reopen: boolean;
  startMs: number;
  endMs: number;
  /** reservationIdFor(activity, user, requestId), injected so the model stays pure. */
  ridOf: (user: string, req: string) => string;
  /**
   * The per-buyer rate limit reserve-9.lua counts (requests per window; 0: not passed). Windows
   * are long enough that none ends during a sequence.
   */
  window: number;
}

type Hash = Map<string, string>;

export interface OutboxEntry {
  rid: string;
  message: Record<string, unknown>;
}

/** The Redis state of one activity, key by key, as plain data. */
export interface ModelState {
  meta: Hash | undefined;
  counters: Hash | undefined;
  skuIndex: Set<string>;
  skus: Map<string, Hash>;
  buyers: Map<string, Hash>;
  reservations: Map<string, Hash>;
  ledger: Set<string>;
  /** undefined: the stream key does not exist (XDEL leaves an empty stream behind). */
  outbox: OutboxEntry[] | undefined;
  results: Set<string>;
  /** Set by a cleanup: the results hash is kept with a TTL. */
  resultsExpire: boolean;
  /** Per buyer: the points of their rate-limit window (key `rl:buyer:<buyer>`). */
  windows: Map<string, number>;
}

export function emptyState(): ModelState {
  return {
    meta: undefined,
    counters: undefined,
    skuIndex: new Set(),
    skus: new Map(),
    buyers: new Map(),
    reservations: new Map(),
    ledger: new Set(),
    outbox: undefined,
    results: new Set(),
    resultsExpire: false,
    windows: new Map(),
  };
}

const num = (h: Hash | undefined, f: string): number => Number(h?.get(f) ?? '0');
const incr = (h: Hash, f: string, by: number): number => {
  const v = num(h, f) + by;
  h.set(f, String(v));
  return v;
};
const err = (code: string, ...data: (string | number)[]): string =>
  ['ERR', code, ...data.map(String)].join(' ');

export class ScriptModel {
  readonly s: ModelState = emptyState();

  constructor(readonly cfg: ModelConfig) {}

  private counters(): Hash {
    this.s.counters ??= new Map();
    return this.s.counters;
  }

  /** includes/gateRefusal.lua (the sale window is fixed around "now" by the test). */
  private gateRefusal(): string | undefined {
    const gate = this.s.meta?.get('gate');
    if (gate === undefined) return 'NOT_LOADED';
    if (gate === 'pending') return 'NOT_STARTED';
    if (gate === 'closed' || gate === 'frozen') return 'ENDED';
    if (gate === 'paused') return 'PAUSED';
    return undefined;
  }

  // ---- loadItems-var.lua (through loadActivity: one chunk) -------------------------------------
  load(generation: number, initials: Map<string, number>): string {
    const loadedGen = num(this.s.meta, 'gen');
    if (generation < loadedGen) return err('STALE_GENERATION');
    const items = this.cfg.skus.map((k) => ({ ...k, initial: initials.get(k.skuId) ?? k.stock }));
    for (const it of items) {
      const cur = this.s.skus.get(it.skuId);
      if (cur?.has('initial') && num(cur, 'gen') < generation && it.initial < num(cur, 'initial'))
        return err('STOCK_DECREASE', it.skuId);
    }
    let created = 0;
    let topped = 0;
    let skipped = 0;
    let added = 0;
    for (const it of items) {
      const cur = this.s.skus.get(it.skuId);
      if (!cur?.has('initial')) {
        const h: Hash = cur ?? new Map();
        h.set('stock', String(it.initial));
        h.set('initial', String(it.initial));
        h.set('limit', String(it.limit));
        h.set('price', it.price);
        h.set('name', it.name);
        h.set('gen', String(generation));
        this.s.skus.set(it.skuId, h);
        this.s.skuIndex.add(it.skuId);
        created += 1;
        added += it.initial;
      } else if (num(cur, 'gen') < generation) {
        const delta = it.initial - num(cur, 'initial');
        incr(cur, 'stock', delta);
        cur.set('initial', String(it.initial));
        cur.set('limit', String(it.limit));
        cur.set('price', it.price);
        cur.set('name', it.name);
        cur.set('gen', String(generation));
        topped += 1;
        added += delta;
      } else skipped += 1;
    }
    if (added > 0) incr(this.counters(), 'initial', added);
    this.s.meta ??= new Map();
    const meta = this.s.meta;
    if (!meta.has('gate')) meta.set('gate', 'pending');
    meta.set('startMs', String(this.cfg.startMs));
    meta.set('endMs', String(this.cfg.endMs));
    meta.set('requireCode', '0');
    meta.set('reopen', this.cfg.reopen ? '1' : '0');
    if (generation > loadedGen) {
      meta.set('gen', String(generation));
      incr(meta, 'loads', 1);
    }
    return `loaded created=${created} topped=${topped} skipped=${skipped} added=${added}`;
  }

  // ---- setGate-1.lua --------------------------------------------------------------------------
  setGate(gate: GateState): string {
    const current = this.s.meta?.get('gate');
    if (current === undefined || !this.s.meta) return err('NOT_LOADED');
    if (current === 'frozen' && gate !== 'frozen') return err('FROZEN');
    this.s.meta.set('gate', gate);
    return `gate prev=${current}`;
  }

  // ---- reserve-9.lua --------------------------------------------------------------------------
  reserve(user: string, req: string, sku: string, qty: number): string {
    const rid = this.cfg.ridOf(user, req);
    let prior = this.s.reservations.get(rid);
    if (prior?.has('state') && prior.get('user') !== user) {
      // Another buyer's entry under this id (impossible with derived ids): a cancel marker of
      // theirs is removed, anything else is refused.
      if (prior.get('state') !== 'CANCELLED') return err('MISMATCH', rid);
      this.s.reservations.delete(rid);
      prior = undefined;
    }
    let refusedById: 'CANCELLED' | 'IDEMPOTENCY_CONFLICT' | undefined;
    if (prior?.has('state')) {
      // SEMANTICS: a cancel marker (cancelBeforeReserve-3.lua) or a cancelled reservation.
      if (prior.get('state') === 'CANCELLED') refusedById = 'CANCELLED';
      else if (prior.get('sku') !== sku || Number(prior.get('qty')) !== qty)
        refusedById = 'IDEMPOTENCY_CONFLICT';
      else return `replayed ${prior.get('state')}`;
    }
    // SEMANTICS: the rate limit comes after the replay (free) and before every other refusal,
    // those of the id's own record (cancelled, another SKU or quantity) included.
    if (this.cfg.window > 0) {
      const points = (this.s.windows.get(user) ?? 0) + 1;
      this.s.windows.set(user, points);
      if (points > this.cfg.window) return err('RATE_LIMITED');
    }
    if (refusedById) return err(refusedById, rid);
    const refusal = this.gateRefusal();
    if (refusal) return err(refusal);
    const item = this.s.skus.get(sku);
    if (!item?.has('stock')) return err('UNKNOWN_SKU');
    const stock = num(item, 'stock');
    const limit = num(item, 'limit');
    const buyer = this.s.buyers.get(user) ?? new Map<string, string>();
    // The limit counts units, not requests: one request for several units counts them all.
    if (num(buyer, `${sku}:qty`) + qty > limit) return err('LIMIT_REACHED');
    let slot: number | undefined;
    for (let i = 1; i <= limit; i += 1) {
      if (!buyer.has(`${sku}:slot:${i}`)) {
        slot = i;
        break;
      }
    }
    if (slot === undefined) return err('LIMIT_REACHED');
    if (stock < qty) return err('SOLD_OUT', stock);
    const left = incr(item, 'stock', -qty);
    this.s.buyers.set(user, buyer);
    incr(buyer, `${sku}:qty`, qty);
    buyer.set(`${sku}:slot:${slot}`, rid);
    this.s.reservations.set(
      rid,
      new Map([
        ['state', 'RESERVED'],
        ['user', user],
        ['sku', sku],
        ['qty', String(qty)],
        ['slot', String(slot)],
        ['price', item.get('price') ?? ''],
        ['name', item.get('name') ?? ''],
        ['trace', traceOf(req)],
        ['req', req],
      ]),
    );
    this.s.outbox ??= [];
    this.s.outbox.push({
      rid,
      message: {
        reservationId: rid,
        activityId: this.cfg.activityId,
        userId: user,
        skuId: sku,
        quantity: qty,
        slot,
        unitPrice: item.get('price'),
        itemName: item.get('name'),
        traceId: traceOf(req),
        requestId: req,
      },
    });
    this.s.ledger.add(rid);
    incr(this.counters(), 'reserved', qty);
    incr(this.counters(), 'reservations', 1);
    return `reserved left=${left}`;
  }

  // ---- release-6.lua --------------------------------------------------------------------------
  release(user: string, req: string, sku: string, reason: string): string {
    const rid = this.cfg.ridOf(user, req);
    if (this.s.meta?.get('gate') === 'frozen') return err('FROZEN');
    const r = this.s.reservations.get(rid);
    // It never creates a key: a cancellation before the reservation is cancelBeforeReserve.
    if (!r?.has('state')) return err('UNKNOWN_RESERVATION');
    if (r.get('user') !== user) return err('MISMATCH');
    // SEMANTICS: a cancel marker has no sku and holds no stock.
    if (r.get('state') === 'CANCELLED' && !r.has('sku')) return 'already-released';
    if (r.get('sku') !== sku) return err('MISMATCH');
    const state = r.get('state') as ReservationState;
    if (state === 'RELEASED' || state === 'CANCELLED') return 'already-released';
    // SEMANTICS: late payments (a CLOSED order paid in time) and refunds may change what PAID blocks.
    if (state === 'PAID') return err('ALREADY_PAID');
    const qty = num(r, 'qty');
    const item = this.s.skus.get(sku) ?? new Map<string, string>();
    this.s.skus.set(sku, item);
    const after = incr(item, 'stock', qty);
    if (this.s.meta?.get('reopen') !== '0') {
      const buyer = this.s.buyers.get(user) ?? new Map<string, string>();
      this.s.buyers.set(user, buyer);
      incr(buyer, `${sku}:qty`, -qty);
      // The `<sku>:qty` field stays (at 0), so the buyer's hash outlives its last reservation.
      buyer.delete(`${sku}:slot:${r.get('slot')}`);
    }
    this.s.ledger.delete(rid);
    r.set('state', 'RELEASED');
    r.set('reason', reason);
    incr(this.counters(), 'released', qty);
    return `released after=${after}`;
  }

  // ---- cancelBeforeReserve-3.lua --------------------------------------------------------------
  /** A buyer's cancellation of a submission that has not arrived: an owned, bounded marker. */
  cancelBeforeReserve(user: string, req: string, reason: string, maxMarkers: number): string {
    const rid = this.cfg.ridOf(user, req);
    const gate = this.s.meta?.get('gate');
    if (gate === 'frozen') return err('FROZEN');
    const r = this.s.reservations.get(rid);
    if (r?.has('state')) {
      if (r.get('user') !== user) return err('MISMATCH');
      return `exists ${r.get('state')}`;
    }
    // The sale window is fixed around "now" by the test: only a missing or closed gate ends it.
    if (gate === undefined || gate === 'closed') return 'sale-over';
    const buyer = this.s.buyers.get(user) ?? new Map<string, string>();
    if (num(buyer, 'cancelMarkers') >= maxMarkers) return err('CANCEL_MARKER_LIMIT');
    this.s.reservations.set(
      rid,
      new Map([
        ['state', 'CANCELLED'],
        ['user', user],
        ['reason', reason],
      ]),
    );
    this.s.buyers.set(user, buyer);
    incr(buyer, 'cancelMarkers', 1);
    return 'marked';
  }

  // ---- confirmPaid-2.lua ----------------------------------------------------------------------
  confirmPaid(user: string, req: string): string {
    const rid = this.cfg.ridOf(user, req);
    if (this.s.meta?.get('gate') === 'frozen') return err('FROZEN');
    const r = this.s.reservations.get(rid);
    const state = r?.get('state');
    if (!r || state === undefined) return err('UNKNOWN_RESERVATION');
    if (state === 'PAID') return 'already-paid';
    if (state !== 'RESERVED') return err('RELEASED');
    r.set('state', 'PAID');
    return 'paid';
  }

  // ---- the relay: XACK + XDEL once Kafka acknowledged (runtime/relay/relay.ts) ------------------
  relay(user: string, req: string): string {
    const rid = this.cfg.ridOf(user, req);
    const before = this.s.outbox?.length ?? 0;
    if (this.s.outbox) this.s.outbox = this.s.outbox.filter((e) => e.rid !== rid);
    return `relayed ${before - (this.s.outbox?.length ?? 0)}`;
  }

  // ---- the consumer after its DB commit: recordResults (core/activity-cache.ts) ----------------
  confirmOrder(user: string, req: string): string {
    const rid = this.cfg.ridOf(user, req);
    this.s.results.add(rid);
    this.s.ledger.delete(rid);
    // Written while the activity is not loaded (after cleanup): the results get a TTL if they had
    // none, never a key that lives forever.
    if (!this.s.meta) this.s.resultsExpire = true;
    return 'confirmed';
  }

  // ---- cleanupActivity (core/activity-cache.ts) -----------------------------------------------
  cleanup(): string {
    const outbox = this.s.outbox?.length ?? 0;
    const ledger = this.s.ledger.size;
    // Either condition alone refuses.
    if (outbox > 0 || ledger > 0) return err('UNAVAILABLE');
    const results = this.s.results;
    Object.assign(this.s, emptyState());
    this.s.results = results;
    this.s.resultsExpire = results.size > 0;
    return `cleaned retained=${results.size > 0 ? 1 : 0}`;
  }

  /** The key names (after the activity prefix) that must exist now. */
  keys(): string[] {
    const s = this.s;
    const out: string[] = [];
    if (s.meta) out.push('meta');
    if (s.counters) out.push('counters');
    if (s.skuIndex.size > 0) out.push('skus');
    for (const k of s.skus.keys()) out.push(`sku:${k}`);
    for (const u of s.buyers.keys()) out.push(`buyer:${u}`);
    for (const r of s.reservations.keys()) out.push(`rsv:${r}`);
    if (s.ledger.size > 0) out.push('ledger');
    if (s.outbox) out.push('outbox');
    if (s.results.size > 0) out.push('results');
    for (const u of s.windows.keys()) out.push(`rl:buyer:${u}`);
    return out.sort();
  }
}

/** The trace id the test sends with a request id (deterministic, so the model can predict it). */
export function traceOf(req: string): string {
  return `trace-${req}`;
}
