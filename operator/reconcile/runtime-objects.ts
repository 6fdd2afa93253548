/**
 * The desired runtime objects of an activity: one Deployment per role (api, relay, consumer) and a
 * Service for the api. Pure: built from the resource, the phase's replicas and the operator's
 * configuration; applied by scale-runtime.ts. The image and the Secrets are the operator's
 * decision: a resource may only pick an image the configuration allows (runtimeImageFor), and
 * each role's pods read only that role's Secret (runtimeSecretName).
 */
import { createHash } from 'node:crypto';
import type {
  V1Deployment,
  V1EnvVar,
  V1OwnerReference,
  V1PodSpec,
  V1Service,
  V1TopologySpreadConstraint,
} from '@kubernetes/client-node';
import type { OperatorConfig } from '../config.js';
import { deploymentName, parseDuration } from '../api/v1alpha1/funcs.js';
import type { FlashSaleActivity, RuntimeRole } from '../api/v1alpha1/types.js';
import { roleSemiSpaceArgs } from '../../core/young-generation.js';

export const LABEL_ACTIVITY = 'flashsale.io/activity';
export const MANAGED_BY = 'flashsale-operator';
export const MANAGED_BY_SELECTOR = `app.kubernetes.io/managed-by=${MANAGED_BY}`;
/** Hash of the desired Deployment without its replicas: unchanged hash and replicas = no write. */
export const SPEC_HASH_ANNOTATION = 'flashsale.io/spec-hash';

export function ownerReference(fsa: FlashSaleActivity): V1OwnerReference {
  return {
    apiVersion: fsa.apiVersion,
    kind: fsa.kind,
    name: fsa.metadata.name,
    uid: fsa.metadata.uid,
    controller: true,
    blockOwnerDeletion: true,
  };
}

export function selectorLabels(fsa: FlashSaleActivity, role: RuntimeRole): Record<string, string> {
  return {
    'app.kubernetes.io/name': 'flashsale-runtime',
    'app.kubernetes.io/instance': fsa.metadata.name,
    'app.kubernetes.io/component': role,
  };
}

function labels(fsa: FlashSaleActivity, role: RuntimeRole, activityId: string): Record<string, string> {
  return {
    ...selectorLabels(fsa, role),
    'app.kubernetes.io/part-of': 'flashsale',
    'app.kubernetes.io/managed-by': MANAGED_BY,
    [LABEL_ACTIVITY]: activityId,
  };
}

export type ImageChoice = { allowed: true; image: string } | { allowed: false; message: string };

/**
 * The image the activity's runtime runs: the operator's RUNTIME_IMAGE, or the one the resource
 * asks for in spec.runtime.image when RUNTIME_ALLOWED_IMAGES lists it (exactly, or by its
 * `@sha256:` digest). Anything else is refused: the runtime pods get connection secrets, so the
 * code they run is never a tenant's free choice.
 */
export function runtimeImageFor(fsa: FlashSaleActivity, config: OperatorConfig): ImageChoice {
  const wanted = fsa.spec.runtime.image;
  const { image, allowedImages } = config.runtime;
  if (wanted === undefined) return { allowed: true, image };
  if (isAllowedImage(wanted, config)) return { allowed: true, image: wanted };
  return {
    allowed: false,
    message:
      `spec.runtime.image "${wanted}" is not allowed: use ${image}` +
      (allowedImages.length > 0 ? ` or one of ${allowedImages.join(', ')}` : '') +
      " (the operator's RUNTIME_IMAGE and RUNTIME_ALLOWED_IMAGES)",
  };
}

/**
 * The image a role's Deployment is applied with (scale-runtime.ts) and so compared against
 * (observe-runtime.ts): the resource's choice when allowed; when refused, the image the live
 * Deployment runs if the operator allows it, else RUNTIME_IMAGE.
 */
