import type { CoordinationV1Api, V1Lease } from '@kubernetes/client-node';
import { createLogger } from '../../../core/logger.js';
import { LeaderElector, microTime } from '../../../operator/controller/leader-election.js';

class ApiError extends Error {
  constructor(readonly code: number) {
    super(`HTTP ${code}`);
  }
}

/** An in-memory Lease endpoint with the API server's optimistic concurrency. */
class FakeLeases {
  lease: V1Lease | undefined;
  version = 0;
  reads = new Map<string, number>();
  failWritesOf = new Set<string>();
  /** Callers whose reads the server never answers (a partition: the request is sent, no reply). */
  unansweredReadsOf = new Set<string>();
  /** Callers whose reads are answered only once the promise settles (with the Lease as it is then). */
  heldReadsOf = new Map<string, Promise<void>>();
  writes: string[] = [];

  api(caller: string): CoordinationV1Api {
    const api = {
      readNamespacedLease: async () => {
        this.reads.set(caller, (this.reads.get(caller) ?? 0) + 1);
        if (this.unansweredReadsOf.has(caller)) return new Promise<V1Lease>(() => undefined);
        await this.heldReadsOf.get(caller);
        if (!this.lease) throw new ApiError(404);
        return structuredClone(this.lease);
      },
      createNamespacedLease: async ({ body }: { body: V1Lease }) => {
        if (this.lease) throw new ApiError(409);
        return this.store(caller, body);
      },
      replaceNamespacedLease: async ({ body }: { body: V1Lease }) => {
        if (this.failWritesOf.has(caller)) throw new ApiError(500);
        if (body.metadata?.resourceVersion !== this.lease?.metadata?.resourceVersion) throw new ApiError(409);
        return this.store(caller, body);
      },
    };
    return api as unknown as CoordinationV1Api;
  }

  private store(caller: string, body: V1Lease): V1Lease {
    this.version += 1;
    this.lease = {
      ...structuredClone(body),
      metadata: { ...body.metadata, resourceVersion: String(this.version) },
    };
    this.writes.push(`${caller}:${this.lease.spec?.holderIdentity ?? ''}`);
    return structuredClone(this.lease);
  }

  get holder(): string | undefined {
    return this.lease?.spec?.holderIdentity;
  }
}

const log = createLogger('test', 'silent');

async function until(what: string, cond: () => boolean): Promise<void> {
  for (let i = 0; i < 2_000; i += 1) {
    if (cond()) return;
    await new Promise((r) => setTimeout(r, 2));
  }
  throw new Error(`never: ${what}`);
}

interface Candidate {
  elector: LeaderElector;
  started: number;
  stopped: number;
  clock: { now: number };
}

function candidate(
  fake: FakeLeases,
  identity: string,
  clock = { now: 1_000_000 },
  renewDeadlineMs = 10_000,
  monotonic?: { now: number },
): Candidate {
  const c: Candidate = { elector: undefined as unknown as LeaderElector, started: 0, stopped: 0, clock };
  c.elector = new LeaderElector({
    api: fake.api(identity),
    namespace: 'ns',
    name: 'flashsale-operator',
    identity,
    leaseDurationMs: 15_000,
    renewDeadlineMs,
    retryPeriodMs: 1,
    log,
    onStartedLeading: () => {
      c.started += 1;
    },
    onStoppedLeading: () => {
      c.stopped += 1;
    },
    now: () => c.clock.now,
    ...(monotonic ? { elapsed: () => monotonic.now } : {}),
  });
  return c;
}

