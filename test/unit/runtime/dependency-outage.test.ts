// What a failed dependency answers (core/errors.ts dependencyOutage): a retry may succeed after a
// connection failure, a timeout or a Redis refusal (nothing written), so 503 UNAVAILABLE; any
// other error stays a 500. And the api's log of such failures (runtime/api/problem.ts outageLog):
// one line per interval, counting the ones left out, whatever the rate of failures.
import { jest } from '@jest/globals';
import { ReplyError } from 'ioredis';
import { dependencyOutage, FlashSaleError } from '../../../core/errors.js';
import type { Logger } from '../../../core/logger.js';
import { outageLog } from '../../../runtime/api/problem.js';

describe('dependencyOutage', () => {
  test.each([
    "OOM command not allowed when used memory > 'maxmemory'. script: 5ef6d3ba, on @user_script:1.",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
    "READONLY You can't write against a read only replica.",
    'LOADING Redis is loading the dataset in memory',
    'MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to no.',
    'CLUSTERDOWN The cluster is down',
    'TRYAGAIN Multiple keys request during rehashing of slot',
    'NOREPLICAS Not enough good replicas to write.',
    'BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.',
    'MOVED 9555 127.0.0.1:17990',
    'ASK 9555 127.0.0.1:12296',
  ])('a Redis refusal is an outage, nothing written: %s', (message) => {
    expect(dependencyOutage(new ReplyError(message))).toBe('refused');
  });

  // ioredis' Cluster gives up after 16 redirections and names the last one (a slot migrating).
  test.each([
    'Too many Cluster redirections. Last error: ReplyError: TRYAGAIN Multiple keys request during rehashing of slot',
    'Too many Cluster redirections. Last error: ReplyError: MOVED 9555 127.0.0.1:17990',
    'Too many Cluster redirections. Last error: ReplyError: CLUSTERDOWN The cluster is down',
  ])('a cluster that kept redirecting is a refusal, nothing written: %s', (message) => {
    expect(dependencyOutage(new Error(message))).toBe('refused');
  });

  test('a cluster that gave up on a closed connection is unanswered', () => {
    expect(
      dependencyOutage(new Error('Too many Cluster redirections. Last error: Error: Connection is closed.')),
    ).toBe('unanswered');
  });

  test.each([
    'connect ECONNREFUSED 127.0.0.1:6379',
    'read ECONNRESET',
    'Connection is closed.',
    'Reached the max retries per request limit (which is 20). Refer to "maxRetriesPerRequest" option for details.',
    'Command timed out',
    'Query read timeout',
  ])('a dependency that does not answer is an outage: %s', (message) => {
    expect(dependencyOutage(new Error(message))).toBe('unanswered');
  });

  test.each([
    ['57P01', 'terminating connection due to administrator command'],
    ['57P03', 'the database system is starting up'],
    ['08006', 'connection failure'],
    ['53300', 'sorry, too many clients already'],
    ['40001', 'could not serialize access due to concurrent update'],
    ['40P01', 'deadlock detected'],
  ])('a PostgreSQL failure whose transaction a retry may redo is an outage: %s %s', (code, message) => {
    expect(dependencyOutage(Object.assign(new Error(message), { code }))).toBe('unanswered');
    expect(dependencyOutage(new Error('Connection terminated unexpectedly'))).toBe('unanswered');
  });

  test('a PostgreSQL error of the statement is not', () => {
    const unique = Object.assign(new Error('duplicate key value violates unique constraint "orders_pkey"'), {
      code: '23505',
    });
    expect(dependencyOutage(unique)).toBeUndefined();
  });

  test.each([
    'ERR Error running script (call to f_1234): @user_script:12: user_script:12: attempt to compare nil with number',
    'WRONGTYPE Operation against a key holding the wrong kind of value',
    'NOSCRIPT No matching script. Please use EVAL.',
    // A word that only begins like a refusal is not one.
    'OOMPH something else',
    'Too many Cluster redirections. Last error: ReplyError: ERR unknown command',
    'syntax error at or near "SELECT"',
  ])('any other error is not: %s', (message) => {
    expect(dependencyOutage(new ReplyError(message))).toBeUndefined();
  });

  test('a FlashSaleError is an answer of ours, never an outage', () => {
    expect(dependencyOutage(new FlashSaleError('UNAVAILABLE', 'Command timed out'))).toBeUndefined();
    expect(dependencyOutage(undefined)).toBeUndefined();
  });
});

describe('outageLog', () => {
  const recorder = () => {
    const lines: { fields: Record<string, unknown>; msg: string }[] = [];
    const logger = {
      error: (fields: Record<string, unknown>, msg: string) => lines.push({ fields, msg }),
    } as unknown as Logger;
    return { lines, logger };
  };

  afterEach(() => {
    jest.useRealTimers();
  });

  test('logs the first failure at once and the rest of its interval as one line when it ends', () => {
    jest.useFakeTimers({ now: 1_000_000 });
    const { lines, logger } = recorder();
    const log = outageLog(logger, 1000);
    for (let i = 0; i < 5000; i += 1) log({ path: '/v1/activities/a/orders', n: i });
    expect(lines).toEqual([
      {
        fields: { path: '/v1/activities/a/orders', n: 0, unloggedSinceLast: 0 },
        msg: 'a dependency is unavailable',
      },
    ]);
    jest.advanceTimersByTime(999);
    log({ n: 5000 });
    expect(lines).toHaveLength(1);
    // The interval ends: its last failure, counting the 4,999 before it (n 1 … 4999).
    jest.advanceTimersByTime(1);
    expect(lines).toHaveLength(2);
    expect(lines[1]!.fields).toEqual({ n: 5000, unloggedSinceLast: 4999 });
    // Still failing: at most one line a second.
    log({ n: 5001 });
    log({ n: 5002 });
    expect(lines).toHaveLength(2);
    jest.advanceTimersByTime(1000);
    expect(lines).toHaveLength(3);
    expect(lines[2]!.fields).toEqual({ n: 5002, unloggedSinceLast: 1 });
  });

  test('a burst that ends within its second is counted in full without a next failure', () => {
    jest.useFakeTimers({ now: 2_000_000 });
    const { lines, logger } = recorder();
    const log = outageLog(logger, 1000);
    for (let i = 0; i < 200; i += 1) log({ n: i });
    jest.advanceTimersByTime(60_000);
    expect(lines.map((l) => l.fields)).toEqual([
      { n: 0, unloggedSinceLast: 0 },
      { n: 199, unloggedSinceLast: 198 },
    ]);
    // After a quiet interval the next failure is logged at once.
    log({ n: 200 });
    expect(lines).toHaveLength(3);
    expect(lines[2]!.fields).toEqual({ n: 200, unloggedSinceLast: 0 });
    expect(jest.getTimerCount()).toBe(0);
  });
});
