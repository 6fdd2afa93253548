/**
 * Step 3c (after observe-runtime, before warm-up/sync-spec/open-gate/drain): a Redis that came
 * back empty or behind while the cache is live (Ready, Active, Draining) is restored from
 * PostgreSQL's truth (docs/faults.md window 13, docs/runbooks/cache-restore.md):
 *
 *   detected -> paused    the gate is paused (an empty cache gets a meta hash holding only that)
 *   paused   -> drained   the outbox is empty and the consumer group's lag is 0, both after the
 *                         gate has been paused for RESTORE_SETTLE_SECONDS: everything that had
 *                         reached Kafka is in PostgreSQL
 *   drained  -> reloaded  reservations, buyers' slots and each SKU's stock = initial − live
 *                         orders − proven in-flight reservations; the epoch mark is written last
 *   reloaded -> resumed   only with the cache carrying the restore's epoch, the traffic policy is
 *                         synced again (requireReg, deny flags, rate windows), then the gate goes
 *                         back to what the phase wants; a cache that lost the reload again is
 *                         held and the restore closed: the next pass opens a new one
 *
 * The step's truth is the `cache_restores` row (one open restore per activity, moved forward by
 * conditional updates) and Redis itself; nothing is kept in memory, so an operator killed at any
 * line repeats the current step's idempotent side effect on the next pass. Each step is recorded
 * as the CacheConsistent condition and an Event. While a restore is open the pass ends here, so
 * sync-spec, open-gate and drain never act on a half-rebuilt cache.
 *
 * "Behind" includes a cache whose load mark `gen` is older than status.cache.loadedGeneration (a
 * snapshot or a lagging replica from before a spec generation was loaded): it is restored to the
 * loaded generation, stock from PostgreSQL's activity_skus and the sale window from
 * activity_registry (both recorded with each load), never left at the older one.
 *
 * A resource being deleted is restored too: its drain waits for the consumers and its write-back
 * reads the cache, so neither may act on a cache that is empty or half rebuilt; the restore then
 * resumes with the gate closed.
 */
import { readMeta, setGate } from '../../core/activity-cache.js';
import {
  cacheEpoch,
  checkCache,
  endHold,
  holdForRestore,
  outboxLength,
  reloadFromPostgres,
} from '../../core/cache-restore.js';
import type { RestoreTarget } from '../../core/cache-restore.js';
import {
  advanceRestore,
  beginRestore,
  lastReloadedEpoch,
  openRestore,
  supersedeRestore,
} from '../../core/db/cache-restores-store.js';
import type { CacheRestoreRow, RestoreDivergence } from '../../core/db/cache-restores-store.js';
import { findRegisteredActivity } from '../../core/db/activity-registry-store.js';
import { inTransaction } from '../../core/db/pool.js';
import { insertReport } from '../../core/db/reconciliation-store.js';
import { crashPoint } from '../../core/crash.js';
import type { GateState } from '../../core/model.js';
import { setCondition } from '../api/v1alpha1/conditions.js';
import { ConditionType, EventReason, Phase, Reason } from '../api/v1alpha1/types.js';
import type { ReconcileContext, StepResult } from './context.js';
import { CONTINUE, DONE } from './context.js';
import { countRestore, exportOpenRestore, RESTORE_PHASES } from './restore-metrics.js';
import { resolveItems } from './resolve-items.js';
import { syncTrafficPolicy } from './traffic-policy.js';

function condition(ctx: ReconcileContext, status: 'True' | 'False', reason: string, message: string): void {
  ctx.status.conditions = setCondition(
    ctx.status.conditions,
    { type: ConditionType.CacheConsistent, status, reason, message },
    ctx.generation,
    ctx.now,
  );
}

/** The gate the phase wants once the cache is whole again (closed: the resource is being deleted). */
export function gateAfterRestore(ctx: ReconcileContext): GateState {
  if (ctx.deleting) return 'closed';
  if (ctx.phase === Phase.Ready) return 'pending';
  if (ctx.phase === Phase.Draining) return 'closed';
  return ctx.fsa.spec.paused ? 'paused' : 'open';
}

