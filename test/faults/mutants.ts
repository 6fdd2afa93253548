// Broken builds ("mutants"): each file in test/faults/mutants/*.mutant is a reviewed claim that the
// suite sees a class of bug. It names the invariant it breaks, the tests that must fail, and the
// edit, as exact snippets to find and replace (no line numbers, no context diff), so it keeps
// applying while unrelated code around it changes, and stops loudly when its snippet is gone.
//
//   node --import tsx test/faults/mutants.ts check                 every mutant applies to this tree
//   node --import tsx test/faults/mutants.ts apply <mutant> <dir>  apply one to a copy
//   node --import tsx test/faults/mutants.ts run [--suite S] [--report F] [--tsv F] [name...]
//
// `run` (make mutants: test/faults/mutants.sh, which provides the servers) first runs every named
// test on this tree (they must pass, and each entry must match at least one test), then, per
// mutant, copies the tree, applies the mutant and runs only its named tests there: the mutant is
// caught when every entry has at least one failing test. A suite that does not even run (a syntax
// error) is not a catch. File format (docs/faults.md, "Broken builds"):
//
//   # mutant: <name, = file name>
//   # invariant: <the invariant it breaks, as ARCHITECTURE.md words it>
//   # must-fail: <test file> [:: <text contained in the test's full name>]   (one or more)
//   # suite: faults            (optional: `make faults` runs it as well)
//   @@ <file to edit>
//   -<exact line(s) to find: must occur exactly once in the file>
//   +<replacement line(s)> (none: the found lines are deleted)
import { spawn, spawnSync } from 'node:child_process';
import {
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export interface MustFail {
  /** Test file, relative to the repository root. */
  path: string;
  /** Text the test's full name contains (jest -t, escaped); undefined = the whole file. */
  name: string | undefined;
}

export interface Hunk {
  file: string;
  find: string;
  replace: string;
}

export interface Mutant {
  name: string;
  source: string;
  invariant: string;
  mustFail: MustFail[];
  suites: string[];
  hunks: Hunk[];
}

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const MUTANT_DIR = join(ROOT, 'test', 'faults', 'mutants');

export class MutantError extends Error {}

export function parseMutant(source: string, text: string): Mutant {
  const name = basename(source).replace(/\.mutant$/, '');
  const header = (key: string): string[] =>
    text
      .split('\n')
      .filter((l) => l.startsWith(`# ${key}:`))
      .map((l) => l.slice(key.length + 3).trim());
  const declared = header('mutant')[0];
  if (declared !== name)
    throw new MutantError(`mutant ${name}: "# mutant: ${declared ?? ''}" must equal the file name`);
  const invariant = header('invariant').join(' ');
  if (!invariant) throw new MutantError(`mutant ${name}: no "# invariant:" line`);
  const mustFail = header('must-fail').map((l) => {
    const [path, ...rest] = l.split(' :: ');
    return { path: path!.trim(), name: rest.length > 0 ? rest.join(' :: ').trim() : undefined };
  });
  if (mustFail.length === 0) throw new MutantError(`mutant ${name}: no "# must-fail:" line`);
  const hunks: Hunk[] = [];
  let cur: { file: string; find: string[]; replace: string[] } | undefined;
  const flush = (): void => {
    if (!cur) return;
    if (cur.find.length === 0) throw new MutantError(`mutant ${name}: hunk for ${cur.file} has no "-" line`);
    hunks.push({ file: cur.file, find: cur.find.join('\n'), replace: cur.replace.join('\n') });
  };
  for (const line of text.split('\n')) {
    if (line.startsWith('@@ ')) {
      flush();
      cur = { file: line.slice(3).trim(), find: [], replace: [] };
    } else if (cur && line.startsWith('-')) {
      if (cur.replace.length > 0)
        throw new MutantError(`mutant ${name}: "-" line after "+" lines in ${cur.file}`);
      cur.find.push(line.slice(1));
    } else if (cur && line.startsWith('+')) cur.replace.push(line.slice(1));
    else if (cur && line.trim() !== '' && !line.startsWith('#'))
      throw new MutantError(`mutant ${name}: unexpected line in hunk of ${cur.file}: ${line}`);
  }
  flush();
  if (hunks.length === 0) throw new MutantError(`mutant ${name}: no "@@ <file>" hunk`);
  return { name, source, invariant, mustFail, suites: header('suite'), hunks };
}

export function loadMutants(dir = MUTANT_DIR): Mutant[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.mutant'))
    .sort()
    .map((f) => parseMutant(join(dir, f), readFileSync(join(dir, f), 'utf8')));
}

function occurrences(text: string, snippet: string): number {
  let n = 0;
  for (let i = text.indexOf(snippet); i !== -1; i = text.indexOf(snippet, i + 1)) n += 1;
  return n;
}

/**
 * The mutated contents of every file the mutant edits, read from `root`. Each snippet must occur
 * exactly once at the moment its hunk applies (hunks apply in order).
 */
export function mutatedFiles(m: Mutant, root: string): Map<string, string> {
  const files = new Map<string, string>();
  for (const h of m.hunks) {
    const path = join(root, h.file);
    if (!files.has(h.file)) {
      if (!existsSync(path))
        throw new MutantError(`mutant ${m.name} no longer applies: ${h.file} does not exist`);
      files.set(h.file, readFileSync(path, 'utf8'));
    }
    const text = files.get(h.file)!;
    const n = occurrences(text, h.find);
    if (n === 0)
      throw new MutantError(`mutant ${m.name} no longer applies: snippet not found in ${h.file}:\n${h.find}`);
    if (n > 1)
      throw new MutantError(
        `mutant ${m.name} no longer applies: snippet found ${n} times in ${h.file} (it must be unique):\n${h.find}`,
      );
    files.set(
      h.file,
      text.replace(h.find, () => h.replace),
    );
  }
  return files;
}

export function applyMutant(m: Mutant, root: string): void {
  for (const [file, text] of mutatedFiles(m, root)) writeFileSync(join(root, file), text);
}

// ---- running ------------------------------------------------------------------------------------

export type EntryVerdict = 'failed' | 'passed' | 'no-test' | 'did-not-run' | 'timeout';

interface EntryResult {
  entry: MustFail;
  verdict: EntryVerdict;
  failed: number;
  total: number;
  detail: string;
}

const escapeRegex = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
const label = (e: MustFail): string => (e.name ? `${e.path} :: ${e.name}` : e.path);
const log = (msg: string): void => {
  process.stderr.write(`[mutants ${new Date().toISOString().slice(11, 19)}] ${msg}\n`);
};

interface JestJson {
  numFailedTests: number;
  numPassedTests: number;
  testResults: {
    status: string;
    message: string;
    assertionResults: { status: string; fullName: string }[];
  }[];
}

/** Runs the tests of one entry in `root` with jest; the verdict says whether any failed. */
async function runEntry(root: string, e: MustFail, timeoutMs: number): Promise<EntryResult> {
  const out = join(mkdtempSync(join(tmpdir(), 'flashsale-mutant-json-')), 'jest.json');
  const args = [
    join(root, 'node_modules', '.bin', 'jest'),
    '--ci',
    '--maxWorkers=2',
    '--json',
    `--outputFile=${out}`,
    '--runTestsByPath',
    e.path,
    ...(e.name ? ['-t', escapeRegex(e.name)] : []),
  ];
  const child = spawn(process.execPath, args, {
    cwd: root,
    env: { ...process.env, NODE_OPTIONS: '--experimental-vm-modules' },
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: true,
  });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString('utf8')).slice(-20_000);
  });
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
  }, timeoutMs);
  const [code, signal] = await new Promise<[number | null, string | null]>((r) =>
    child.on('close', (c: number | null, s: string | null) => r([c, s])),
  );
  clearTimeout(timer);
  const base = { entry: e, failed: 0, total: 0 };
  if (timedOut) return { ...base, verdict: 'timeout', detail: `no verdict within ${timeoutMs / 1000} s` };
  if (!existsSync(out)) {
    const why = `jest ended (code ${code}, signal ${signal}) without results: ${stderr.slice(-2000)}`;
    return { ...base, verdict: 'did-not-run', detail: why };
  }
  const json = JSON.parse(readFileSync(out, 'utf8')) as JestJson;
  rmSync(dirname(out), { recursive: true, force: true });
  const asserted = json.testResults.flatMap((t) => t.assertionResults);
  const failed = asserted.filter((a) => a.status === 'failed');
  const ran = asserted.filter((a) => a.status === 'failed' || a.status === 'passed');
  const execError = json.testResults.find((t) => t.status === 'failed' && t.assertionResults.length === 0);
  const detail =
    failed.length > 0 ? failed.map((a) => a.fullName).join('; ') : (execError?.message ?? '').slice(0, 2000);
  if (failed.length > 0)
    return { entry: e, verdict: 'failed', failed: failed.length, total: ran.length, detail };
  if (execError) return { entry: e, verdict: 'did-not-run', failed: 0, total: 0, detail };
  if (ran.length === 0) return { ...base, verdict: 'no-test', detail: 'no test matched' };
  return { entry: e, verdict: 'passed', failed: 0, total: ran.length, detail: '' };
}