export function runtimeImageOf(
  fsa: FlashSaleActivity,
  config: OperatorConfig,
  live: V1Deployment | undefined,
): string {
  const choice = runtimeImageFor(fsa, config);
  if (choice.allowed) return choice.image;
  const liveImage = live?.spec?.template.spec?.containers[0]?.image;
  return liveImage !== undefined && isAllowedImage(liveImage, config) ? liveImage : config.runtime.image;
}

/** Whether `ref` is RUNTIME_IMAGE or listed in RUNTIME_ALLOWED_IMAGES (exactly or by digest). */
export function isAllowedImage(ref: string, config: OperatorConfig): boolean {
  const { image, allowedImages } = config.runtime;
  if (ref === image || allowedImages.includes(ref)) return true;
  const digest = /@(sha256:[0-9a-f]{64})$/.exec(ref)?.[1];
  return digest !== undefined && allowedImages.includes(digest);
}

/** The Secret a role's pods read: only the keys that role needs (docs/install.md, "Security"). */
export function runtimeSecretName(config: OperatorConfig, role: RuntimeRole): string {
  return `${config.runtime.secretName}-${role}`;
}

/**
 * The container's environment: the operator's variables, then RUNTIME_EXTRA_ENV without any name
 * the operator sets (ACTIVITY_ID and the ports are the operator's decision, never overridden).
 */
export function runtimeEnv(fsa: FlashSaleActivity, activityId: string, config: OperatorConfig): V1EnvVar[] {
  const own = operatorEnv(fsa, activityId, config);
  const taken = new Set(own.map((e) => e.name));
  return [...own, ...config.runtime.extraEnv.filter((e) => !taken.has(e.name))];
}

function operatorEnv(fsa: FlashSaleActivity, activityId: string, config: OperatorConfig): V1EnvVar[] {
  return [
    { name: 'ACTIVITY_ID', value: activityId },
    { name: 'HTTP_PORT', value: String(config.runtime.httpPort) },
    { name: 'METRICS_PORT', value: String(config.runtime.metricsPort) },
    {
      name: 'PAYMENT_TIMEOUT_SECONDS',
      value: String(Math.round(parseDuration(fsa.spec.payment.timeout) / 1000)),
    },
    { name: 'KAFKA_TOPIC_PREFIX', value: config.kafka.topicPrefix },
    // The jobs role creates the platform's order-events topic when it is missing: as replicated as
    // the activities' topics the operator creates.
    { name: 'KAFKA_REPLICATION_FACTOR', value: String(config.kafka.replicationFactor) },
    { name: 'KAFKA_MIN_INSYNC_REPLICAS', value: String(config.kafka.minInsyncReplicas) },
    { name: 'POD_NAME', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } },
    { name: 'POD_NAMESPACE', valueFrom: { fieldRef: { fieldPath: 'metadata.namespace' } } },
  ];
}