/**
 * The sale window and settings (requireOrderCode, reopenOnRelease) of the generation that was
 * loaded. activity_registry records them after every load (sync-spec.ts syncCache); the spec may
 * already be a later generation (not synced yet, or refused: a shortened endAt or an order-code
 * requirement the operator refused must not reach the cache through a restore either). Without a
 * registry row (an activity older than the registry; for the settings, older than migration 14):
 * what the cache still holds, else the spec's.
 */
async function loadedSettings(
  ctx: ReconcileContext,
): Promise<Pick<RestoreTarget, 'startMs' | 'endMs' | 'requireOrderCode' | 'reopenOnRelease'>> {
  const { pool, redis } = ctx.deps;
  const spec = ctx.fsa.spec;
  const found = await findRegisteredActivity(pool, ctx.activityId);
  const registered = found?.ownerUid === ctx.fsa.metadata.uid ? found : undefined;
  const cached = await readMeta(redis, ctx.activityId);
  const window =
    registered !== undefined
      ? { startMs: new Date(registered.startAt).getTime(), endMs: new Date(registered.endAt).getTime() }
      : cached?.startMs && cached.endMs
        ? { startMs: cached.startMs, endMs: cached.endMs }
        : { startMs: ctx.schedule.startAt.getTime(), endMs: ctx.schedule.endAt.getTime() };
  // A meta a restore holds (core/cache-restore.ts holdForRestore) carries the settings it was given.
  return {
    ...window,
    requireOrderCode: registered?.requireOrderCode ?? cached?.requireOrderCode ?? spec.requireOrderCode,
    reopenOnRelease: registered?.reopenOnRelease ?? cached?.reopenOnRelease ?? spec.reopenOnRelease,
  };
}

async function targetOf(ctx: ReconcileContext, row: CacheRestoreRow): Promise<RestoreTarget> {
  // The bucket layout the warm-up loaded: the resource fixes each SKU's count once it began.
  // Automatic counts are not in the spec: the status recorded them when the SKUs were loaded.
  const buckets = new Map([
    ...(ctx.status.cache?.buckets ?? []).map((b) => [b.skuId, b.buckets] as const),
    ...(await resolveItems(ctx))
      .filter((i) => (i.buckets ?? 1) > 1)
      .map((i) => [i.skuId, i.buckets!] as const),
  ]);
  return {
    activityId: ctx.activityId,
    epoch: row.epoch,
    generation: ctx.status.cache?.loadedGeneration ?? ctx.generation,
    ...(await loadedSettings(ctx)),
    ownerUid: ctx.fsa.metadata.uid,
    buckets,
  };
}

function describe(d: RestoreDivergence, loadedGeneration: number): string {
  const redis = d.redis.present
    ? `generation ${d.redis.generation ?? 0} (loaded ${loadedGeneration}), epoch ${d.redis.epoch ?? 0} (expected ${d.expectedEpoch})`
    : 'empty';
  const skus = d.skus
    .filter((s) => s.redisTaken === null || s.postgresLive > s.redisTaken)
    .map((s) => `${s.skuId}: Redis ${s.redisTaken ?? 'absent'} taken, PostgreSQL ${s.postgresLive} live`)
    .slice(0, 5);
  return `Redis ${redis}${skus.length > 0 ? `; ${skus.join('; ')}` : ''}`;
}

