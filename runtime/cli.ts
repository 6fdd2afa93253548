/**
 * The frame the operator's commands (dlq.ts, refund-cli.ts) share: a usage error prints its
 * message and the usage and exits 2, a missing variable is a configuration error (exit 2, worded
 * as the roles' configuration check), output goes through replaceable printers (tests collect
 * it), and a module run directly runs its command and exits with its code (1 on an unexpected
 * error).
 */
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import type { ParseArgsOptionsConfig } from 'node:util';

/** A bad command line: printed with the usage, exit code 2. */
export class UsageError extends Error {}

/** The command line read by `node:util` parseArgs (positionals allowed); a refusal is a usage error. */
export function commandLine<const O extends ParseArgsOptionsConfig>(argv: string[], options: O) {
  try {
    return parseArgs({ args: argv, allowPositionals: true, options });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** Prints one line of output. */
export type PrintLine = (line: string) => void;
/** Prints text to the error stream (newlines included). */
export type PrintError = (text: string) => void;

/** A command: the exit code of running `argv` (output to `out`, errors to `err`). */
export type Command = (
  argv: string[],
  env?: NodeJS.ProcessEnv,
  out?: PrintLine,
  err?: PrintError,
) => Promise<number>;

/** A command from its usage, its argument parser (throwing UsageError) and what it runs. */
export function cliCommand<A>(
  usage: string,
  parse: (argv: string[], env: NodeJS.ProcessEnv) => A,
  run: (args: A, env: NodeJS.ProcessEnv, out: PrintLine, err: PrintError) => Promise<number>,
): Command {
  return async (
    argv,
    env = process.env,
    out = (l) => process.stdout.write(`${l}\n`),
    err = (t) => process.stderr.write(t),
  ) => {
    let args: A;
    try {
      args = parse(argv, env);
    } catch (e) {
      if (!(e instanceof UsageError)) throw e;
      err(`${e.message}\n${usage}\n`);
      return 2;
    }
    return run(args, env, out, err);
  };
}

/** Prints the configuration error of a variable that is not set; returns exit code 2. */
export function missingVariable(name: string, err: PrintError): 2 {
  err(`invalid configuration:\n  ${name}: required\n`);
  return 2;
}

/** When `moduleUrl` is the program node was started with: runs the command and exits with its code. */
export function runIfMain(moduleUrl: string, command: Command): void {
  if (!process.argv[1] || moduleUrl !== pathToFileURL(process.argv[1]).href) return;
  command(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err: unknown) => {
      process.stderr.write(`${(err as Error).message}\n`);
      process.exit(1);
    },
  );
}
