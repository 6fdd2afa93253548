// Test harness of the operator's e2e tests: installs the CRD, prepares a namespace with the
// operator's own RBAC (config/rbac, bound in that namespace), runs the operator as a real child
// process under its ServiceAccount, and watches activities and Deployments.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { appendFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  ApiextensionsV1Api,
  AppsV1Api,
  AuthorizationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  RbacAuthorizationV1Api,
  Watch,
} from '@kubernetes/client-node';
import type {
  KubeConfig,
  V1ClusterRole,
  V1CustomResourceDefinition,
  V1Deployment,
  V1Role,
} from '@kubernetes/client-node';
import type { Redis } from 'ioredis';
import { parse } from 'yaml';
import { FINALIZER, GROUP, PLURAL, VERSION } from '../operator/api/v1alpha1/types.js';
import { ActivityClient } from '../operator/kube/activities.js';
import type { FlashSaleActivity, Phase } from '../operator/api/v1alpha1/types.js';
import { isApiError, kubeConfigFor, serviceAccountKubeConfig, testEnv } from './servers.js';
import { ExitedEarly, ROOT, freePort, retryWhenPortTaken, waitFor } from './roles.js';

export { ROOT, freePort, waitFor };
export const SERVICE_ACCOUNT = 'flashsale-operator';

export function readYaml<T>(relative: string): T {
  return parse(readFileSync(join(ROOT, relative), 'utf8')) as T;
}

export interface Admin {
  kc: KubeConfig;
  core: CoreV1Api;
  apps: AppsV1Api;
  custom: CustomObjectsApi;
  rbac: RbacAuthorizationV1Api;
  ext: ApiextensionsV1Api;
}

export function admin(): Admin {
  const kc = kubeConfigFor();
  return {
    kc,
    core: kc.makeApiClient(CoreV1Api),
    apps: kc.makeApiClient(AppsV1Api),
    custom: kc.makeApiClient(CustomObjectsApi),
    rbac: kc.makeApiClient(RbacAuthorizationV1Api),
    ext: kc.makeApiClient(ApiextensionsV1Api),
  };
}

async function createOrReplace<T extends { metadata?: { resourceVersion?: string } }>(
  read: () => Promise<T>,
  create: () => Promise<unknown>,
  replace: (resourceVersion: string | undefined) => Promise<unknown>,
): Promise<void> {
  for (let attempt = 0; ; attempt += 1) {
    try {
      const existing = await read();
      await replace(existing.metadata?.resourceVersion);
      return;
    } catch (err) {
      if (isApiError(err, 404)) {
        try {
          await create();
          return;
        } catch (createErr) {
          if (!isApiError(createErr, 409) || attempt > 5) throw createErr;
          continue;
        }
      }
      if (!isApiError(err, 409) || attempt > 5) throw err;
    }
  }
}

/** Who asks, for a SubjectAccessReview: a user and the groups it belongs to. */
export interface Subject {
  user: string;
  groups?: string[];
}

/** One access: verb, API group ('' = core), resource and optional subresource. */
export type Access = [verb: string, group: string, resource: string, subresource?: string];

/** The API server's own answer to whether `subject` may do `access` in namespace `ns`. */
export async function canI(a: Admin, subject: Subject, access: Access, ns: string): Promise<boolean> {
  const [verb, group, resource, subresource] = access;
  const r = await a.kc.makeApiClient(AuthorizationV1Api).createSubjectAccessReview({
    body: {
      spec: {
        ...subject,
        resourceAttributes: { verb, group, resource, namespace: ns, ...(subresource ? { subresource } : {}) },
      },
    },
  });
  return r.status?.allowed ?? false;
}

/**
 * Installs (or updates) the CRD from crds/ and waits until it is Established. Sent through the
 * generic custom-objects path: the typed client's serializer would drop the `x-kubernetes-*`
 * keys of a plain object parsed from YAML.
 */