export async function restoreCache(ctx: ReconcileContext): Promise<StepResult> {
  // Also while the resource is being deleted: drain and write-back must find the cache whole.
  if (!RESTORE_PHASES.includes(ctx.phase)) return CONTINUE;
  // Never loaded: warm-up loads it; there is nothing to restore.
  const loadedGeneration = ctx.status.cache?.loadedGeneration;
  if (loadedGeneration === undefined) return CONTINUE;
  ctx.requireOwnership();
  const { redis, pool, kafka, config } = ctx.deps;

  let row = await openRestore(pool, ctx.activityId);
  if (!row) {
    const check = await checkCache(
      redis,
      pool,
      ctx.activityId,
      await lastReloadedEpoch(pool, ctx.activityId),
      undefined,
      loadedGeneration,
    );
    if (check.kind === 'consistent') {
      const previous = ctx.status.conditions?.find((c) => c.type === ConditionType.CacheConsistent);
      if (previous?.reason !== Reason.Restored) {
        condition(ctx, 'True', Reason.CacheMatches, 'Redis holds every unit PostgreSQL holds as live orders');
      }
      exportOpenRestore(ctx, undefined);
      return CONTINUE;
    }
    row = await beginRestore(pool, ctx.activityId, check.kind, check.divergence);
    countRestore(ctx, row.reason);
    crashPoint('operator-after-restore-begin');
    await ctx.event(
      'Warning',
      EventReason.CacheDivergenceDetected,
      `${check.kind}: ${describe(check.divergence, loadedGeneration)}; restoring the cache from PostgreSQL (epoch ${row.epoch})`,
    );
  }
  exportOpenRestore(ctx, row);
  const t = await targetOf(ctx, row);

  if (row.step === 'detected') {
    // Recorded even when the hold fails (Redis still down): the pass's error says why.
    condition(ctx, 'False', Reason.RestorePausing, `restore ${row.epoch} (${row.reason}): pausing the gate`);
    const before = await holdForRestore(redis, t);
    crashPoint('operator-after-restore-hold');
    await advanceRestore(pool, ctx.activityId, row.epoch, 'detected');
    await ctx.event(
      'Normal',
      EventReason.CacheRestorePaused,
      `gate paused for the restore (was ${before || 'absent: the cache is empty'})`,
    );
    condition(
      ctx,
      'False',
      Reason.RestoreDraining,
      `restore ${row.epoch}: gate paused; waiting for the backlog`,
    );
    ctx.requeueAfter(config.drainCheckMs);
    return DONE;
  }

  if (row.step === 'paused') {
    // The hold again (idempotent): a Redis that lost its data once more since starts paused too.
    await holdForRestore(redis, t);
    const [outbox, lag] = await Promise.all([
      outboxLength(redis, t),
      kafka.lag(ctx.activityId).catch((err: unknown) => {
        ctx.log.warn({ err: String(err) }, 'consumer lag unavailable');
        return undefined;
      }),
    ]);
    const settled = (row.pausedForSeconds ?? 0) * 1000 >= config.restoreSettleMs;
    if (outbox > 0 || lag === undefined || lag > 0 || !settled) {
      const left = [
        ...(outbox > 0 ? [`${outbox} half message(s) not yet in Kafka`] : []),
        ...(lag === undefined ? ['consumer lag unknown'] : lag > 0 ? [`consumer lag ${lag}`] : []),
        ...(settled ? [] : ['settling after the pause']),
      ];
      condition(ctx, 'False', Reason.RestoreDraining, `restore ${row.epoch}: waiting for ${left.join(', ')}`);
      ctx.requeueAfter(config.drainCheckMs);
      return DONE;
    }
    await advanceRestore(pool, ctx.activityId, row.epoch, 'paused');
    await ctx.event(
      'Normal',
      EventReason.CacheRestoreDrained,
      'every order message that reached Kafka is in PostgreSQL (outbox empty, consumer lag 0)',
    );
    row = { ...row, step: 'drained' };
  }

  if (row.step === 'drained') {
    condition(ctx, 'False', Reason.RestoreReloading, `restore ${row.epoch}: reloading from PostgreSQL`);
    await holdForRestore(redis, t);
    const reload = await reloadFromPostgres(redis, pool, t);
    crashPoint('operator-after-restore-reload');
    await advanceRestore(pool, ctx.activityId, row.epoch, 'drained', reload);
    const figures = reload.skus
      .slice(0, 5)
      .map((s) => `${s.skuId}: ${s.remaining} = ${s.initial} − ${s.live} live − ${s.inFlight} in flight`)
      .join('; ');
    await ctx.event(
      'Normal',
      EventReason.CacheRestoreReloaded,
      `reloaded ${reload.skus.length} sku(s), ${reload.orders} order(s), ${reload.buyers} buyer(s)` +
        (reload.paidDuringReload > 0 ? `, ${reload.paidDuringReload} paid while reloading` : '') +
        `: ${figures}`,
    );
    row = { ...row, step: 'reloaded', reloaded: reload };
  }

  if (row.step === 'reloaded') {
    // The gate opens only on a cache that carries this restore's mark. A Redis that lost its data
    // again after the reload may have sold on the reopened gate (an operator killed after opening
    // it, before recording the resume; a snapshot that came back open): orders of those sales may
    // be in Kafka, in neither PostgreSQL nor Redis, so reloading now would sell their units again.
    // The hold, then this restore closes unreported and the next one opens in the same
    // transaction (a new epoch: a stock transfer fenced by this one lands before it; never a
    // moment without an open restore), which settles and drains first.
    if ((await cacheEpoch(redis, ctx.activityId)) < row.epoch) {
      condition(
        ctx,
        'False',
        Reason.RestorePausing,
        `restore ${row.epoch}: the reload is gone; restoring anew`,
      );
      await holdForRestore(redis, t);
      const next = await supersedeRestore(pool, ctx.activityId, row.epoch, {
        redis: { present: false },
        expectedEpoch: row.epoch,
        skus: [],
      });
      countRestore(ctx, next.reason);
      await ctx.event(
        'Warning',
        EventReason.CacheDivergenceDetected,
        `restore ${row.epoch}: the reload is gone before the resume was recorded; restoring anew (epoch ${next.epoch}), drained first`,
      );
      exportOpenRestore(ctx, next);
      ctx.requeueAfter(0);
      return DONE;
    }
    condition(ctx, 'False', Reason.RestoreResuming, `restore ${row.epoch}: resuming`);
    // The traffic policy before the gate: the reload rebuilt stock, reservations and buyers, not
    // the registration requirement, the deny flags nor the rate windows (the `policy` key), which
    // sync-spec would write only on the next pass. Opened first, the gate would admit unregistered
    // and denied buyers, with the api on default windows, until then.
    // Without its deny list the rebuilt cache holds no deny flag (an emptied Redis lost them, a
    // cache back from a snapshot lacks the later ones): a gate that admits buyers now or later
    // stays paused until the list is back, rather than readmitting denied buyers. A closed one
    // (the sale ended, or the resource is being deleted) admits nobody: the restore resumes, so
    // the drain, the write-back and the finalizer are not held by a missing ConfigMap.
    const gate = gateAfterRestore(ctx);
    if (!(await syncTrafficPolicy(ctx)) && gate !== 'closed') {
      condition(
        ctx,
        'False',
        Reason.RestoreResuming,
        `restore ${row.epoch}: waiting for the deny list (${ctx.degraded?.message ?? 'unavailable'}); the gate stays paused`,
      );
      return DONE;
    }
    await endHold(redis, t);
    await setGate(redis, ctx.activityId, gate);
    crashPoint('operator-after-restore-resume');
    const r = row;
    // The step and the reconciliation report of what was found and done commit together
    // (docs/runbooks/cache-restore.md): a repeat finds the step moved and writes no second report.
    await inTransaction(pool, async (c) => {
      if (!(await advanceRestore(c, ctx.activityId, r.epoch, 'reloaded'))) return;
      await insertReport(c, {
        activityId: ctx.activityId,
        basis: 'postgres',
        ok: true,
        mismatches: [],
        figures: {
          restore: { epoch: r.epoch, reason: r.reason, divergence: r.divergence, reloaded: r.reloaded },
        },
      });
    });
    await ctx.event(
      'Normal',
      EventReason.CacheRestoreResumed,
      `cache restored (epoch ${row.epoch}); gate ${gate}`,
    );
    condition(ctx, 'True', Reason.Restored, `restore ${row.epoch} (${row.reason}) completed; gate ${gate}`);
    exportOpenRestore(ctx, undefined);
    ctx.requeueAfter(0);
    return DONE;
  }
  return CONTINUE;
}
