/**
 * Reads a V8 `.cpuprofile` (node --cpu-prof) and says where the time went: self time grouped by
 * package / node internals / our own modules, the hottest functions, and the inclusive time of
 * the request stages that matter for the order path.
 */
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

export interface Share {
  name: string;
  ms: number;
  /** Share of the busy (non-idle) time, in percent. */
  pct: number;
}

export interface ProfileSummary {
  /** Wall time covered by the profile. */
  totalMs: number;
  busyMs: number;
  idleMs: number;
  byGroup: Share[];
  topFunctions: Share[];
  /**
   * Self time charged to the first npm package or module of ours on the stack (node internals and
   * natives count for whoever called them); time with neither on the stack stays with node.
   */
  byOwner: Share[];
  /**
   * The process's CPU time over the same window from /proc (all threads), when measured: how much
   * of the profile's busy time was the kernel's (socket I/O) and how much the process's own code.
   */
  cpu?: { userMs: number; sysMs: number } | undefined;
}

function group(f: CallFrame, ownPrefix: string): string {
  const { url, functionName } = f;
  if (url.startsWith(ownPrefix)) return `ours: ${url.slice(ownPrefix.length).replace(/\.js$/, '')}`;
  if (!url) {
    if (functionName.startsWith('(')) return functionName; // (garbage collector), (program), (idle)
    return '(native / V8 builtins)';
  }
  const nm = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(url);
  if (nm) return `npm: ${nm[1]}`;
  if (url.startsWith('node:')) {
    const m = /^node:(?:internal\/)?([^/]+)/.exec(url);
    const mod = m?.[1] ?? url;
    if (/^_?http|^http/.test(mod) || mod === 'deps') return 'node: http';
    if (/stream|net|tcp|socket/.test(mod)) return 'node: net/streams';
    if (/crypto/.test(mod)) return 'node: crypto';
    if (/timers|process|async_hooks|event/.test(mod)) return 'node: event loop/timers';
    return `node: ${mod}`;
  }
  return url;
}

/**
 * `window` (CLOCK_MONOTONIC microseconds, i.e. process.hrtime.bigint() / 1000 in any process on
 * the machine, the clock V8 stamps its samples with) keeps only the samples taken under load:
 * start-up and shut-down are left out.
 */
/** A short location: `node:internal/x` -> `internal/x`, npm files as `pkg/file`, ours as `core/x`. */
function where(url: string, ownPrefix: string): string {
  if (url.startsWith(ownPrefix)) return url.slice(ownPrefix.length);
  const nm = /node_modules\/((?:@[^/]+\/)?[^/]+)\/(?:.*\/)?([^/]+)$/.exec(url);
  if (nm) return `${nm[1]}/${nm[2]}`;
  return url.startsWith('node:') ? url.slice(5) : url;
}

export function summarizeProfile(
  file: string,
  distDir: string,
  window?: { startUs: number; endUs: number },
  top = 15,
): ProfileSummary {
  const ownPrefix = `${pathToFileURL(distDir).href}/`;
  const p = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  const byId = new Map<number, ProfileNode>();
  const parent = new Map<number, number>();
  for (const n of p.nodes) {
    byId.set(n.id, n);
    for (const c of n.children ?? []) parent.set(c, n.id);
  }
  const self = new Map<number, number>();
  let ts = p.startTime;
  let inWindow = 0;
  for (let i = 0; i < p.samples.length; i += 1) {
    const delta = p.timeDeltas[i] ?? 0;
    ts += delta;
    // A sample stands for the time since the one before it, of which only the part inside the
    // window counts: a process stopped (SIGSTOP) right before the window would otherwise charge
    // the whole stop to its first sample after SIGCONT.
    const from = window ? Math.max(ts - delta, window.startUs) : ts - delta;
    const to = window ? Math.min(ts, window.endUs) : ts;
    if (window && (ts < window.startUs || ts - delta >= window.endUs)) continue;
    inWindow += 1;
    const id = p.samples[i]!;
    self.set(id, (self.get(id) ?? 0) + Math.max(0, to - from) / 1000);
  }
  if (window && inWindow === 0) return summarizeProfile(file, distDir, undefined, top);
  const groups = new Map<string, number>();
  const owners = new Map<string, number>();
  const funcs = new Map<string, number>();
  let idleMs = 0;
  let totalMs = 0;
  const add = (m: Map<string, number>, k: string, ms: number): void => void m.set(k, (m.get(k) ?? 0) + ms);
  for (const [id, ms] of self) {
    const f = byId.get(id)!.callFrame;
    totalMs += ms;
    if (f.functionName === '(idle)') {
      idleMs += ms;
      continue;
    }
    const fname = `${f.functionName || '(anonymous)'}${f.url ? ` ${where(f.url, ownPrefix)}:${f.lineNumber + 1}` : ''}`;
    add(funcs, fname, ms);
    if (f.functionName.startsWith('(')) {
      add(groups, f.functionName, ms);
      add(owners, f.functionName, ms);
      continue;
    }
    // Natives (no url) count for the nearest frame with a url; the owner is the nearest npm
    // package or module of ours.
    let physical: string | undefined;
    let owner: string | undefined;
    for (let cur: number | undefined = id; cur !== undefined && !owner; cur = parent.get(cur)) {
      const cf = byId.get(cur)!.callFrame;
      if (!cf.url) continue;
      const g = group(cf, ownPrefix);
      physical ??= g;
      if (g.startsWith('npm: ') || g.startsWith('ours: ')) owner = g;
    }
    add(groups, physical ?? '(native / V8 builtins)', ms);
    add(
      owners,
      owner ?? (physical?.startsWith('node: ') ? 'node (no package on the stack)' : (physical ?? '(native)')),
      ms,
    );
  }
  const busyMs = totalMs - idleMs;
  const shares = (m: Map<string, number>, n: number): Share[] =>
    [...m.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([name, ms]) => ({ name, ms, pct: (100 * ms) / busyMs }));
  return {
    totalMs,
    busyMs,
    idleMs,
    byGroup: shares(groups, top),
    topFunctions: shares(funcs, top),
    byOwner: shares(owners, top),
  };
}
