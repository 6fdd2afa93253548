// The container images (Dockerfile, targets `runtime` and `operator`) cannot be built here: there
// is a docker client but no daemon or other builder. What is checked instead: the Dockerfile parses with BuildKit's own parser (built
// from its Go module, dockerfile-check/) without lint warnings; its structure (multi-stage,
// production dependencies only, numeric non-root user, a CMD per target, nothing from the Node
// image but its node binary, so no npm, npx or corepack); every file it copies from
// the build context exists and passes .dockerignore; and each image's /app, staged in a temporary
// directory by replaying the Dockerfile's stages (the build stage's `npm ci` and `npm run build`,
// prod-deps' `npm ci --omit=dev`, every COPY), made read-only and run as user 1000: each program
// loads every module it imports with production dependencies only, finds the Lua scripts, and
// stops on its configuration check (no servers are given); its file list has no source maps, demo,
// scripts or tests.
import {
  chmodSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { mustRun, readText, repoRoot, run, type RunResult } from './chart-helpers.js';

interface Instruction {
  op: string;
  args: string;
}
interface Stage {
  name: string;
  from: string;
  instructions: Instruction[];
}

/** The stages of a Dockerfile (line continuations joined, comments dropped). */
function parseDockerfile(text: string): Stage[] {
  const lines = text
    .replace(/\\\r?\n/g, ' ')
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
  const stages: Stage[] = [];
  for (const line of lines) {
    const m = /^(\w+)\s+(.*)$/.exec(line);
    if (!m) throw new Error(`unparsable Dockerfile line: ${line}`);
    const op = (m[1] as string).toUpperCase();
    const args = m[2] as string;
    if (op === 'FROM') {
      const from = /^(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$/i.exec(args);
      if (!from) throw new Error(`unparsable FROM: ${line}`);
      stages.push({ from: from[1] as string, name: from[2] ?? String(stages.length), instructions: [] });
    } else if (op !== 'ARG' || stages.length > 0) {
      const stage = stages.at(-1);
      if (!stage) throw new Error(`${op} before the first FROM`);
      stage.instructions.push({ op, args });
    }
  }
  return stages;
}

/** A stage and the stages it is built FROM, base first. */
function chain(stages: Stage[], name: string): Stage[] {
  const stage = stages.find((s) => s.name === name);
  if (!stage) throw new Error(`no stage ${name}`);
  const parent = stages.find((s) => s.name === stage.from);
  return parent ? [...chain(stages, parent.name), stage] : [stage];
}

interface Copy {
  from: string | undefined;
  sources: string[];
  dest: string;
}

function copies(stages: Stage[]): Copy[] {
  return stages.flatMap((s) =>
    s.instructions
      .filter((i) => i.op === 'COPY')
      .map((i) => {
        const words = i.args.split(/\s+/);
        const flags = words.filter((w) => w.startsWith('--'));
        const paths = words.filter((w) => !w.startsWith('--'));
        const from = flags.find((f) => f.startsWith('--from='))?.slice('--from='.length);
        return { from, sources: paths.slice(0, -1), dest: paths.at(-1) as string };
      }),
  );
}

const GLOB: Record<string, string> = { '**/': '(.*/)?', '**': '.*', '*': '[^/]*' };

/** Whether .dockerignore (`**` then `!` exceptions, as this repository writes it) lets a path in. */
function passesDockerignore(patterns: string[], file: string): boolean {
  let included = true;
  for (const p of patterns) {
    const negate = p.startsWith('!');
    const body = negate ? p.slice(1) : p;
    const source = body
      .split(/(\*\*\/|\*\*|\*)/)
      .map((part) => GLOB[part] ?? part.replace(/[.+?^${}()|[\]\\]/g, '\\$&'))
      .join('');
    const re = new RegExp(`^${source}$`);
    if (re.test(file)) included = negate;
  }
  return included;
}

function filesUnder(rel: string): string[] {
  const abs = path.join(repoRoot, rel);
  if (!statSync(abs).isDirectory()) return [rel];
  return readdirSync(abs).flatMap((f) => filesUnder(path.join(rel, f)));
}

const dockerfile = parseDockerfile(readText(path.join(repoRoot, 'Dockerfile')));
const ignore = readText(path.join(repoRoot, '.dockerignore'))
  .split('\n')
  .map((l) => l.trim())
  .filter((l) => l !== '' && !l.startsWith('#'));

describe('Dockerfile', () => {
  it("parses with BuildKit's own parser, without a lint warning (test/integration/chart/dockerfile-check)", () => {
    const check = mustRun('bash', ['test/integration/chart/dockerfile-check/build.sh'], {
      timeoutMs: 900_000,
    })
      .trim()
      .split('\n')
      .at(-1) as string;
    const out = mustRun(check, [path.join(repoRoot, 'Dockerfile')]);
    expect(out).toMatch(/stage runtime from base/);
    expect(out).toMatch(/stage operator from base/);
    // The check can fail: a misspelled flag, and a lint rule BuildKit applies while parsing.
    const dir = mkdtempSync(path.join(tmpdir(), 'flashsale-dockerfile-'));
    try {
      writeFileSync(path.join(dir, 'flag'), 'FROM node:20-slim AS base\nCOPY --frm=x a b\n');
      writeFileSync(path.join(dir, 'casing'), 'FROM node:20-slim as base\nCMD ["node"]\n');
      for (const bad of ['flag', 'casing']) expect(run(check, [path.join(dir, bad)]).status).toBe(1);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('has a runtime and an operator target on Debian slim with only the node binary of the Node 24 image', () => {
    const text = readText(path.join(repoRoot, 'Dockerfile'));
    expect(text).toMatch(/^ARG NODE_IMAGE=node:24[\w.-]*-slim(@sha256:[0-9a-f]{64})?$/m);
    expect(text).toMatch(/^ARG BASE_IMAGE=debian:bookworm-slim(@sha256:[0-9a-f]{64})?$/m);
    // The Node image and the base are the same Debian release (node's glibc and libstdc++).
    expect(/^ARG NODE_IMAGE=node:24[\w.]*-(\w+)-slim/m.exec(text)?.[1]).toBe('bookworm');
    for (const target of ['runtime', 'operator']) {
      const stages = chain(dockerfile, target);
      expect(stages[0]?.from).toBe('${BASE_IMAGE}');
      const cmd = stages.flatMap((s) => s.instructions).filter((i) => i.op === 'CMD');
      expect(cmd.at(-1)?.args).toContain(`dist/${target}/main.js`);
      // From the Node image (a stage with no instructions of its own) only the node binary: npm,
      // npx, corepack and yarn (/usr/local/lib/node_modules, /opt/yarn-*) are in no layer.
      const fromNode = copies(stages).filter((c) => c.from === 'node');
      expect(fromNode).toEqual([
        { from: 'node', sources: ['/usr/local/bin/node'], dest: '/usr/local/bin/node' },
      ]);
      expect(dockerfile.find((s) => s.name === 'node')).toMatchObject({
        from: '${NODE_IMAGE}',
        instructions: [],
      });
    }
  });

  it('runs as a numeric non-root user and installs production dependencies only in the final image', () => {
    for (const target of ['runtime', 'operator']) {
      const stages = chain(dockerfile, target);
      const users = stages.flatMap((s) => s.instructions).filter((i) => i.op === 'USER');
      expect(users.at(-1)?.args).toMatch(/^[1-9]\d*(:\d+)?$/);
      const fromOtherStages = copies(stages).filter((c) => c.from !== undefined);
      // The dependencies come from another stage, so the check below has something to check.
      expect(fromOtherStages.map((c) => c.dest)).toContain('node_modules');
      for (const c of fromOtherStages) {
        const source = dockerfile.find((s) => s.name === c.from);
        expect(source).toBeDefined();
        if (c.dest === 'node_modules') {
          const runs = (source?.instructions ?? []).filter((i) => i.op === 'RUN').map((i) => i.args);
          expect(runs.some((r) => /npm ci\b.*--omit=dev/.test(r))).toBe(true);
        }
      }
      // Nothing in the final stages installs or compiles: that happens in the build stages.
      expect(stages.flatMap((s) => s.instructions).filter((i) => i.op === 'RUN')).toEqual([]);
    }
  });

  it('copies only files that exist and that .dockerignore lets into the build context', () => {
    const all = [...new Set(dockerfile.map((s) => s.name))].flatMap((n) =>
      copies([dockerfile.find((s) => s.name === n) as Stage]),
    );
    const fromContext = all.filter((c) => c.from === undefined).flatMap((c) => c.sources);
    expect(fromContext.length).toBeGreaterThan(5);
    for (const source of fromContext) {
      expect(existsSync(path.join(repoRoot, source))).toBe(true);
      for (const file of filesUnder(source).filter((f) => !f.endsWith('.test.ts'))) {
        expect([file, passesDockerignore(ignore, file)]).toEqual([file, true]);
      }
    }
    expect(passesDockerignore(ignore, 'node_modules/typescript/package.json')).toBe(false);
    expect(passesDockerignore(ignore, 'test/integration/chart/chart.test.ts')).toBe(false);
    expect(passesDockerignore(ignore, '.git/config')).toBe(false);
  });
});

describe('image layout, staged as the Dockerfile lays it out', () => {
  let root = '';
  const asRoot = process.getuid?.() === 0;
  const replayed = new Map<string, { dir: string; workdir: string }>();

  /**
   * Replays a stage chain of the Dockerfile in a directory standing for its WORKDIR: COPY from the
   * build context and from other (replayed) stages, RUN with BuildKit's --mount flags dropped.
   * Only the FROM image is not reproduced: the commands run with this machine's node and npm.
   */
  function replay(target: string): { dir: string; workdir: string } {
    const done = replayed.get(target);
    if (done) return done;
    const dir = path.join(root, target);
    mkdirSync(dir);
    let workdir = '/';
    const inDir = (p: string): string => path.join(dir, path.relative(workdir, path.resolve(workdir, p)));
    for (const stage of chain(dockerfile, target)) {
      for (const i of stage.instructions) {
        if (i.op === 'WORKDIR') {
          workdir = path.resolve(workdir, i.args);
          if (path.relative('/', workdir).startsWith('..')) throw new Error(`WORKDIR ${i.args}`);
        } else if (i.op === 'COPY') {
          const [c] = copies([{ ...stage, instructions: [i] }]) as [Copy];
          // From an image as it is (a stage with no instructions: the node binary of the Node
          // image): not reproduced, like FROM; the programs run with this machine's node.
          if (c.from !== undefined && dockerfile.find((s) => s.name === c.from)?.instructions.length === 0) {
            continue;
          }
          const from = c.from === undefined ? undefined : replay(c.from);
          const sourcePath = (source: string): string =>
            from ? path.join(from.dir, path.relative(from.workdir, source)) : path.join(repoRoot, source);
          const intoDir = c.sources.length > 1 || c.dest.endsWith('/');
          for (const source of c.sources) {
            const target = intoDir ? path.join(inDir(c.dest), path.basename(source)) : inDir(c.dest);
            mkdirSync(path.dirname(target), { recursive: true });
            cpSync(sourcePath(source), target, { recursive: true });
          }
        } else if (i.op === 'RUN') {
          mustRun('bash', ['-c', i.args.replace(/--mount=\S+\s+/g, '')], {
            cwd: inDir('.'),
            env: { ...process.env, npm_config_prefer_offline: 'true', NODE_OPTIONS: '' },
            timeoutMs: 900_000,
          });
        } else if (!['ENV', 'ARG', 'LABEL', 'USER', 'EXPOSE', 'CMD', 'ENTRYPOINT'].includes(i.op)) {
          throw new Error(`${stage.name}: ${i.op} is not replayed`);
        }
      }
    }
    const result = { dir, workdir };
    replayed.set(target, result);
    return result;
  }

  /** The directory standing for a staged image's WORKDIR (/app). */
  const appOf = (target: string): string => {
    const r = replayed.get(target);
    if (!r) throw new Error(`${target} was not staged`);
    return r.dir;
  };

  /** Runs node in a staged image's WORKDIR as user 1000 (when the tests run as root), with a bare environment. */
  function node(target: string, args: string[]): RunResult {
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/tmp', NODE_ENV: 'production' };
    const command = asRoot ? 'setpriv' : process.execPath;
    const prefix = asRoot ? ['--reuid=1000', '--regid=1000', '--clear-groups', process.execPath] : [];
    return run(command, [...prefix, ...args], { cwd: appOf(target), env, timeoutMs: 60_000 });
  }

  beforeAll(() => {
    root = mkdtempSync(path.join(tmpdir(), 'flashsale-image-'));
    chmodSync(root, 0o755);
    for (const target of ['runtime', 'operator']) replay(target);
    // The image's files belong to root and are not writable by the user the programs run as.
    mustRun('chmod', ['-R', 'a-w,a+rX', root]);
  }, 1_800_000);

  afterAll(() => {
    if (root === '') return;
    run('chmod', ['-R', 'u+w', root]);
    rmSync(root, { recursive: true, force: true });
  });

  it('has production dependencies only', () => {
    const pkg = JSON.parse(readText(path.join(repoRoot, 'package.json'))) as {
      dependencies: Record<string, string>;
    };
    const app = appOf('runtime');
    for (const dep of Object.keys(pkg.dependencies)) {
      expect([dep, existsSync(path.join(app, 'node_modules', dep, 'package.json'))]).toEqual([dep, true]);
    }
    // Every package the lock file marks dev-only (typescript, jest, eslint and what they pull in) is absent.
    const lock = JSON.parse(readText(path.join(repoRoot, 'package-lock.json'))) as {
      packages: Record<string, { dev?: boolean }>;
    };
    const devOnly = Object.entries(lock.packages)
      .filter(([key, meta]) => key.startsWith('node_modules/') && meta.dev === true)
      .map(([key]) => key);
    expect(devOnly).toEqual(expect.arrayContaining(['node_modules/typescript', 'node_modules/jest']));
    expect(devOnly.filter((key) => existsSync(path.join(app, key)))).toEqual([]);
  });

  it('ships every package of patches/ with its patch applied (docs/images.md "Patched dependencies")', () => {
    // Every patch the project carries, so a new one that the Dockerfile's prod-deps stage forgets
    // to copy fails here.
    const patches = readdirSync(path.join(repoRoot, 'patches')).filter((f) => f.endsWith('.patch'));
    expect(patches).toEqual(expect.arrayContaining(['kafkajs+2.2.4.patch', 'ioredis+5.11.1.patch']));
    // A patch applies in reverse to the staged image's files only when they carry it.
    for (const target of ['runtime', 'operator'])
      for (const name of patches) {
        const patch = path.join(repoRoot, 'patches', name);
        // Outside a repository git apply works on the directory's files, like patch(1).
        const check = run('git', ['apply', '--check', '--reverse', patch], {
          cwd: appOf(target),
          timeoutMs: 60_000,
        });
        expect([target, name, check.status, check.stderr]).toEqual([target, name, 0, '']);
      }
  });

  it('holds no source maps, demo, scripts or tests: only the files docs/images.md lists', () => {
    const all = (dir: string, rel = ''): string[] =>
      readdirSync(path.join(dir, rel), { withFileTypes: true }).flatMap((e) =>
        e.isDirectory() ? all(dir, path.join(rel, e.name)) : [path.join(rel, e.name)],
      );
    for (const target of ['runtime', 'operator']) {
      const app = appOf(target);
      const top = readdirSync(app).sort();
      expect(top).toEqual(
        target === 'runtime'
          ? ['dist', 'lua', 'node_modules', 'package.json', 'runtime']
          : ['dist', 'lua', 'node_modules', 'package.json'],
      );
      const dist = all(path.join(app, 'dist'));
      expect(dist.length).toBeGreaterThan(20);
      expect(dist.filter((f) => f.endsWith('.map'))).toEqual([]);
      expect(dist.filter((f) => !f.endsWith('.js'))).toEqual([]);
      expect(readdirSync(path.join(app, 'dist')).sort()).toEqual(['core', 'operator', 'runtime']);
      expect(dist.filter((f) => /demo|\.test\./.test(f))).toEqual([]);
      expect(existsSync(path.join(app, 'dist', 'operator', 'upgrade-guard.js'))).toBe(true);
    }
  });

  it('finds the Lua scripts from dist/core (the script registry walks up to /app/lua)', () => {
    const r = node('runtime', [
      '--input-type=module',
      '-e',
      "const m = await import('./dist/core/scripts.js'); console.log(m.luaDirectory()); console.log([...m.loadScripts().keys()].sort().join(','));",
    ]);
    expect(r.stderr).toBe('');
    const [dir, names] = r.stdout.trim().split('\n');
    expect(dir).toBe(path.join(appOf('runtime'), 'lua'));
    expect(names?.split(',')).toEqual(expect.arrayContaining(['reserve', 'release', 'setGate']));
  });

  it('runs the runtime: every import resolves, then the configuration check stops it', () => {
    const usage = node('runtime', ['dist/runtime/main.js']);
    expect(usage.status).toBe(2);
    expect(usage.stderr).toMatch(/usage: runtime <api\|relay\|consumer\|jobs\|all/);
    const api = node('runtime', ['dist/runtime/main.js', 'api']);
    expect(api.status).not.toBe(0);
    expect(`${api.stdout}${api.stderr}`).not.toMatch(/ERR_MODULE_NOT_FOUND|Cannot find (module|package)/);
    expect(`${api.stdout}${api.stderr}`).toMatch(/invalid configuration[\s\S]*REDIS_URL/);
    expect(existsSync(path.join(appOf('runtime'), 'runtime', 'api', 'openapi.yaml'))).toBe(true);
  });

  it('runs the operator: every import resolves, then the configuration check stops it', () => {
    expect(existsSync(path.join(appOf('operator'), 'dist', 'operator', 'main.js'))).toBe(true);
    const r = node('operator', ['dist/operator/main.js']);
    expect(r.status).not.toBe(0);
    expect(`${r.stdout}${r.stderr}`).not.toMatch(/ERR_MODULE_NOT_FOUND|Cannot find (module|package)/);
    expect(`${r.stdout}${r.stderr}`).toMatch(/invalid configuration[\s\S]*DATABASE_URL/);
  });
});