export async function installCrd(a = admin()): Promise<void> {
  const crd = readYaml<V1CustomResourceDefinition>('crds/flashsale.io_flashsaleactivities.yaml');
  const name = crd.metadata?.name ?? '';
  const path = { group: 'apiextensions.k8s.io', version: 'v1', plural: 'customresourcedefinitions' };
  await createOrReplace(
    async () => (await a.custom.getClusterCustomObject({ ...path, name })) as V1CustomResourceDefinition,
    () => a.custom.createClusterCustomObject({ ...path, body: crd }),
    (rv) =>
      a.custom.replaceClusterCustomObject({
        ...path,
        name,
        body: { ...crd, metadata: { ...crd.metadata, resourceVersion: rv } },
      }),
  );
  await waitFor('CRD established', async () => {
    const c = await a.ext.readCustomResourceDefinition({ name });
    return c.status?.conditions?.some((x) => x.type === 'Established' && x.status === 'True');
  });
}

export interface OperatorNamespace {
  namespace: string;
  /** A kubeconfig file authenticating as the operator's ServiceAccount. */
  kubeconfigPath: string;
  kubeConfig: KubeConfig;
}

/**
 * A namespace in which the operator runs with exactly the shipped RBAC: the ClusterRole of
 * config/rbac/role.yaml bound by a RoleBinding in this namespace (WATCH_NAMESPACE mode), and the
 * leader-election Role for the Lease in this namespace.
 */
export async function prepareNamespace(namespace: string, a = admin()): Promise<OperatorNamespace> {
  await a.core.createNamespace({ body: { metadata: { name: namespace } } });
  const clusterRole = readYaml<V1ClusterRole>('config/rbac/role.yaml');
  const crName = clusterRole.metadata?.name ?? '';
  await createOrReplace(
    () => a.rbac.readClusterRole({ name: crName }),
    () => a.rbac.createClusterRole({ body: clusterRole }),
    (rv) =>
      a.rbac.replaceClusterRole({
        name: crName,
        body: { ...clusterRole, metadata: { ...clusterRole.metadata, resourceVersion: rv } },
      }),
  );
  const leaseRole = readYaml<V1Role>('config/rbac/leader_election_role.yaml');
  await a.rbac.createNamespacedRole({
    namespace,
    body: { ...leaseRole, metadata: { ...leaseRole.metadata, namespace } },
  });
  const subjects = [{ kind: 'ServiceAccount', name: SERVICE_ACCOUNT, namespace }];
  await a.rbac.createNamespacedRoleBinding({
    namespace,
    body: {
      metadata: { name: 'flashsale-operator' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: crName },
      subjects,
    },
  });
  await a.rbac.createNamespacedRoleBinding({
    namespace,
    body: {
      metadata: { name: 'flashsale-operator-leader-election' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: leaseRole.metadata?.name ?? '' },
      subjects,
    },
  });
  const kubeConfig = await serviceAccountKubeConfig(namespace, SERVICE_ACCOUNT, { expirationSeconds: 3600 });
  // The authorizer learns new bindings through its informers: wait until they apply.
  const asSa = kubeConfig.makeApiClient(CustomObjectsApi);
  await waitFor('RBAC for the operator', async () => {
    await asSa.listNamespacedCustomObject({ group: GROUP, version: VERSION, namespace, plural: PLURAL });
    return true;
  });
  const dir = mkdtempSync(join(tmpdir(), 'fs-operator-'));
  const kubeconfigPath = join(dir, 'kubeconfig.json');
  writeFileSync(kubeconfigPath, kubeConfig.exportConfig(), { mode: 0o600 });
  return { namespace, kubeconfigPath, kubeConfig };
}

export interface OperatorProcess {
  identity: string;
  /** Everything the process wrote (kept for a failed test's post-mortem). */
  logFile: string;
  port: number;
  proc: ChildProcess;
  logs: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Sends the signal and waits for the exit. */
  kill: (signal?: NodeJS.Signals) => Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Log lines (pino JSON) parsed. */
  records: () => Record<string, unknown>[];
}

export interface OperatorOptions {
  ns: OperatorNamespace;
  databaseUrl: string;
  identity?: string;
  crashPoint?: string;
  env?: Record<string, string>;
  /** Wait until the process leads and its controller runs (default), or only until it serves HTTP. */
  waitFor?: 'leading' | 'serving' | 'nothing';
}

