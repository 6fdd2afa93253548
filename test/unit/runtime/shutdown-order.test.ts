// The shutdown order of a role process (runtime/roles/process.ts): stop taking HTTP, finish the
// relay's and the consumer's batches in flight, stop the jobs, close pools and clients; roles
// composed into one process (`all`) keep it whatever order their parts were started in.
import { closeInOrder, inShutdownOrder, RoleReadiness } from '../../../runtime/roles/process.js';
import type { Closer } from '../../../runtime/roles/process.js';
import { createLogger } from '../../../core/logger.js';

const closer = (stage: Closer['stage'], name: string, log: string[] = []): Closer => ({
  stage,
  name,
  close: async () => {
    log.push(name);
  },
});

describe('shutdown order', () => {
  it('runs HTTP, then in-flight work, then jobs, then clients; in given order within a stage', async () => {
    const log: string[] = [];
    // As `all` lists them: each role's parts, stages interleaved.
    const closers = [
      closer('clients', 'restock subscriber', log),
      closer('http', 'service port', log),
      closer('jobs', 'money jobs', log),
      closer('work', 'relay loop 0', log),
      closer('http', 'admission control', log),
      closer('work', 'order consumer', log),
      closer('clients', 'postgres pool', log),
      closer('jobs', 'gauges', log),
    ];
    expect(inShutdownOrder(closers).map((c) => c.name)).toEqual([
      'service port',
      'admission control',
      'relay loop 0',
      'order consumer',
      'money jobs',
      'gauges',
      'restock subscriber',
      'postgres pool',
    ]);
    await closeInOrder(closers, createLogger('test', 'silent'));
    expect(log).toEqual(inShutdownOrder(closers).map((c) => c.name));
  });

  it('a closer that fails does not stop the ones after it', async () => {
    const log: string[] = [];
    const failing: Closer = {
      stage: 'work',
      name: 'broken',
      close: () => Promise.reject(new Error('boom')),
    };
    await closeInOrder(
      [closer('clients', 'redis', log), failing, closer('http', 'service port', log)],
      createLogger('test', 'silent'),
    );
    expect(log).toEqual(['service port', 'redis']);
  });
});

describe('role readiness', () => {
  it('is ready only once started, with every part ready, and never while stopping', async () => {
    const r = new RoleReadiness();
    let consumer = 'joining';
    r.probe('redis', async () => 'PONG');
    r.report('consumer', () => consumer);
    expect(await r.check()).toEqual({ ready: false, checks: { redis: 'ok', consumer: 'joining' } });
    consumer = 'consuming';
    expect(await r.check()).toEqual({
      ready: false,
      checks: { redis: 'ok', consumer: 'consuming', process: 'starting' },
    });
    r.started = true;
    expect(await r.check()).toEqual({ ready: true, checks: { redis: 'ok', consumer: 'consuming' } });
    r.probe('postgres', () => Promise.reject(new Error('connection refused')));
    expect(await r.check()).toEqual({
      ready: false,
      checks: { redis: 'ok', consumer: 'consuming', postgres: 'error: connection refused' },
    });
    r.stopping = true;
    expect(await r.check()).toEqual({ ready: false, checks: { process: 'stopping' } });
  });
});