describe('LeaderElector', () => {
  it('formats MicroTime with six fractional digits', () => {
    expect(String(microTime(Date.parse('2030-01-01T00:00:00.123Z')))).toBe('2030-01-01T00:00:00.123000Z');
  });

  it('lets one candidate lead; the other waits, and takes over at once when the Lease is released', async () => {
    const fake = new FakeLeases();
    const a = candidate(fake, 'a');
    const b = candidate(fake, 'b');
    void a.elector.run();
    await until('a leads', () => a.started === 1);
    void b.elector.run();
    const readsBefore = fake.reads.get('b') ?? 0;
    await until('b retried a few times', () => (fake.reads.get('b') ?? 0) >= readsBefore + 20);
    expect(b.started).toBe(0);
    expect(fake.holder).toBe('a');
    expect(fake.writes.filter((w) => w.startsWith('b:'))).toEqual([]);

    await a.elector.release();
    expect(fake.writes).toContain('a:'); // the release wrote an empty holder
    await until('b leads', () => b.started === 1);
    expect(fake.holder).toBe('b');
    expect(fake.lease?.spec?.leaseTransitions).toBe(1);
    expect(a.stopped).toBe(0); // a released; it did not lose the Lease
    b.elector.stop();
  });

  it('a renewal under way when the leader releases the Lease neither takes it back nor spoils the release', async () => {
    const fake = new FakeLeases();
    const a = candidate(fake, 'a');
    void a.elector.run();
    await until('a leads', () => a.started === 1);
    let answer = (): void => undefined;
    fake.heldReadsOf.set(
      'a',
      new Promise<void>((resolve) => {
        answer = resolve;
      }),
    );
    const readsBefore = fake.reads.get('a') ?? 0;
    await until('a renewal under way', () => (fake.reads.get('a') ?? 0) > readsBefore);
    const released = a.elector.release();
    answer();
    await released;
    expect(fake.holder).toBe('');
    expect(fake.writes.at(-1)).toBe('a:');
    expect(a.stopped).toBe(0);
  });

  it('a release waits for a renewal the API server does not answer no longer than the renew deadline', async () => {
    const fake = new FakeLeases();
    const a = candidate(fake, 'a', { now: 1_000_000 }, 50);
    void a.elector.run();
    await until('a leads', () => a.started === 1);
    fake.unansweredReadsOf.add('a');
    const readsBefore = fake.reads.get('a') ?? 0;
    await until('a renewal under way', () => (fake.reads.get('a') ?? 0) > readsBefore);
    // The API server answers again, but never the renewal already sent.
    fake.unansweredReadsOf.delete('a');
    await a.elector.release();
    expect(fake.holder).toBe('');
  }, 10_000);

  it('takes over a dead leader only after the lease duration, measured on its own clock', async () => {
    const fake = new FakeLeases();
    const clock = { now: 1_000_000 };
    const a = candidate(fake, 'a', clock);
    const b = candidate(fake, 'b', clock);
    void a.elector.run();
    await until('a leads', () => a.started === 1);
    a.elector.stop(); // SIGKILL: no release, no more renewals
    void b.elector.run();
    await until('b looked', () => (fake.reads.get('b') ?? 0) >= 3);
    clock.now += 14_000;
    const reads = fake.reads.get('b') ?? 0;
    await until('b looked again', () => (fake.reads.get('b') ?? 0) >= reads + 10);
    expect(b.started).toBe(0);
    clock.now += 1_500;
    await until('b leads', () => b.started === 1);
    expect(fake.holder).toBe('b');
    b.elector.stop();
  });

  it('takes its own Lease back at once after a restart with the same identity', async () => {
    const fake = new FakeLeases();
    const first = candidate(fake, 'pod-0');
    void first.elector.run();
    await until('first leads', () => first.started === 1);
    first.elector.stop();
    const restarted = candidate(fake, 'pod-0');
    void restarted.elector.run();
    await until('restarted leads', () => restarted.started === 1);
    expect(fake.lease?.spec?.leaseTransitions).toBe(0);
    restarted.elector.stop();
  });

  it('steps down when it cannot renew within the renew deadline', async () => {
    const fake = new FakeLeases();
    const a = candidate(fake, 'a');
    const run = a.elector.run();
    await until('a leads', () => a.started === 1);
    fake.failWritesOf.add('a');
    const reads = fake.reads.get('a') ?? 0;
    await until('a failed to renew a few times', () => (fake.reads.get('a') ?? 0) >= reads + 5);
    expect(a.stopped).toBe(0); // still within the deadline
    a.clock.now += 10_000;
    await run;
    expect(a.stopped).toBe(1);
    expect(a.elector.isLeader).toBe(false);
  });

  it('steps down at its renew deadline, not a retry period after it: never past the lease a candidate waits out', async () => {
    // 15 s lease, 13 s renew deadline, 4 s retry period (client-go's defaults are 15/10/2).
    const fake = new FakeLeases();
    const monotonic = { now: 0 };
    let stoppedAt: number | undefined;
    const elector = new LeaderElector({
      api: fake.api('a'),
      namespace: 'ns',
      name: 'flashsale-operator',
      identity: 'a',
      leaseDurationMs: 15_000,
      renewDeadlineMs: 13_000,
      retryPeriodMs: 4_000,
      log,
      onStartedLeading: () => undefined,
      onStoppedLeading: () => {
        stoppedAt = monotonic.now;
      },
      now: () => 1_000_000 + monotonic.now,
      elapsed: () => monotonic.now,
      // Time passes only in the waits; every write after 9 s fails at once (the API server refuses).
      wait: async (ms) => {
        monotonic.now += ms;
        if (monotonic.now >= 9_000) fake.failWritesOf.add('a');
        await Promise.resolve();
      },
    });
    await elector.run();
    // The last renewal at 8 s: stepped down at 8 + 13 = 21 s, before a candidate takes the Lease
    // at 8 + 15 = 23 s (a wait of a whole retry period from 20 s would end at 24 s, two leaders).
    expect(stoppedAt).toBe(21_000);
  });

  it('steps down at its renew deadline even when the wall clock is stepped back meanwhile (an NTP step)', async () => {
    const fake = new FakeLeases();
    const monotonic = { now: 5_000 };
    const a = candidate(fake, 'a', { now: 1_000_000 }, 10_000, monotonic);
    const run = a.elector.run();
    await until('a leads', () => a.started === 1);
    fake.failWritesOf.add('a');
    const reads = fake.reads.get('a') ?? 0;
    await until('a failed to renew a few times', () => (fake.reads.get('a') ?? 0) >= reads + 5);
    // 10 s pass (the renew deadline); the wall clock meanwhile was stepped back 8 s.
    monotonic.now += 10_000;
    a.clock.now += 10_000 - 8_000;
    await until('a stepped down', () => a.stopped === 1);
    await run;
    expect(a.elector.isLeader).toBe(false);
  });

  it('steps down within the renew deadline when the API server does not answer at all', async () => {
    const fake = new FakeLeases();
    // A real clock: nothing but the elector's own deadline can end an unanswered request.
    const clock = {
      get now(): number {
        return Date.now();
      },
    };
    const a = candidate(fake, 'a', clock, 200);
    const run = a.elector.run();
    await until('a leads', () => a.started === 1);
    fake.unansweredReadsOf.add('a');
    const cut = Date.now();
    await run;
    expect(a.stopped).toBe(1);
    expect(a.elector.isLeader).toBe(false);
    // Before the Lease could expire for anyone else (15 s): within the 200 ms deadline, give or take
    // the timer's lateness.
    expect(Date.now() - cut).toBeLessThan(5_000);
  });

  it('steps down at once when someone else holds the Lease', async () => {
    const fake = new FakeLeases();
    const a = candidate(fake, 'a');
    const run = a.elector.run();
    await until('a leads', () => a.started === 1);
    const lease = fake.lease as V1Lease;
    fake.lease = { ...lease, spec: { ...lease.spec, holderIdentity: 'intruder' } };
    await run;
    expect(a.stopped).toBe(1);
    expect(fake.holder).toBe('intruder');
  });
});
