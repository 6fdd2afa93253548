// Cleanup (core/activity-cache.ts cleanupActivity, and the operator's clean-up step that runs it)
// on the real Redis: it refuses while half messages exist, and while unconfirmed reservations
// exist, each condition alone; it deletes this activity's keys only (not a neighbour whose id
// starts the same) and keeps the buyers' results with a TTL. Named by mutants in
// test/faults/mutants/.
import { Redis } from 'ioredis';
import pg from 'pg';
import { cleanupActivity, recordResults } from '../../../core/activity-cache.js';
import { FlashSaleError } from '../../../core/errors.js';
import { activityKeys } from '../../../core/keys.js';
import type { BucketKeys } from '../../../core/keys.js';
import { runScript } from '../../../core/scripts.js';
import { reservationIdFor, reserve } from '../../../core/reservations.js';
import { enterPhase } from '../../../operator/api/v1alpha1/conditions.js';
import { Phase, Reason } from '../../../operator/api/v1alpha1/types.js';
import type { ReconcileContext } from '../../../operator/reconcile/context.js';
import { cleanUp } from '../../../operator/reconcile/clean-up.js';
import { removeFinalizer } from '../../../operator/reconcile/remove-finalizer.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { loadBucketedSale, loadOpenSale } from '../../fixtures/open-sale.js';
import { stepContext } from '../../fixtures/step-context.js';

const TIMEOUT_MS = 60_000;
const RETENTION_SECONDS = 900;

