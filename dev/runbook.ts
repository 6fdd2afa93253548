/**
 * The runtime commands of docs/runbooks/ as written, for the tests that run them: a page's
 * `node dist/runtime/main.js …` command (what an operator types inside `kubectl exec … --`), with
 * the page's placeholders (`ID`, `P:O`, `<refundId>`, see docs/runbooks/README.md) replaced, run
 * by the program's entry point. A page that no longer has the command, or a command the program no
 * longer takes, fails the test that names it.
 *
 * `dist/runtime/main.js` is `runtime/main.ts` compiled; the command runs the source through tsx,
 * as dev/roles.ts starts the roles, so it needs no build and runs the code under test (a broken
 * build of test/faults/mutants/ is a copy of the sources, without dist/).
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { ROOT } from './roles.js';

const PROGRAM = 'node dist/runtime/main.js';

/**
 * The arguments of the first complete command on `page` (a file of docs/runbooks/) that begins
 * with `node dist/runtime/main.js <what>`, each placeholder token replaced by its value. An elided
 * command (`…`, `...`) is not one to run.
 */
export function runbookCommand(page: string, what: string, values: Record<string, string>): string[] {
  const text = readFileSync(join(ROOT, 'docs', 'runbooks', page), 'utf8');
  const prefix = `${PROGRAM} ${what}`;
  for (const line of text.split('\n')) {
    for (let at = line.indexOf(prefix); at >= 0; at = line.indexOf(prefix, at + 1)) {
      // The command ends with its code span, or with the line in a code block.
      const end = line.indexOf('`', at);
      const command = (end < 0 ? line.slice(at) : line.slice(at, end)).trim();
      if (command.includes('…') || command.includes('...')) continue;
      const args = command.slice(PROGRAM.length).trim().split(/\s+/);
      return args.map((a) => values[a] ?? a);
    }
  }
  throw new Error(`docs/runbooks/${page} has no complete command "${prefix} …"`);
}

export interface CommandResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `node dist/runtime/main.js <args>` (from source) in the repository's root with `env` added. */
export async function runRuntimeCommand(args: string[], env: Record<string, string>): Promise<CommandResult> {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, ...env };
  delete childEnv.NODE_OPTIONS; // jest's flags are not the command's
  try {
    const { stdout, stderr } = await promisify(execFile)(
      process.execPath,
      ['--import', 'tsx', join(ROOT, 'runtime', 'main.ts'), ...args],
      { cwd: ROOT, env: childEnv, timeout: 120_000 },
    );
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number | string; stdout?: string; stderr?: string };
    if (typeof e.code !== 'number') throw err;
    return { code: e.code, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}
