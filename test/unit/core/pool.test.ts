import { isTransientDbError } from '../../../core/db/pool.js';

describe('transient database errors', () => {
  test('connection loss and server restarts are retried, whatever field carries them', () => {
    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' });
    const starting = Object.assign(new Error('the database system is starting up'), { code: '57P03' });
    const terminated = Object.assign(new Error('terminating connection due to administrator command'), {
      code: '57P01',
    });
    const dropped = new Error('Connection terminated unexpectedly');
    const broken = new Error('Client has encountered a connection error and is not queryable');
    for (const e of [refused, starting, terminated, dropped, broken])
      expect(isTransientDbError(e)).toBe(true);
    expect(isTransientDbError(Object.assign(new Error('x'), { code: '40001' }))).toBe(true);
  });

  test('a server that refuses every write for now is retried: disk full, a standby, an I/O error', () => {
    for (const code of ['53000', '53100', '53200', '53300', '25006', '58000', '58030', '58P01'])
      expect([code, isTransientDbError(Object.assign(new Error('refused'), { code }))]).toEqual([code, true]);
    // A limit a statement exceeds every time (max_locks_per_transaction) is the statement's.
    expect(isTransientDbError(Object.assign(new Error('out of shared memory'), { code: '53400' }))).toBe(
      false,
    );
  });

  test('errors caused by the data itself are not retried forever', () => {
    const check = Object.assign(new Error('new row violates check constraint'), { code: '23514' });
    const invalid = Object.assign(new Error('invalid input syntax for type numeric'), { code: '22P02' });
    for (const e of [check, invalid, new Error('boom'), null, undefined])
      expect(isTransientDbError(e)).toBe(false);
  });
});
