/**
 * The activity's traffic policy and deny list reaching Redis, where every api replica reads them
 * (core/traffic-policy.ts). Both are plain overwrites, so every pass may repeat them: the policy may
 * change at any time (limits are not part of the sale's fenced definition), and the deny list is
 * re-read from its ConfigMap on every pass, because editing a ConfigMap does not touch the
 * activity's generation.
 */
import { writeTrafficPolicy, syncDenyList } from '../../core/traffic-policy.js';
import type { TrafficPolicy } from '../../core/traffic-policy.js';
import type { FlashSaleActivitySpec } from '../api/v1alpha1/types.js';
import { Reason } from '../api/v1alpha1/types.js';
import type { ReconcileContext } from './context.js';

/** The spec's fields over the operator's defaults. Pure. */
export function policyFromSpec(spec: FlashSaleActivitySpec, defaults: TrafficPolicy): TrafficPolicy {
  const t = spec.trafficShaping ?? {};
  const e = spec.eligibility ?? {};
  return {
    shaping: {
      enabled: t.enabled ?? defaults.shaping.enabled,
      perBuyer: t.perBuyer ?? defaults.shaping.perBuyer,
      perAddress: t.perAddress ?? defaults.shaping.perAddress,
    },
    eligibility: {
      preRegistration: e.preRegistration ?? defaults.eligibility.preRegistration,
      orderCodesPerBuyerPerSku: e.orderCodesPerBuyerPerSku ?? defaults.eligibility.orderCodesPerBuyerPerSku,
    },
  };
}

/** Buyer ids of a deny list: one per line or comma separated; `#` starts a comment. Pure. */
export function parseDenyList(text: string): string[] {
  const ids = new Set<string>();
  for (const line of text.split('\n')) {
    for (const part of (line.split('#')[0] ?? '').split(',')) {
      const id = part.trim();
      if (id.length > 0 && id.length <= 256) ids.add(id);
    }
  }
  return [...ids].sort();
}

function statusOf(err: unknown): number | undefined {
  const e = err as { code?: unknown; statusCode?: unknown };
  const n = Number(e.code ?? e.statusCode);
  return Number.isFinite(n) ? n : undefined;
}

/** What the deny list's ConfigMap gave: its list's text, or why there is none to apply. */
export type DenyListRead = { text: string } | { unavailable: string };

/**
 * Reads the deny list's key from its ConfigMap. A ConfigMap or key that is missing, or that the
 * operator may not read (403: a Role trimmed below config/rbac/role.yaml, or a name the API server
 * takes for another resource, stored before the CRD refused such names), is unavailable: reported,
 * never a failed pass, which would hold the warm-up, the drain and a cache restore behind the deny
 * list. Any other error (the API server away) fails the pass, which is retried.
 */
export async function readDenyList(
  core: Pick<ReconcileContext['deps']['core'], 'readNamespacedConfigMap'>,
  namespace: string,
  ref: { name: string; key?: string | undefined },
): Promise<DenyListRead> {
  const key = ref.key || 'denied';
  try {
    const text = (await core.readNamespacedConfigMap({ name: ref.name, namespace })).data?.[key];
    if (text !== undefined) return { text };
    return { unavailable: `deny list ConfigMap ${ref.name} (key ${key}) not found` };
  } catch (err) {
    const status = statusOf(err);
    if (status === 404) return { unavailable: `deny list ConfigMap ${ref.name} (key ${key}) not found` };
    if (status === 403)
      return {
        unavailable: `deny list ConfigMap ${ref.name} (key ${key}) cannot be read: the operator is forbidden to get it`,
      };
    throw err;
  }
}

/**
 * Writes the policy and makes the deny flags equal to the named ConfigMap's list. A ConfigMap or
 * key that is missing or unreadable (readDenyList) keeps the flags already in Redis and reports
 * Degraded/DenyListUnavailable: an accidental deletion must not readmit every denied buyer
 * mid-sale. Returns false then (the flags are whatever Redis still holds: none after a cache
 * restore rebuilt an emptied Redis).
 */
export async function syncTrafficPolicy(ctx: ReconcileContext): Promise<boolean> {
  const { redis, core, config } = ctx.deps;
  await writeTrafficPolicy(redis, ctx.activityId, policyFromSpec(ctx.fsa.spec, config.trafficPolicy));
  const ref = ctx.fsa.spec.eligibility?.denyListRef;
  if (!ref) {
    await syncDenyList(redis, ctx.activityId, []);
    return true;
  }
  const read = await readDenyList(core, ctx.fsa.metadata.namespace ?? '', ref);
  if ('unavailable' in read) {
    ctx.degraded = {
      reason: Reason.DenyListUnavailable,
      message: `${read.unavailable}; keeping the buyers denied so far`,
    };
    ctx.requeueAfter(config.cleanupRetryMs);
    return false;
  }
  const outcome = await syncDenyList(redis, ctx.activityId, parseDenyList(read.text));
  if (outcome.added + outcome.removed > 0) {
    ctx.log.info({ ...outcome, configMap: ref.name }, 'deny list applied');
  }
  return true;
}
