/**
 * The operator's refund command (docs/after-sale.md "Refunds"):
 *
 *   node dist/runtime/main.js refund request <orderId> [--reason TEXT] [--by NAME]
 *   node dist/runtime/main.js refund list [--activity ID] [--state PENDING|SUCCEEDED|FAILED] [--limit N] [--json]
 *   node dist/runtime/main.js refund retry <refundId>
 *   (also `node dist/runtime/refund-cli.js ...`; in development `node --import tsx runtime/refund-cli.ts ...`)
 *
 * Environment: DATABASE_URL (required). `request` moves a PAID order to REFUNDING with a PENDING
 * refund (the same path as the buyer endpoint); the refund worker does the rest. `retry` sends a
 * FAILED refund again with the same refund id (the provider refunds at most once per id).
 * Exit codes: 0 ok, 1 refused (the code is printed) or error, 2 usage.
 */
import { randomUUID } from 'node:crypto';
import { createPool } from '../core/db/pool.js';
import { listRefunds, reopenRefund } from '../core/db/refunds-store.js';
import type { RefundState } from '../core/db/refunds-store.js';
import { FlashSaleError } from '../core/errors.js';
import { isSafeId } from '../core/keys.js';
import { createLogger } from '../core/logger.js';
import { requestOrderRefund } from '../core/refunds.js';
import { UsageError, cliCommand, commandLine, missingVariable, runIfMain } from './cli.js';

const USAGE = `usage: refund <request|list|retry> [options]
  request <orderId> [--reason TEXT] [--by NAME]   refund a PAID order (order -> REFUNDING)
  list [--activity ID] [--state S] [--limit N] [--json]
  retry <refundId>                                  send a FAILED refund again (same refund id)
env: DATABASE_URL`;

interface Args {
  command: string;
  target: string | undefined;
  reason: string;
  by: string;
  activity: string | undefined;
  state: RefundState | undefined;
  limit: number;
  json: boolean;
}

function readArgs(argv: string[], env: NodeJS.ProcessEnv): Args {
  const parsed = commandLine(argv, {
    reason: { type: 'string' },
    by: { type: 'string' },
    activity: { type: 'string' },
    state: { type: 'string' },
    limit: { type: 'string' },
    json: { type: 'boolean' },
  });
  const [command = '', target, ...extra] = parsed.positionals;
  const { values } = parsed;
  if (extra.length > 0) throw new UsageError(`unexpected argument ${extra[0]!}`);
  const args: Args = {
    command,
    target,
    reason: values.reason ?? 'OPERATOR_REQUEST',
    by: values.by ?? (env.USER || 'operator'),
    activity: values.activity,
    state: values.state as RefundState | undefined,
    limit: values.limit === undefined ? 100 : Number(values.limit),
    json: values.json ?? false,
  };
  if (!['request', 'list', 'retry'].includes(command)) throw new UsageError('unknown command');
  if (command === 'request' && !/^[1-9]\d{0,18}$/.test(args.target ?? '')) {
    throw new UsageError('request takes an order id (digits)');
  }
  if (command === 'retry' && !/^rf-[0-9a-f]{32}$/.test(args.target ?? '')) {
    throw new UsageError('retry takes a refund id (rf-...)');
  }
  if (command === 'list' && args.target !== undefined) throw new UsageError('list takes no argument');
  if (args.activity !== undefined && !isSafeId(args.activity))
    throw new UsageError('--activity is not a valid id');
  if (args.state !== undefined && !['PENDING', 'SUCCEEDED', 'FAILED'].includes(args.state)) {
    throw new UsageError('--state is PENDING, SUCCEEDED or FAILED');
  }
  if (!/^[\x20-\x7e]{1,200}$/.test(args.reason)) throw new UsageError('--reason: 1-200 printable characters');
  if (!/^[A-Za-z0-9._@-]{1,64}$/.test(args.by))
    throw new UsageError('--by: 1-64 characters of [A-Za-z0-9._@-]');
  if (!Number.isInteger(args.limit) || args.limit < 1)
    throw new UsageError('--limit must be a positive integer');
  return args;
}

/** Runs the command; returns the process exit code. Output goes to `out`. */
export const runRefundCli = cliCommand(USAGE, readArgs, async (args, env, out, err) => {
  if (!env.DATABASE_URL) return missingVariable('DATABASE_URL', err);
  const pool = createPool(env.DATABASE_URL, 2, 'flashsale-refund-cli');
  const logger = createLogger('refund-cli', env.LOG_LEVEL ?? 'warn');
  try {
    if (args.command === 'request') {
      const r = await requestOrderRefund(
        { pool, logger },
        {
          orderId: args.target!,
          reason: args.reason,
          requestedBy: `operator:${args.by}`,
          traceId: randomUUID().replaceAll('-', ''),
        },
      );
      out(
        `${r.outcome} refund ${r.refund.refundId} of order ${r.order.id} (${r.refund.amount}); order is REFUNDING`,
      );
      return 0;
    }
    if (args.command === 'retry') {
      if (!(await reopenRefund(pool, args.target!))) {
        err(`refund ${args.target} is not FAILED (or does not exist)\n`);
        return 1;
      }
      out(`refund ${args.target} is PENDING again; the worker sends it with the same id`);
      return 0;
    }
    const rows = await listRefunds(pool, { activityId: args.activity, state: args.state, limit: args.limit });
    if (args.json) out(JSON.stringify(rows, null, 2));
    else {
      out(`${rows.length} refund(s)`);
      for (const r of rows) {
        out(
          `${r.refundId}\t${r.state}\torder=${r.orderId}\t${r.kind}\t${r.amount}\t${r.reason}\tattempts=${r.attempts}\t${r.lastError ?? ''}`,
        );
      }
    }
    return 0;
  } catch (e) {
    if (e instanceof FlashSaleError) {
      err(`${e.code}: ${e.message}\n`);
      return 1;
    }
    throw e;
  } finally {
    await pool.end();
  }
});

runIfMain(import.meta.url, runRefundCli);