/** A copy of the tree (without node_modules, dist, .git) with node_modules linked in. */
function copyTree(): string {
  const copy = mkdtempSync(join(tmpdir(), 'flashsale-mutant-'));
  const r = spawnSync(
    'bash',
    [
      '-c',
      'tar --exclude=./node_modules --exclude=./dist --exclude=./.git -cf - . | tar -xf - -C "$1"',
      '_',
      copy,
    ],
    { cwd: ROOT, stdio: 'inherit' },
  );
  if (r.status !== 0) throw new Error(`copying the tree to ${copy} failed`);
  symlinkSync(join(ROOT, 'node_modules'), join(copy, 'node_modules'));
  return copy;
}

export interface MutantOutcome {
  mutant: Mutant;
  outcome: 'caught' | 'NOT caught' | 'does not apply' | 'invalid: named tests fail on the real code';
  entries: EntryResult[];
  detail: string;
  seconds: number;
}

function parseArgs(argv: string[]): { suite?: string; report?: string; tsv?: string; names: string[] } {
  const o: { suite?: string; report?: string; tsv?: string; names: string[] } = { names: [] };
  for (let i = 0; i < argv.length; i += 1) {
    const a = argv[i]!;
    if (a === '--suite') o.suite = argv[++i];
    else if (a === '--report') o.report = argv[++i];
    else if (a === '--tsv') o.tsv = argv[++i];
    else o.names.push(a);
  }
  return o;
}

