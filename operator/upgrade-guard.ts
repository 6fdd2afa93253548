/**
 * The chart's pre-upgrade guard: `node dist/operator/upgrade-guard.js`, run by a Helm hook Job
 * (charts/flashsale/templates/operator/upgrade-guard.yaml) under the operator's ServiceAccount
 * before anything of an upgrade is applied. It lists the FlashSaleActivities the operator watches
 * and exits 1, naming them, when one is in a live phase (GUARD_LIVE_PHASES: warming up, ready,
 * on sale, draining or writing back), unless GUARD_ALLOW_DURING_ACTIVE_SALE is true: an upgrade
 * restarts the operator and runs the migrations, which should not happen in the middle of a sale
 * (docs/install.md, "Upgrades"). A hook rather than a template `lookup`: `lookup` answers nothing
 * in `helm template` and client-side dry runs, so a guard built on it would pass silently there.
 */
import { CustomObjectsApi, KubeConfig } from '@kubernetes/client-node';
import { z } from 'zod';
import { env, readConfig } from '../core/config.js';
import { createLogger } from '../core/logger.js';
import { isApiStatus } from './kube/activities.js';
import { GROUP, PLURAL, Phase, VERSION } from './api/v1alpha1/types.js';
import type { FlashSaleActivity } from './api/v1alpha1/types.js';

const DEFAULT_LIVE: readonly Phase[] = [
  Phase.WarmingUp,
  Phase.Ready,
  Phase.Active,
  Phase.Draining,
  Phase.WritingBack,
];

const guardConfigSchema = z.object({
  /** The operator's WATCH_NAMESPACE: comma-separated; empty = every namespace. */
  WATCH_NAMESPACE: env.list(),
  GUARD_ALLOW_DURING_ACTIVE_SALE: env.bool(false),
  GUARD_LIVE_PHASES: env
    .list()
    .refine((l) => l.every((p) => (Object.values(Phase) as string[]).includes(p)), 'phase names'),
  LOG_LEVEL: z.string().default('info'),
});

export interface LiveActivity {
  namespace: string;
  name: string;
  phase: string;
}

/**
 * The activities in a live phase in the namespaces (every namespace when empty). A namespace the
 * caller may not list (403: not watched by the current release) or a missing CRD (404: first
 * install) holds none this operator drives.
 */
export async function liveActivities(
  custom: CustomObjectsApi,
  namespaces: readonly string[],
  livePhases: readonly string[],
): Promise<{ live: LiveActivity[]; skipped: string[] }> {
  const lists: { items: FlashSaleActivity[] }[] = [];
  const skipped: string[] = [];
  const scopes = namespaces.length > 0 ? namespaces : [undefined];
  for (const namespace of scopes) {
    try {
      const list = namespace
        ? await custom.listNamespacedCustomObject({
            group: GROUP,
            version: VERSION,
            namespace,
            plural: PLURAL,
          })
        : await custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural: PLURAL });
      lists.push(list as { items: FlashSaleActivity[] });
    } catch (err) {
      if (isApiStatus(err, 404)) continue;
      if (isApiStatus(err, 403) && namespace) {
        skipped.push(namespace);
        continue;
      }
      throw err;
    }
  }
  const live = lists
    .flatMap((l) => l.items)
    .filter((f) => f.status?.phase !== undefined && livePhases.includes(f.status.phase))
    .map((f) => ({ namespace: f.metadata.namespace, name: f.metadata.name, phase: f.status?.phase ?? '' }))
    .sort((x, y) => `${x.namespace}/${x.name}`.localeCompare(`${y.namespace}/${y.name}`));
  return { live, skipped };
}

export function refusal(live: readonly LiveActivity[]): string {
  const names = live.map((l) => `${l.namespace}/${l.name} (${l.phase})`).join(', ');
  return (
    `upgrade refused: ${live.length} FlashSaleActivity(s) in a live phase: ${names}. ` +
    'Upgrade after the sale (kubectl get fsa -A), or set upgrade.allowDuringActiveSale=true to ' +
    'upgrade anyway (the runtime pods of a live sale keep their image and settings; the operator ' +
    'restarts and the migrations run: docs/install.md, "Upgrades").'
  );
}

async function main(): Promise<void> {
  const c = readConfig(guardConfigSchema);
  const log = createLogger('upgrade-guard', c.LOG_LEVEL);
  const phases = c.GUARD_LIVE_PHASES.length > 0 ? c.GUARD_LIVE_PHASES : [...DEFAULT_LIVE];
  const kc = new KubeConfig();
  kc.loadFromDefault();
  const { live, skipped } = await liveActivities(
    kc.makeApiClient(CustomObjectsApi),
    c.WATCH_NAMESPACE,
    phases,
  );
  if (skipped.length > 0)
    log.warn({ namespaces: skipped }, 'namespaces not readable (not watched before): skipped');
  if (live.length === 0) {
    log.info({ phases }, 'no live sale: upgrade may proceed');
    return;
  }
  if (c.GUARD_ALLOW_DURING_ACTIVE_SALE) {
    log.warn({ live }, 'live sales, upgrading anyway (upgrade.allowDuringActiveSale=true)');
    return;
  }
  // The message is the Job's log, which `helm upgrade` points at when the hook fails.
  process.stderr.write(`${refusal(live)}\n`);
  process.exitCode = 1;
}

main().catch((err: unknown) => {
  process.stderr.write(`upgrade guard failed: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 2;
});
