/** Small helpers shared by the benchmark's phases: logging, processes, timing, statistics. */
import { spawn } from 'node:child_process';
import type { SpawnOptions } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { createServer } from 'node:net';

const t0 = Date.now();

export function log(msg: string): void {
  process.stderr.write(`[bench +${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}\n`);
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export interface CmdResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a command to completion and captures its output; never throws on a non-zero exit. */
export function runCmd(
  cmd: string,
  args: string[],
  opts: SpawnOptions & { timeoutMs?: number } = {},
): Promise<CmdResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { ...opts, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = opts.timeoutMs
      ? setTimeout(() => {
          stderr += `\n[bench] killed after ${opts.timeoutMs} ms`;
          child.kill('SIGKILL');
        }, opts.timeoutMs)
      : undefined;
    child.on('error', reject);
    child.on('close', (code) => {
      if (timer) clearTimeout(timer);
      resolve({ code: code ?? -1, stdout, stderr });
    });
  });
}

export async function mustRun(
  cmd: string,
  args: string[],
  opts: SpawnOptions & { timeoutMs?: number } = {},
): Promise<CmdResult> {
  const r = await runCmd(cmd, args, opts);
  if (r.code !== 0) {
    throw new Error(`${cmd} ${args.join(' ')} exited ${r.code}:\n${(r.stderr || r.stdout).slice(-2000)}`);
  }
  return r;
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      s.close(() => resolve(port));
    });
  });
}

/** A field of /proc/<pid>/status in kB (VmHWM = peak RSS, VmRSS = current RSS). */
export function procStatusKb(pid: number, field: 'VmHWM' | 'VmRSS'): number | undefined {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

/** A process's CPU seconds so far, in user mode and in the kernel (all its threads), from /proc/<pid>/stat (10 ms ticks). */
export function procCpuSplitS(pid: number): { userS: number; sysS: number } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // After "pid (comm) ": state is field 3, utime field 14, stime field 15.
    return { userS: Number(fields[11]) / 100, sysS: Number(fields[12]) / 100 };
  } catch {
    return undefined;
  }
}

/** CPU seconds (user + system) a process has used so far. */
export function procCpuS(pid: number): number | undefined {
  const cpu = procCpuSplitS(pid);
  return cpu === undefined ? undefined : cpu.userS + cpu.sysS;
}

/** Nearest-rank percentile of an ascending array. */
export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

export function mean(xs: number[]): number {
  return xs.length === 0 ? NaN : xs.reduce((a, b) => a + b, 0) / xs.length;
}

export function median(xs: number[]): number {
  return percentile(
    [...xs].sort((a, b) => a - b),
    50,
  );
}

/** Load average and CPU pressure: how busy the shared machine was around a measurement. */
export function machineLoad(): { load1: number; cpuSomeAvg10: number | undefined } {
  const load1 = Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[0]);
  let cpuSomeAvg10: number | undefined;
  try {
    const m = /some avg10=([\d.]+)/.exec(readFileSync('/proc/pressure/cpu', 'utf8'));
    cpuSomeAvg10 = m ? Number(m[1]) : undefined;
  } catch {
    cpuSomeAvg10 = undefined;
  }
  return { load1, cpuSomeAvg10 };
}

export async function waitFor<T>(
  what: string,
  timeoutMs: number,
  probe: () => Promise<T | undefined>,
  intervalMs = 200,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastErr = '';
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (err) {
      lastErr = (err as Error).message;
    }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms ${lastErr}`);
    await sleep(intervalMs);
  }
}

/** The pid in the first of `dirs` holding `file` (a server's pid file) whose process is alive. */
export function pidFrom(dirs: (string | undefined)[], file: string): number | undefined {
  for (const d of dirs) {
    if (!d || !existsSync(join(d, file))) continue;
    const pid = Number(readFileSync(join(d, file), 'utf8').split('\n')[0]);
    if (pid > 0 && procCpuS(pid) !== undefined) return pid;
  }
  return undefined;
}

/** CPU seconds of a process and of all its children, exited (cutime/cstime) and alive. */
export function treeCpuS(pid: number): number | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime, stime, cutime, cstime are fields 14-17 (index 11-14 after "pid (comm) ").
  let ticks = Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const s = readFileSync(`/proc/${d}/stat`, 'utf8');
      const g = s.slice(s.lastIndexOf(')') + 2).split(' ');
      if (Number(g[1]) === pid) ticks += Number(g[11]) + Number(g[12]);
    } catch {
      // exited meanwhile: its time is in the parent's cutime/cstime once reaped
    }
  }
  return ticks / 100;
}