export function desiredDeployment(
  fsa: FlashSaleActivity,
  role: RuntimeRole,
  replicas: number,
  activityId: string,
  config: OperatorConfig,
  image: string = config.runtime.image,
): V1Deployment {
  const port = config.runtime.httpPort;
  const settings = config.runtime.roles[role];
  const resources = settings.resources ?? config.runtime.resources;
  const spread = settings.topologySpreadConstraints.map((c): V1TopologySpreadConstraint => ({
    ...c,
    labelSelector: c.labelSelector ?? { matchLabels: selectorLabels(fsa, role) },
  }));
  const { extraVolumes, extraVolumeMounts, imagePullSecrets } = config.runtime;
  const podExtras: Partial<V1PodSpec> = {
    ...(imagePullSecrets.length > 0 ? { imagePullSecrets: imagePullSecrets.map((name) => ({ name })) } : {}),
    ...(settings.priorityClassName ? { priorityClassName: settings.priorityClassName } : {}),
    ...(spread.length > 0 ? { topologySpreadConstraints: spread } : {}),
    ...(extraVolumes.length > 0 ? { volumes: extraVolumes } : {}),
  };
  const template = {
    metadata: {
      labels: labels(fsa, role, activityId),
      annotations: {
        'prometheus.io/scrape': 'true',
        'prometheus.io/port': String(config.runtime.metricsPort),
        'prometheus.io/path': '/metrics',
      },
    },
    spec: {
      ...(config.runtime.serviceAccount ? { serviceAccountName: config.runtime.serviceAccount } : {}),
      automountServiceAccountToken: false,
      // The preStop sleep counts against the grace period: the runtime keeps its 30 s to drain.
      terminationGracePeriodSeconds: 30 + settings.preStopSeconds,
      ...podExtras,
      securityContext: { runAsNonRoot: true, runAsUser: 1000, seccompProfile: { type: 'RuntimeDefault' } },
      containers: [
        {
          name: role,
          image,
          imagePullPolicy: config.runtime.imagePullPolicy,
          // V8's young generation is sized before any code runs (core/young-generation.ts).
          command: ['node', ...roleSemiSpaceArgs(role, settings.semiSpaceMiB), 'dist/runtime/main.js'],
          args: [role],
          env: runtimeEnv(fsa, activityId, config),
          envFrom: [{ secretRef: { name: runtimeSecretName(config, role) } }],
          // The api Service targets only `http`; /metrics is on `metrics` (PodMonitor).
          ports: [
            { name: 'http', containerPort: port, protocol: 'TCP' },
            { name: 'metrics', containerPort: config.runtime.metricsPort, protocol: 'TCP' },
          ],
          ...(resources ? { resources } : {}),
          ...(extraVolumeMounts.length > 0 ? { volumeMounts: extraVolumeMounts } : {}),
          // Endpoints and load balancers stop sending before SIGTERM (the kubelet's sleep action:
          // no shell or sleep binary is needed in the image).
          ...(settings.preStopSeconds > 0
            ? { lifecycle: { preStop: { sleep: { seconds: settings.preStopSeconds } } } }
            : {}),
          readinessProbe: {
            httpGet: { path: '/readyz', port: 'http' },
            periodSeconds: 5,
            failureThreshold: 3,
          },
          livenessProbe: {
            httpGet: { path: '/healthz', port: 'http' },
            periodSeconds: 10,
            failureThreshold: 6,
          },
          securityContext: {
            allowPrivilegeEscalation: false,
            readOnlyRootFilesystem: true,
            capabilities: { drop: ['ALL'] },
          },
        },
      ],
    },
  };
  const hash = createHash('sha256')
    .update(JSON.stringify({ labels: labels(fsa, role, activityId), template }))
    .digest('hex')
    .slice(0, 16);
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: {
      name: deploymentName(fsa.metadata.name, role),
      namespace: fsa.metadata.namespace,
      labels: labels(fsa, role, activityId),
      annotations: { [SPEC_HASH_ANNOTATION]: hash },
      ownerReferences: [ownerReference(fsa)],
    },
    spec: {
      replicas,
      selector: { matchLabels: selectorLabels(fsa, role) },
      template,
    },
  };
}

export function apiServiceName(activityName: string): string {
  return `${activityName}-api`;
}

export function desiredApiService(fsa: FlashSaleActivity, activityId: string): V1Service {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      name: apiServiceName(fsa.metadata.name),
      namespace: fsa.metadata.namespace,
      labels: labels(fsa, 'api', activityId),
      ownerReferences: [ownerReference(fsa)],
    },
    spec: {
      type: 'ClusterIP',
      selector: selectorLabels(fsa, 'api'),
      ports: [{ name: 'http', port: 80, targetPort: 'http', protocol: 'TCP' }],
    },
  };
}

/** Whether the live Deployment already is what `desired` describes. */
export function deploymentUpToDate(live: V1Deployment | undefined, desired: V1Deployment): boolean {
  if (!live) return false;
  return (
    live.metadata?.annotations?.[SPEC_HASH_ANNOTATION] ===
      desired.metadata?.annotations?.[SPEC_HASH_ANNOTATION] && live.spec?.replicas === desired.spec?.replicas
  );
}