describe('cleanup of an activity (real Redis)', () => {
  let redis: Redis;
  // The operator's step reads the orders (releases attempted, not yet proven) in PostgreSQL.
  let db: FreshDatabase;
  let pool: pg.Pool;
  beforeAll(async () => {
    redis = new Redis(testEnv().redisUrl, { maxRetriesPerRequest: 2 });
    db = await freshDatabase();
    pool = new pg.Pool({ connectionString: db.url, max: 2 });
  });
  afterAll(async () => {
    await redis.quit();
    await pool?.end();
    await db?.drop();
  });

  async function keysOf(activityId: string): Promise<string[]> {
    const k = activityKeys(activityId);
    const out: string[] = [];
    let cursor = '0';
    do {
      const [next, batch] = await redis.scan(cursor, 'MATCH', k.scanPattern, 'COUNT', 1000);
      cursor = next;
      out.push(...batch);
    } while (cursor !== '0');
    return out.sort();
  }

  /** A loaded, open activity with one reservation: its half message and its ledger entry exist. */
  async function withReservation(id = uniqueId('clean')): Promise<{ id: string; rid: string }> {
    await loadOpenSale(redis, id, [{ skuId: 's', name: 'item', price: '1.00', stock: 5, limitPerUser: 1 }], {
      reopenOnRelease: true,
    });
    await reserve(redis, {
      activityId: id,
      userId: 'u',
      skuId: 's',
      quantity: 1,
      requestId: 'r',
      traceId: 't',
    });
    return { id, rid: reservationIdFor(id, 'u', 'r') };
  }

  /** The relay's effect once Kafka acknowledged: the half messages leave the stream. */
  async function relayAll(id: string): Promise<void> {
    const k = activityKeys(id);
    const ids = (await redis.xrange(k.outbox, '-', '+')).map(([entry]) => entry);
    if (ids.length > 0) await redis.xdel(k.outbox, ...ids);
  }

  /** The consumer's effect after its DB commit: results written, ledger entries confirmed. */
  async function confirm(id: string, rid: string): Promise<void> {
    await recordResults(redis, id, [
      { reservationId: rid, userId: 'u', result: { status: 'CREATED', orderId: '1' } },
    ]);
  }

  async function expectRefused(id: string): Promise<void> {
    const before = await keysOf(id);
    const err = await cleanupActivity(redis, id, RETENTION_SECONDS).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(FlashSaleError);
    expect((err as FlashSaleError).code).toBe('UNAVAILABLE');
    expect(await keysOf(id)).toEqual(before);
    expect(await redis.ttl(activityKeys(id).results)).not.toBeGreaterThan(0);
  }

  describe('cleanup refuses while anything is in flight', () => {
    test(
      'half messages alone (every reservation confirmed, the relay has not sent them): refused, nothing deleted',
      async () => {
        const { id, rid } = await withReservation();
        await confirm(id, rid);
        expect(await redis.zcard(activityKeys(id).ledger)).toBe(0);
        expect(await redis.xlen(activityKeys(id).outbox)).toBe(1);
        await expectRefused(id);
      },
      TIMEOUT_MS,
    );

    test(
      'unconfirmed reservations alone (the relay sent everything, no order confirmed yet): refused, nothing deleted',
      async () => {
        const { id } = await withReservation();
        await relayAll(id);
        expect(await redis.xlen(activityKeys(id).outbox)).toBe(0);
        expect(await redis.zcard(activityKeys(id).ledger)).toBe(1);
        await expectRefused(id);
      },
      TIMEOUT_MS,
    );

    test(
      'both at once: refused, nothing deleted',
      async () => {
        const { id } = await withReservation();
        await expectRefused(id);
      },
      TIMEOUT_MS,
    );
  });

  describe('cleanup deletes only this activity and keeps results', () => {
    test(
      "once nothing is in flight: every key of the activity goes except the results (TTL), and a neighbour's keys stay",
      async () => {
        const { id, rid } = await withReservation();
        // A neighbour whose id starts with this one's, in flight, and a key outside every activity.
        const neighbour = await withReservation(`${id}x`);
        const outside = `cleanup-test:${id}`;
        await redis.set(outside, '1');
        const neighbourKeys = await keysOf(neighbour.id);
        expect(neighbourKeys.length).toBeGreaterThan(3);

        await relayAll(id);
        await confirm(id, rid);
        const before = await keysOf(id);
        const outcome = await cleanupActivity(redis, id, RETENTION_SECONDS);
        expect(outcome).toEqual({ deleted: before.length - 1, retained: 1 });
        const k = activityKeys(id);
        expect(await keysOf(id)).toEqual([k.results]);
        const ttl = await redis.ttl(k.results);
        expect(ttl).toBeGreaterThan(0);
        expect(ttl).toBeLessThanOrEqual(RETENTION_SECONDS);
        expect(JSON.parse((await redis.hget(k.results, rid)) ?? '{}')).toMatchObject({ status: 'CREATED' });

        // Run again (the operator died before recording it): nothing left to delete, nothing
        // re-created (its mark that cleanup began goes into a meta hash only while there is one).
        expect(await cleanupActivity(redis, id, RETENTION_SECONDS)).toEqual({ deleted: 0, retained: 1 });
        expect(await keysOf(id)).toEqual([k.results]);

        expect(await keysOf(neighbour.id)).toEqual(neighbourKeys);
        expect(await redis.get(outside)).toBe('1');
        await redis.del(outside);
      },
      TIMEOUT_MS,
    );
  });

  test(
    'results written after the retained ones expired (a dead letter replayed late) get a TTL, not a key forever',
    async () => {
      const { id, rid } = await withReservation();
      await relayAll(id);
      await confirm(id, rid);
      await cleanupActivity(redis, id, RETENTION_SECONDS);
      const k = activityKeys(id);
      await redis.del(k.results); // the retention ran out
      await recordResults(redis, id, [
        { reservationId: 'late-replay', userId: 'u-late', result: { status: 'CREATED', orderId: '9' } },
      ]);
      expect(await redis.exists(k.results)).toBe(1);
      expect(await redis.ttl(k.results)).toBeGreaterThan(0);
      expect(await keysOf(id)).toEqual([k.results]);
    },
    TIMEOUT_MS,
  );

  test(
    "a stock transfer's late step after the cleanup re-creates no key of its buckets",
    async () => {
      const id = uniqueId('cleanup-xfer');
      const [from, to] = (await loadBucketedSale(redis, id, 4)) as [BucketKeys, BucketKeys];
      const step = (b: BucketKeys, side: 'out' | 'in', other: BucketKeys) =>
        runScript(
          redis,
          'transferStock',
          [b.meta, b.sku('hot'), b.transfers, b.counters],
          [side, 'x1', 1, other.index, 'hot', '0'],
        );
      // The donor's step ran; the process then waited (a replica wait) while the sale was cleaned up.
      expect((await step(from, 'out', to))[1]).toBe(1);
      await cleanupActivity(redis, id, RETENTION_SECONDS);
      const bucketKeys = [to.meta, to.sku('hot'), to.transfers, to.counters, from.sku('hot'), from.transfers];
      expect(await redis.exists(...bucketKeys)).toBe(0);
      await expect(step(to, 'in', from)).rejects.toMatchObject({ code: 'NOT_LOADED' });
      await expect(step(from, 'out', to)).rejects.toMatchObject({ code: 'NOT_LOADED' });
      expect(await redis.exists(...bucketKeys)).toBe(0);
    },
    TIMEOUT_MS,
  );

  describe("the operator's clean-up step", () => {
    /** A context in phase CleaningUp, with the Redis connection and no-op events (reasons recorded). */
    function context(
      activityId: string,
      events: string[],
      opts: { policy?: 'Delete' | 'Retain'; phase?: Phase; deleted?: boolean; client?: Redis } = {},
    ): ReconcileContext {
      const now = new Date();
      return stepContext(
        {
          activityId,
          now,
          deleted: opts.deleted,
          spec: { cleanup: { policy: opts.policy ?? 'Delete', resultRetention: '15m' } },
          status: {
            conditions: enterPhase(undefined, opts.phase ?? Phase.CleaningUp, 'test', 1, now),
            // Warmed up: the sale's id stays claimed after its deletion.
            timestamps: { warmingUp: now.toISOString() },
          },
          deps: {
            redis: opts.client ?? redis,
            pool,
            activities: { removeFinalizer: async () => undefined },
            // The informer's cache of runtime Deployments: none here (remove-finalizer reads it).
            deployment: () => undefined,
            config: { cleanupRetryMs: 5_000 },
          },
        },
        events,
      );
    }

    test(
      'blocked (Degraded CleanupBlocked, requeued, still CleaningUp) by half messages alone, then by unconfirmed reservations alone; completes once drained',
      async () => {
        const { id, rid } = await withReservation();
        await confirm(id, rid);
        const before = await keysOf(id);
        for (const stage of ['half messages', 'unconfirmed'] as const) {
          if (stage === 'unconfirmed') {
            await relayAll(id);
            await redis.zadd(activityKeys(id).ledger, 1, rid);
          }
          const events: string[] = [];
          const ctx = context(id, events);
          await cleanUp(ctx);
          expect([stage, ctx.degraded?.reason, ctx.transitioned, ctx.requeueAtMs !== undefined]).toEqual([
            stage,
            Reason.CleanupBlocked,
            false,
            true,
          ]);
          expect(events).toEqual([Reason.CleanupBlocked]);
          expect((await keysOf(id)).filter((k) => k !== activityKeys(id).ledger)).toEqual(
            before.filter((k) => k !== activityKeys(id).ledger),
          );
        }
        await confirm(id, rid);
        const ctx = context(id, []);
        await cleanUp(ctx);
        expect([ctx.degraded, ctx.transitioned]).toEqual([undefined, true]);
        expect(await keysOf(id)).toEqual([activityKeys(id).results]);
      },
      TIMEOUT_MS,
    );

    test(
      'Retain waits for orders in flight too (Settling counts PostgreSQL only); the keys it kept go at deletion even after the policy was edited to Delete',
      async () => {
        const { id, rid } = await withReservation();
        const before = await keysOf(id);
        // A half message not yet in Kafka: its order is still on its way to PostgreSQL.
        const events: string[] = [];
        const held = context(id, events, { policy: 'Retain' });
        await cleanUp(held);
        expect([held.degraded?.reason, held.transitioned, held.requeueAtMs !== undefined]).toEqual([
          Reason.CleanupBlocked,
          false,
          true,
        ]);
        expect(held.degraded?.message).toMatch(/^settling held back: 1 half message\(s\)/);
        expect(events).toEqual([Reason.CleanupBlocked]);

        await relayAll(id);
        await confirm(id, rid);
        const done = context(id, [], { policy: 'Retain' });
        await cleanUp(done);
        expect([done.degraded, done.transitioned]).toEqual([undefined, true]);
        // Retained: every key but the emptied outbox and ledger.
        expect((await keysOf(id)).length).toBeGreaterThan(3);
        expect(await redis.exists(activityKeys(id).meta)).toBe(1);
        expect(before.length).toBeGreaterThan(3);

        // The sale completed; the policy is edited to Delete "to clean up", then the resource is
        // deleted: the keys Retain kept go all the same.
        const deleting = context(id, [], { policy: 'Delete', phase: Phase.Completed, deleted: true });
        await removeFinalizer(deleting);
        expect(deleting.gone).toBe(true);
        expect(await keysOf(id)).toEqual([activityKeys(id).results]);
      },
      TIMEOUT_MS,
    );

    test(
      "a deletion's cleanup of the keys Retain kept, killed before the results' TTL, still leaves the results to expire",
      async () => {
        const { id, rid } = await withReservation();
        await relayAll(id);
        await confirm(id, rid);
        const kept = context(id, [], { policy: 'Retain' });
        await cleanUp(kept);
        expect(kept.transitioned).toBe(true);
        expect(await redis.ttl(activityKeys(id).results)).toBe(-1);

        // The operator dies at the results' EXPIRE; the next leader's pass resumes the deletion.
        const dying = new Proxy(redis, {
          get(target, prop, receiver) {
            if (prop === 'expire') return () => Promise.reject(new Error('operator killed'));
            const v: unknown = Reflect.get(target, prop, receiver);
            return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
          },
        });
        const killed = context(id, [], { phase: Phase.Completed, deleted: true, client: dying });
        await expect(removeFinalizer(killed)).rejects.toThrow('operator killed');
        const resumed = context(id, [], { phase: Phase.Completed, deleted: true });
        await removeFinalizer(resumed);
        expect(resumed.gone).toBe(true);
        expect(await keysOf(id)).toEqual([activityKeys(id).results]);
        expect(await redis.ttl(activityKeys(id).results)).toBeGreaterThan(0);
      },
      TIMEOUT_MS,
    );
  });
});