async function run(argv: string[]): Promise<number> {
  const opts = parseArgs(argv);
  const timeoutMs = Number(process.env.MUTANT_TIMEOUT_SECONDS ?? 600) * 1000;
  let mutants = loadMutants();
  if (opts.suite) mutants = mutants.filter((m) => m.suites.includes(opts.suite!));
  if (opts.names.length > 0) mutants = mutants.filter((m) => opts.names.includes(m.name));
  if (mutants.length === 0) throw new Error('no mutant selected');
  const started = new Date();
  const t0 = Date.now();

  // Baseline: every named test passes on the real code (else a "catch" would mean nothing).
  const baseline = new Map<string, EntryResult>();
  if (process.env.MUTANT_BASELINE !== '0') {
    for (const e of mutants.flatMap((m) => m.mustFail)) {
      if (baseline.has(label(e))) continue;
      log(`baseline: ${label(e)}`);
      const r = await runEntry(ROOT, e, timeoutMs);
      baseline.set(label(e), r);
      if (r.verdict !== 'passed') log(`baseline NOT passing: ${label(e)}: ${r.verdict} ${r.detail}`);
    }
  }

  const outcomes: MutantOutcome[] = [];
  for (const m of mutants) {
    const m0 = Date.now();
    const broken = m.mustFail.map((e) => baseline.get(label(e))).find((r) => r && r.verdict !== 'passed');
    if (broken) {
      outcomes.push({
        mutant: m,
        outcome: 'invalid: named tests fail on the real code',
        entries: [],
        detail: `${label(broken.entry)}: ${broken.verdict}`,
        seconds: 0,
      });
      continue;
    }
    const copy = copyTree();
    try {
      try {
        applyMutant(m, copy);
      } catch (err) {
        log((err as Error).message);
        outcomes.push({
          mutant: m,
          outcome: 'does not apply',
          entries: [],
          detail: (err as Error).message,
          seconds: 0,
        });
        continue;
      }
      log(`mutant ${m.name}: expecting ${m.mustFail.map(label).join(' and ')} to fail`);
      const entries: EntryResult[] = [];
      for (const e of m.mustFail) {
        let r = await runEntry(copy, e, timeoutMs);
        // jest killed from outside (e.g. by the OOM killer on a shared machine) is no verdict: once more.
        if (r.verdict === 'did-not-run' && r.detail.startsWith('jest ended')) {
          log(`mutant ${m.name}: ${label(e)}: ${r.detail.split(':')[0]}; running it again`);
          r = await runEntry(copy, e, timeoutMs);
        }
        entries.push(r);
      }
      const caught = entries.every((r) => r.verdict === 'failed');
      const seconds = Math.round((Date.now() - m0) / 1000);
      const detail = entries
        .filter((r) => r.verdict !== 'failed')
        .map((r) => `${label(r.entry)}: ${r.verdict} ${r.detail}`)
        .join('; ');
      outcomes.push({ mutant: m, outcome: caught ? 'caught' : 'NOT caught', entries, detail, seconds });
      log(`mutant ${m.name}: ${caught ? 'caught' : `NOT caught (${detail})`} in ${seconds} s`);
    } finally {
      rmSync(copy, { recursive: true, force: true });
    }
  }
  const secs = Math.round((Date.now() - t0) / 1000);
  if (opts.tsv) {
    writeFileSync(
      opts.tsv,
      outcomes
        .map((o) => [o.mutant.name, o.mutant.mustFail.map(label).join(' + '), o.outcome].join('\t'))
        .join('\n') + '\n',
      { flag: 'a' },
    );
  }
  if (opts.report) writeFileSync(opts.report, renderReport(outcomes, baseline, started, secs));
  const bad = outcomes.filter((o) => o.outcome !== 'caught');
  log(`${outcomes.length - bad.length}/${outcomes.length} mutants caught in ${secs} s`);
  return bad.length === 0 ? 0 : 1;
}

