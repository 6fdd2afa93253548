// bench/lib/profile.ts: the summary of a role's CPU profile inside the window the bench measured.
// The backlog phase stops the relay and the consumer (SIGSTOP) while it builds the backlog and
// profiles them from SIGCONT on; V8 stamps the first sample after the stop with the whole stop as
// its delta, which must not be charged to whatever function that sample caught.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { summarizeProfile } from '../../../bench/lib/profile.js';

const dist = '/srv/app/dist';

function profile(samples: { fn: string; deltaUs: number }[], startTime = 1_000_000): object {
  const names = [...new Set(samples.map((s) => s.fn))];
  const nodes = [
    {
      id: 1,
      callFrame: { functionName: '(root)', url: '', lineNumber: -1 },
      children: names.map((_, i) => i + 2),
    },
    ...names.map((fn, i) => ({
      id: i + 2,
      callFrame:
        fn === '(idle)' || fn === '(garbage collector)'
          ? { functionName: fn, url: '', lineNumber: -1 }
          : { functionName: fn, url: `file://${dist}/runtime/relay/relay.js`, lineNumber: 9 },
    })),
  ];
  const total = samples.reduce((a, s) => a + s.deltaUs, 0);
  return {
    nodes,
    samples: samples.map((s) => names.indexOf(s.fn) + 2),
    timeDeltas: samples.map((s) => s.deltaUs),
    startTime,
    endTime: startTime + total,
  };
}

describe('summarizeProfile', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'profile-test-'));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const write = (name: string, p: object): string => {
    const file = join(dir, name);
    writeFileSync(file, JSON.stringify(p));
    return file;
  };

  it('charges only the part of a sample inside the window (a stop before it is not busy time)', () => {
    // 10 ms of work, a 3 s stop that ends at the window's start (+1 ms), then 20 ms of work and 5 ms idle.
    const samples = [
      ...Array.from({ length: 10 }, () => ({ fn: 'publish', deltaUs: 1_000 })),
      { fn: 'beforeRun', deltaUs: 3_001_000 },
      ...Array.from({ length: 20 }, () => ({ fn: 'publish', deltaUs: 1_000 })),
      ...Array.from({ length: 5 }, () => ({ fn: '(idle)', deltaUs: 1_000 })),
    ];
    const startTime = 1_000_000;
    const windowStart = startTime + 10_000 + 3_000_000;
    const file = write('stopped.cpuprofile', profile(samples, startTime));
    const s = summarizeProfile(file, dist, { startUs: windowStart, endUs: windowStart + 26_000 });
    expect(s.totalMs).toBeCloseTo(26, 6);
    expect(s.idleMs).toBeCloseTo(5, 6);
    expect(s.busyMs).toBeCloseTo(21, 6);
    expect(s.topFunctions.map((f) => [f.name, Math.round(f.ms)])).toEqual([
      ['publish runtime/relay/relay.js:10', 20],
      ['beforeRun runtime/relay/relay.js:10', 1],
    ]);
  });

  it('counts every sample whole without a window', () => {
    const samples = [
      { fn: 'publish', deltaUs: 4_000 },
      { fn: '(garbage collector)', deltaUs: 2_000 },
      { fn: '(idle)', deltaUs: 4_000 },
    ];
    const s = summarizeProfile(write('whole.cpuprofile', profile(samples)), dist);
    expect(s.totalMs).toBeCloseTo(10, 6);
    expect(s.busyMs).toBeCloseTo(6, 6);
    expect(s.byGroup.map((g) => [g.name, Math.round(g.pct)])).toEqual([
      ['ours: runtime/relay/relay', 67],
      ['(garbage collector)', 33],
    ]);
  });

  it('leaves out samples after the window', () => {
    const samples = [
      { fn: 'publish', deltaUs: 1_000 },
      { fn: 'publish', deltaUs: 1_000 },
      { fn: 'shutdown', deltaUs: 50_000 },
    ];
    const s = summarizeProfile(write('after.cpuprofile', profile(samples)), dist, {
      startUs: 1_000_000,
      endUs: 1_002_000,
    });
    expect(s.totalMs).toBeCloseTo(2, 6);
    expect(s.topFunctions.map((f) => f.name)).toEqual(['publish runtime/relay/relay.js:10']);
  });
});