/**
 * Runs `node --import tsx operator/main.ts` as a real process (so SIGKILL is real), on a free port
 * (retryWhenPortTaken).
 */
export function startOperator(o: OperatorOptions): Promise<OperatorProcess> {
  return retryWhenPortTaken(async () => {
    const p = await spawnOperator(o, await freePort());
    const mode = o.waitFor ?? 'leading';
    if (mode === 'nothing') return p;
    const started = await waitFor(
      `operator ${p.identity} ${mode}`,
      async () => {
        if (p.proc.exitCode !== null || p.proc.signalCode !== null) return 'exited';
        if (mode === 'serving') return (await fetch(`http://127.0.0.1:${p.port}/healthz`)).status === 200;
        return p.records().some((r) => r.msg === 'controller started');
      },
      90_000,
      100,
    );
    if (started !== 'exited') return p;
    return new ExitedEarly(p.logs(), new Error(`operator ${p.identity} exited early (see ${p.logFile})`));
  });
}

async function spawnOperator(o: OperatorOptions, port: number): Promise<OperatorProcess> {
  const env = testEnv();
  const identity = o.identity ?? 'operator-0';
  const proc = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'operator', 'main.ts')], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      KUBECONFIG: o.ns.kubeconfigPath,
      DATABASE_URL: o.databaseUrl,
      REDIS_URL: env.redisUrl,
      KAFKA_BROKERS: env.kafkaBrokers.join(','),
      KAFKA_TOPIC_PARTITIONS: '2',
      WATCH_NAMESPACE: o.ns.namespace,
      POD_NAMESPACE: o.ns.namespace,
      OPERATOR_IDENTITY: identity,
      HTTP_PORT: String(port),
      LOG_LEVEL: 'info',
      STATUS_REFRESH_SECONDS: '2',
      DRAIN_CHECK_SECONDS: '1',
      CLEANUP_RETRY_SECONDS: '1',
      RESTORE_SETTLE_SECONDS: '1',
      RELIST_SECONDS: '30',
      KAFKAJS_NO_PARTITIONER_WARNING: '1',
      ...(o.crashPoint ? { FLASHSALE_CRASH_POINT: o.crashPoint } : {}),
      ...o.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const logFile = join(o.ns.kubeconfigPath, '..', `${identity}.log`);
  const keep = (b: Buffer): void => {
    out = (out + b.toString('utf8')).slice(-400_000);
    appendFileSync(logFile, b);
  };
  proc.stdout?.on('data', keep);
  proc.stderr?.on('data', keep);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.once('exit', (code, signal) => resolve({ code, signal })),
  );
  const records = (): Record<string, unknown>[] =>
    out
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => {
        try {
          return JSON.parse(l) as Record<string, unknown>;
        } catch {
          return {};
        }
      });
  const p: OperatorProcess = {
    identity,
    logFile,
    port,
    proc,
    logs: () => out,
    exited,
    records,
    kill: async (signal: NodeJS.Signals = 'SIGTERM') => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
  return p;
}

export interface ActivityOptions {
  warmUpAt: Date;
  startAt: Date;
  endAt: Date;
  items?: {
    skuId: string;
    name: string;
    price: string;
    stock: number;
    limitPerUser?: number;
    buckets?: number;
  }[];
  catalogRef?: string;
  replicas?: Record<'warmUp' | 'active' | 'draining', { api: number; relay: number; consumer: number }>;
  drainTimeout?: string;
  extraSpec?: Record<string, unknown>;
}

export function activityBody(namespace: string, name: string, o: ActivityOptions): Record<string, unknown> {
  return {
    apiVersion: `${GROUP}/${VERSION}`,
    kind: 'FlashSaleActivity',
    metadata: { name, namespace },
    spec: {
      schedule: {
        warmUpAt: o.warmUpAt.toISOString(),
        startAt: o.startAt.toISOString(),
        endAt: o.endAt.toISOString(),
      },
      ...(o.items ? { items: o.items } : {}),
      ...(o.catalogRef ? { catalogRef: { name: o.catalogRef } } : {}),
      ...(o.replicas ? { runtime: { replicas: o.replicas } } : {}),
      drain: { timeout: o.drainTimeout ?? '60s' },
      cleanup: { resultRetention: '1h' },
      ...o.extraSpec,
    },
  };
}