const cell = (s: string): string => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');

function renderReport(
  outcomes: MutantOutcome[],
  baseline: Map<string, EntryResult>,
  started: Date,
  secs: number,
): string {
  const caught = outcomes.filter((o) => o.outcome === 'caught').length;
  const lines = [
    '# Mutants report',
    '',
    `Generated by \`make mutants\` (test/faults/mutants.sh) on ${started.toISOString().slice(0, 19)}Z: ` +
      `${caught} of ${outcomes.length} mutants caught, ${secs} s.`,
    '',
    'Each mutant in `test/faults/mutants/` breaks one invariant; it is applied to a copy of the tree and',
    'only its named tests run there. Caught = every named test file has at least one failing test (and',
    'the same tests passed on the real code first). See docs/faults.md, "Broken builds".',
    '',
    '| invariant | mutant | edits | tests that must fail | failed / ran | outcome |',
    '| --- | --- | --- | --- | --- | --- |',
  ];
  for (const o of outcomes) {
    const tests = o.mutant.mustFail.map((e) => `\`${label(e)}\``).join('<br>');
    const counts = o.entries.map((r) => `${r.failed}/${r.total}`).join('<br>') || '-';
    const files = [...new Set(o.mutant.hunks.map((h) => `\`${h.file}\``))].join(', ');
    lines.push(
      `| ${cell(o.mutant.invariant)} | \`${o.mutant.name}\` | ${files} | ${cell(tests)} | ${counts} | ${cell(
        o.outcome === 'caught' ? 'caught' : `**${o.outcome}** ${o.detail}`,
      )} |`,
    );
  }
  lines.push(
    '',
    '## Baseline (the named tests on the real code)',
    '',
    '| tests | outcome |',
    '| --- | --- |',
  );
  for (const [l, r] of baseline) lines.push(`| \`${cell(l)}\` | ${r.verdict} (${r.total} test(s)) |`);
  return lines.join('\n') + '\n';
}

async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  if (cmd === 'check') {
    const ms = loadMutants();
    for (const m of ms) mutatedFiles(m, ROOT);
    console.log(`${ms.length} mutants apply to ${ROOT}`);
    return 0;
  }
  if (cmd === 'apply') {
    const [file, dir] = rest;
    if (!file || !dir) throw new Error('usage: mutants.ts apply <mutant file> <tree>');
    applyMutant(parseMutant(file, readFileSync(file, 'utf8')), dir);
    return 0;
  }
  if (cmd === 'run') return run(rest);
  console.error(
    'usage: mutants.ts check | apply <mutant> <dir> | run [--suite S] [--report F] [--tsv F] [name...]',
  );
  return 2;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then(
    (rc) => process.exit(rc),
    (err: unknown) => {
      console.error(err instanceof MutantError ? err.message : err);
      process.exit(1);
    },
  );
}
