// The demo's knobs: DEMO_* environment variables, or the same as flags (--buyers 5000,
// --stock=800, ...); docs/demo.md "Knobs" lists them.

export const KNOBS = {
  buyers: ['DEMO_BUYERS', 3000, 'simulated buyers (one purchase attempt each)'],
  stock: ['DEMO_STOCK', 600, 'total units, split over the example SKUs in their proportions'],
  warmup: ['DEMO_WARMUP_IN', 5, 'seconds from applying the activity to warm-up'],
  start: ['DEMO_START_IN', 15, 'seconds from applying the activity to the sale opening'],
  duration: ['DEMO_DURATION', 30, 'seconds the sale stays open'],
  concurrency: ['DEMO_CONCURRENCY', 64, 'buyer requests in flight at most'],
  doubleclick: ['DEMO_DOUBLE_CLICK_PERCENT', 10, '% of buyers who send the same request twice'],
  starttimeout: ['DEMO_START_TIMEOUT', 300, 'seconds allowed for the operator and roles to start'],
  drain: ['DEMO_DRAIN_TIMEOUT', 20, 'seconds the operator waits for the backlog at the end'],
  paywindow: ['DEMO_PAYMENT_WINDOW', 30, 'seconds a buyer has to pay (spec.payment.timeout, >= 10)'],
  paypercent: ['DEMO_PAY_PERCENT', 60, '% of orders paid with a signed notification'],
  interval: ['DEMO_INTERVAL', 1, 'seconds between two progress updates'],
  prometheus: ['DEMO_PROMETHEUS', 0, '1: run Prometheus scraping the operator and roles, print its URL'],
} as const;
export type Knob = keyof typeof KNOBS;
export type Knobs = Record<Knob, number>;

/** The knobs from the flags, then the environment, then the defaults; `--help` prints them and exits. */
export function readKnobs(argv: string[]): Knobs {
  const flags = new Map<string, string>();
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i] ?? '';
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
    if (!m) throw new Error(`unexpected argument ${arg} (see docs/demo.md)`);
    const name = (m[1] ?? '').replace(/-/g, '');
    if (name === 'help') {
      process.stdout.write('Usage: scripts/demo.sh [--knob value ...]\n');
      for (const [k, [envName, def, text]] of Object.entries(KNOBS))
        process.stdout.write(
          `  --${k.padEnd(12)} ${envName.padEnd(26)} ${String(def).padStart(5)}  ${text}\n`,
        );
      process.exit(0);
    }
    flags.set(name, m[2] ?? argv[++i] ?? '');
  }
  const out = {} as Knobs;
  for (const [k, [envName, def]] of Object.entries(KNOBS) as [Knob, (typeof KNOBS)[Knob]][]) {
    const raw = flags.get(k) ?? process.env[envName];
    const v = raw === undefined || raw === '' ? def : Number(raw);
    if (!Number.isFinite(v) || v < 0) throw new Error(`${envName}/--${k}: not a non-negative number: ${raw}`);
    out[k] = v;
  }
  if (out.start <= out.warmup) throw new Error('DEMO_START_IN must be after DEMO_WARMUP_IN');
  if (out.duration < 1 || out.buyers < 1 || out.stock < 1 || out.concurrency < 1)
    throw new Error('DEMO_DURATION, DEMO_BUYERS, DEMO_STOCK and DEMO_CONCURRENCY must be at least 1');
  return out;
}
