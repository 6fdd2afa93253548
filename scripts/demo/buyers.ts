// The simulated buyers: a fixed pseudo-random crowd sent through the real HTTP API (docs/demo.md
// "Buyers"), and the tally of their answers that the progress and the checks read.
import type { ItemSpec } from '../../operator/api/v1alpha1/types.js';
import { httpClient, tokenFor } from '../../dev/roles.js';
import type { Knobs } from './knobs.js';

export interface Tally {
  /** result label -> count, per second since the sale opened and in total. */
  perSecond: Map<number, Map<string, number>>;
  total: Map<string, number>;
  /** reservation id -> buyer, of every 202. */
  accepted: Map<string, string>;
  /** repeated requests answered with another reservation id than the first one's 202. */
  doubleClickMismatch: number;
  sent: number;
}

export function newTally(): Tally {
  return { perSecond: new Map(), total: new Map(), accepted: new Map(), doubleClickMismatch: 0, sent: 0 };
}

function count(t: Tally, label: string): void {
  const sec = Math.floor(Date.now() / 1000);
  const bucket = t.perSecond.get(sec) ?? new Map<string, number>();
  bucket.set(label, (bucket.get(label) ?? 0) + 1);
  t.perSecond.set(sec, bucket);
  t.total.set(label, (t.total.get(label) ?? 0) + 1);
}

/** Deterministic pseudo-random numbers (mulberry32) so that two runs send the same crowd. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Buyer {
  user: string;
  at: number;
  skuId: string;
  quantity: number;
  doubleClick: boolean;
}

/** 5% eager buyers a second early (the gate is still shut), 70% in the first 3 s, the rest spread. */
function plan(items: ItemSpec[], startMs: number, endMs: number, k: Knobs): Buyer[] {
  const random = rng(20301111);
  const window = Math.max(1000, Math.min(endMs - startMs - 2000, 20_000));
  return Array.from({ length: k.buyers }, (_, i) => {
    const r = random();
    const at =
      r < 0.05
        ? startMs - 1000 - random() * 1000
        : r < 0.75
          ? startMs + random() * 3000
          : startMs + random() * window;
    const item = items[Math.floor(random() * items.length)] ?? items[0]!;
    const quantity = (item.limitPerUser ?? 1) >= 2 && random() < 0.3 ? 2 : 1;
    return {
      user: `buyer-${i}`,
      at,
      skuId: item.skuId,
      quantity,
      doubleClick: random() * 100 < k.doubleclick,
    };
  }).sort((x, y) => x.at - y.at);
}

export interface BuyersRun {
  apiUrl: string;
  activityId: string;
  items: ItemSpec[];
  startMs: number;
  endMs: number;
  knobs: Knobs;
  /** True once the demo is stopping: no new request is sent. */
  cancelled: () => boolean;
}

/** Sends every buyer's request at its time, at most DEMO_CONCURRENCY in flight, into `tally`. */
export async function runBuyers(run: BuyersRun, tally: Tally): Promise<void> {
  const crowd = plan(run.items, run.startMs, run.endMs, run.knobs);
  const url = `${run.apiUrl}/v1/activities/${run.activityId}/orders`;
  const http = httpClient(run.knobs.concurrency);
  let next = 0;
  const worker = async (): Promise<void> => {
    for (;;) {
      if (run.cancelled()) return;
      const b = crowd[next++];
      if (!b) return;
      const wait = b.at - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      const token = await tokenFor(b.user);
      const body = { skuId: b.skuId, quantity: b.quantity, requestId: `${b.user}-1` };
      const clicks = b.doubleClick ? 2 : 1;
      let first: string | undefined;
      for (let c = 0; c < clicks; c += 1) {
        tally.sent += 1;
        try {
          const r = await http.post(url, body, token);
          if (r.status === 202) {
            const id = String(r.json.reservationId ?? '');
            count(tally, c === 0 ? 'accepted' : 'accepted (repeat)');
            if (c === 0) first = id;
            else if (first !== undefined && id !== first) tally.doubleClickMismatch += 1;
            tally.accepted.set(id, b.user);
          } else {
            count(tally, typeof r.json.code === 'string' ? r.json.code.toLowerCase() : `http ${r.status}`);
          }
        } catch {
          count(tally, 'network error');
        }
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: run.knobs.concurrency }, worker));
  } finally {
    await http.close();
  }
}