export async function createActivity(a: Admin, body: Record<string, unknown>): Promise<FlashSaleActivity> {
  const namespace = (body.metadata as { namespace: string }).namespace;
  return (await a.custom.createNamespacedCustomObject({
    group: GROUP,
    version: VERSION,
    namespace,
    plural: PLURAL,
    body,
  })) as FlashSaleActivity;
}

export async function getActivity(
  a: Admin,
  namespace: string,
  name: string,
): Promise<FlashSaleActivity | undefined> {
  return new ActivityClient(a.custom).get(namespace, name);
}

export async function waitForPhase(
  a: Admin,
  namespace: string,
  name: string,
  phases: Phase | Phase[],
  timeoutMs = 60_000,
): Promise<FlashSaleActivity> {
  const wanted = Array.isArray(phases) ? phases : [phases];
  return waitFor(
    `${namespace}/${name} in ${wanted.join('|')}`,
    async () => {
      const fsa = await getActivity(a, namespace, name);
      return fsa?.status?.phase && wanted.includes(fsa.status.phase) ? fsa : undefined;
    },
    timeoutMs,
    100,
  );
}

export interface EventRecord {
  reason: string;
  type: string;
  message: string;
}

export async function eventsOf(a: Admin, namespace: string, name: string): Promise<EventRecord[]> {
  const list = await a.core.listNamespacedEvent({
    namespace,
    fieldSelector: `involvedObject.name=${name},involvedObject.kind=FlashSaleActivity`,
  });
  return list.items
    .sort(
      (x, y) =>
        (x.metadata?.creationTimestamp?.getTime() ?? 0) - (y.metadata?.creationTimestamp?.getTime() ?? 0),
    )
    .map((e) => ({ reason: e.reason ?? '', type: e.type ?? '', message: e.message ?? '' }));
}

export class Recorder {
  readonly phases = new Map<string, Phase[]>();
  /** Deployment name -> replica counts. */
  readonly replicas = new Map<string, number[]>();
  readonly statuses = new Map<string, FlashSaleActivity[]>();
  /** Activities whose DELETED event the watch has delivered. */
  readonly deleted = new Set<string>();
  private readonly aborts: AbortController[] = [];
  private stopped = false;

  constructor(
    private readonly a: Admin,
    private readonly namespace: string,
  ) {}

  async start(): Promise<void> {
    const watch = new Watch(this.a.kc);
    // A watch the API server ends (its timeout, a restart) resumes from the last resourceVersion
    // it delivered, so no event in between is lost; only when that version has expired (410 Gone,
    // delivered as an ERROR event) does it start over with a fresh list.
    const run = async (
      path: string,
      onObject: (type: string, obj: unknown) => void,
      from?: string,
    ): Promise<void> => {
      let last = from;
      const restart = (): void => {
        if (!this.stopped) setTimeout(() => void run(path, onObject, last), 200);
      };
      const deliver = (type: string, obj: unknown): void => {
        if (type === 'ERROR') {
          last = undefined;
          return;
        }
        const version = (obj as { metadata?: { resourceVersion?: string } }).metadata?.resourceVersion;
        if (version) last = version;
        if (type !== 'BOOKMARK') onObject(type, obj);
      };
      const query = last
        ? { allowWatchBookmarks: true, resourceVersion: last }
        : { allowWatchBookmarks: true };
      try {
        this.aborts.push(await watch.watch(path, query, deliver, restart));
      } catch {
        restart();
      }
    };
    await run(`/apis/${GROUP}/${VERSION}/namespaces/${this.namespace}/${PLURAL}`, (type, obj) => {
      const fsa = obj as FlashSaleActivity;
      const name = fsa.metadata.name;
      if (type === 'DELETED') this.deleted.add(name);
      else this.deleted.delete(name);
      const phase = fsa.status?.phase;
      const list = this.phases.get(name) ?? [];
      if (phase && list.at(-1) !== phase) list.push(phase);
      this.phases.set(name, list);
      const statuses = this.statuses.get(name) ?? [];
      statuses.push(fsa);
      this.statuses.set(name, statuses);
    });
    await run(`/apis/apps/v1/namespaces/${this.namespace}/deployments`, (_t, obj) => {
      const d = obj as V1Deployment;
      const name = d.metadata?.name ?? '';
      const replicas = d.spec?.replicas ?? -1;
      const list = this.replicas.get(name) ?? [];
      if (list.at(-1) !== replicas) list.push(replicas);
      this.replicas.set(name, list);
    });
  }

