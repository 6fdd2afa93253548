// The demo's activity: examples/activity.yaml with its times moved a few seconds ahead and its
// stock scaled to DEMO_STOCK units.
import type { FlashSaleActivity, ItemSpec, Schedule } from '../../operator/api/v1alpha1/types.js';
import { readYaml } from '../../dev/operator-harness.js';
import type { Knobs } from './knobs.js';

/** The example's stock per SKU scaled to `total` units (largest remainder, at least 1 each). */
export function scaleItems(items: ItemSpec[], total: number): ItemSpec[] {
  const exampleTotal = items.reduce((n, i) => n + i.stock, 0);
  const exact = items.map((i) => (i.stock * total) / exampleTotal);
  const stock = exact.map((x) => Math.max(1, Math.floor(x)));
  const byRemainder = exact.map((x, i) => ({ i, r: x - Math.floor(x) })).sort((x, y) => y.r - x.r);
  for (let short = total - stock.reduce((n, x) => n + x, 0), j = 0; short > 0; short -= 1, j += 1) {
    const i = byRemainder[j % byRemainder.length]?.i ?? 0;
    stock[i] = (stock[i] ?? 0) + 1;
  }
  return items.map((item, i) => ({ ...item, stock: stock[i] ?? 1 }));
}

/** The activity to apply in `namespace`, scheduled relative to `now`, serving `activityId`. */
export function demoActivity(
  namespace: string,
  activityId: string,
  k: Knobs,
  now: number,
): FlashSaleActivity {
  const example = readYaml<FlashSaleActivity>('examples/activity.yaml');
  const at = (s: number): string => new Date(now + s * 1000).toISOString();
  const schedule: Schedule = {
    warmUpAt: at(k.warmup),
    startAt: at(k.start),
    endAt: at(k.start + k.duration),
  };
  return {
    ...example,
    metadata: { ...example.metadata, namespace },
    spec: {
      ...example.spec,
      activityId,
      schedule,
      items: scaleItems(example.spec.items ?? [], k.stock),
      drain: { timeout: `${k.drain}s` },
      payment: { timeout: `${Math.max(10, k.paywindow)}s` },
    },
  };
}