  /**
   * Resolves once the watch has delivered `phase` as `name`'s latest: a GET (what `waitForPhase`
   * polls) can see a phase before the watch event carrying it reaches this process.
   */
  async sawPhase(name: string, phase: Phase, timeoutMs = 30_000): Promise<void> {
    await waitFor(
      `the watch to deliver ${name} in ${phase}`,
      async () => this.phases.get(name)?.at(-1) === phase,
      timeoutMs,
      50,
    );
  }

  /** Resolves once the watch has delivered `name`'s deletion (and so every status before it). */
  async sawDeleted(name: string, timeoutMs = 30_000): Promise<void> {
    await waitFor(
      `the watch to deliver ${name}'s deletion`,
      async () => this.deleted.has(name),
      timeoutMs,
      50,
    );
  }

  /** Resolves once the watch has delivered `replicas` as `deployment`'s latest size. */
  async sawReplicas(deployment: string, replicas: number, timeoutMs = 30_000): Promise<void> {
    await waitFor(
      `the watch to deliver ${deployment} at ${replicas} replicas`,
      async () => this.replicas.get(deployment)?.at(-1) === replicas,
      timeoutMs,
      50,
    );
  }

  stop(): void {
    this.stopped = true;
    for (const c of this.aborts) c.abort();
  }
}

/** Deletes the namespace's activities' finalizers so that nothing is left half-deleted. */
export async function forceRemoveFinalizers(a: Admin, namespace: string): Promise<void> {
  const list = (await a.custom.listNamespacedCustomObject({
    group: GROUP,
    version: VERSION,
    namespace,
    plural: PLURAL,
  })) as { items: FlashSaleActivity[] };
  for (const fsa of list.items) {
    const i = fsa.metadata.finalizers?.indexOf(FINALIZER) ?? -1;
    if (i < 0) continue;
    await a.custom
      .patchNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace,
        plural: PLURAL,
        name: fsa.metadata.name,
        body: [{ op: 'remove', path: `/metadata/finalizers/${i}` }],
      })
      .catch(() => undefined);
  }
}

/** Every key matching `pattern` (a full SCAN, never KEYS). */
export async function scanKeys(redis: Redis, pattern: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    cursor = next;
    found.push(...keys);
  } while (cursor !== '0');
  return found.sort();
}

/** The role's Pods of an activity (kwok plays their kubelet): how many exist and how many are Ready. */
export async function rolePods(
  a: Admin,
  namespace: string,
  activity: string,
  role: 'api' | 'relay' | 'consumer',
): Promise<{ total: number; ready: number }> {
  const list = await a.core.listNamespacedPod({
    namespace,
    labelSelector: `app.kubernetes.io/instance=${activity},app.kubernetes.io/component=${role}`,
  });
  const live = list.items.filter((p) => !p.metadata?.deletionTimestamp);
  const ready = live.filter((p) =>
    p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'),
  ).length;
  return { total: live.length, ready };
}

/** Waits until the role runs exactly `ready` Ready Pods (and no other). */
export async function waitForReadyPods(
  a: Admin,
  namespace: string,
  activity: string,
  role: 'api' | 'relay' | 'consumer',
  ready: number,
  timeoutMs = 60_000,
): Promise<void> {
  await waitFor(
    `${ready} Ready ${role} Pod(s) of ${namespace}/${activity}`,
    async () => {
      const pods = await rolePods(a, namespace, activity, role);
      return pods.total === ready && pods.ready === ready;
    },
    timeoutMs,
    250,
  );
}
