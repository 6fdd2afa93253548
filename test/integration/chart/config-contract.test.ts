// The chart's configuration contract with the programs it runs: the environment the chart gives
// the operator container (and the migration hook Job) is accepted by the operator's own
// configuration schema (operator/config.ts), every variable it sets is one the operator reads,
// and the runtime Secret the chart creates, with what the operator adds, is accepted by the
// runtime's configuration (runtime/config.ts).
import { loadOperatorConfig, operatorConfigSchema } from '../../../operator/config.js';
import { loadRuntimeConfig } from '../../../runtime/config.js';
import {
  at,
  chartDir,
  findObject,
  helmBinary,
  kubeVersion,
  parseManifests,
  renderChart,
  run,
  valuesArgs,
  valuesSets,
  type K8sObject,
} from './chart-helpers.js';

interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: {
    fieldRef?: { fieldPath: string };
    secretKeyRef?: { name: string; key: string; optional?: boolean };
  };
}

const connection = [
  'runtime.database.url=postgres://flashsale:secret@postgres.db.svc:5432/flashsale',
  'runtime.redis.url=redis://redis.db.svc:6379/0',
  'runtime.kafka.brokers={kafka-0.kafka.svc:9092,kafka-1.kafka.svc:9092}',
  'runtime.jwt.hs256Secret=0123456789abcdef0123456789abcdef',
  'runtime.jwt.issuer=https://login.shop.example/',
  'runtime.jwt.audience=flashsale-buyers',
];
/** What a user's existing Secret would hold (examples/values-large.yaml references one). */
const existingSecretData: Record<string, string> = {
  DATABASE_URL: 'postgres://flashsale:secret@postgres.db.svc:5432/flashsale',
  REDIS_URL: 'redis://redis.db.svc:6379/0',
  KAFKA_BROKERS: 'kafka-0.kafka.svc:9092',
  JWT_RS256_PUBLIC_KEY: '-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n',
};

let helm = '';
beforeAll(() => {
  helm = helmBinary();
}, 900_000);

function secretData(objects: K8sObject[], name: string): Record<string, string> {
  const secret = objects.find((o) => o.kind === 'Secret' && o.metadata.name === name);
  if (!secret) return existingSecretData;
  return (at(secret, 'stringData') ?? {}) as Record<string, string>;
}

/** A role's own Secret as the chart renders it (`<base>-<role>`); a missing one is a failure. */
function roleSecretData(objects: K8sObject[], base: string, role: string): Record<string, string> {
  const name = `${base}-${role}`;
  const secret = objects.find((o) => o.kind === 'Secret' && o.metadata.name === name);
  // With runtime.existingSecret the chart renders none of the runtime Secrets: the user's own.
  const rendersAny = objects.some((o) => o.kind === 'Secret' && o.metadata.name.startsWith(`${base}-`));
  if (!secret && !rendersAny) return existingSecretData;
  if (!secret) throw new Error(`the chart rendered no Secret ${name}`);
  return (at(secret, 'stringData') ?? {}) as Record<string, string>;
}

/** A container's environment as the kubelet would resolve it (downward API and Secret keys). */
function resolveEnv(vars: EnvVar[], objects: K8sObject[], namespace: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const v of vars) {
    if (v.value !== undefined) env[v.name] = v.value;
    else if (v.valueFrom?.fieldRef) {
      env[v.name] =
        v.valueFrom.fieldRef.fieldPath === 'metadata.namespace' ? namespace : 'operator-7d9f-abcde';
    } else if (v.valueFrom?.secretKeyRef) {
      const ref = v.valueFrom.secretKeyRef;
      const value = secretData(objects, ref.name)[ref.key];
      if (value === undefined && !ref.optional) throw new Error(`Secret ${ref.name} has no key ${ref.key}`);
      if (value !== undefined) env[v.name] = value;
    } else {
      throw new Error(`unsupported env source for ${v.name}`);
    }
  }
  return env;
}

describe.each(Object.keys(valuesSets))('configuration contract with %s values', (set) => {
  const files = valuesSets[set] ?? [];
  const namespace = 'flashsale-system';
  let objects: K8sObject[] = [];
  let container: { env: EnvVar[] } = { env: [] };

  beforeAll(() => {
    objects = parseManifests(renderChart(helm, files, connection, namespace));
    container = at(findObject(objects, 'Deployment', '-operator'), 'spec.template.spec.containers.0') as {
      env: EnvVar[];
    };
  });

  it('sets only variables the operator reads', () => {
    const known = new Set(Object.keys(operatorConfigSchema.shape));
    const unknown = container.env.map((v) => v.name).filter((name) => !known.has(name));
    expect(unknown).toEqual([]);
  });

  it("gives the operator a configuration its schema accepts, with the chart's values", () => {
    const config = loadOperatorConfig(resolveEnv(container.env, objects, namespace));
    expect(config.leaderElection.enabled).toBe(true);
    expect(config.leaderElection.namespace).toBe(namespace);
    expect(config.identity).toBe('operator-7d9f-abcde');
    expect(config.runtime.secretName).toMatch(/^flashsale-/);
    expect(config.runtime.image).toMatch(/flashsale-runtime[:@]/);
    expect(config.runtime.resources?.requests).toBeDefined();
    const port = at(container, 'ports.0.containerPort');
    expect(config.httpPort).toBe(port);
    expect(at(container, 'readinessProbe.httpGet.port')).toBe('http');
  });

  it('gives the migration hook Job the database URL', () => {
    const migrate = at(findObject(objects, 'Job', '-migrate'), 'spec.template.spec.containers.0') as {
      env: EnvVar[];
    };
    expect(resolveEnv(migrate.env, objects, namespace).DATABASE_URL).toMatch(/^postgres:\/\//);
  });

  it('creates a runtime Secret that, with what the operator adds, the runtime accepts', () => {
    const operator = loadOperatorConfig(resolveEnv(container.env, objects, namespace));
    // The variables the operator sets on the runtime containers (operator/reconcile/runtime-objects.ts).
    const added = {
      ACTIVITY_ID: 'double11-2030',
      HTTP_PORT: String(operator.runtime.httpPort),
      METRICS_PORT: String(operator.runtime.metricsPort),
      PAYMENT_TIMEOUT_SECONDS: '900',
      KAFKA_TOPIC_PREFIX: operator.kafka.topicPrefix,
      KAFKA_REPLICATION_FACTOR: String(operator.kafka.replicationFactor),
      KAFKA_MIN_INSYNC_REPLICAS: String(operator.kafka.minInsyncReplicas),
    };
    // Each role with its own Secret (the jobs role runs with the consumer's).
    for (const [role, secretOf] of [
      ['api', 'api'],
      ['relay', 'relay'],
      ['consumer', 'consumer'],
      ['jobs', 'consumer'],
    ] as const) {
      const secret = roleSecretData(objects, operator.runtime.secretName, secretOf);
      expect(() => loadRuntimeConfig(role, { ...secret, ...added })).not.toThrow();
    }
  });
});

it('carries token checks and Kafka authentication to the runtime and the operator', () => {
  const objects = parseManifests(
    renderChart(
      helm,
      [],
      [
        ...connection,
        'runtime.jwt.maxTokenAgeSeconds=900',
        'runtime.kafka.tls.enabled=true',
        'runtime.kafka.tls.ca=-----BEGIN CERTIFICATE-----',
        'runtime.kafka.sasl.mechanism=scram-sha-512',
        'runtime.kafka.sasl.username=flashsale',
        'runtime.kafka.sasl.password=kafka-secret',
      ],
    ),
  );
  const container = at(findObject(objects, 'Deployment', '-operator'), 'spec.template.spec.containers.0') as {
    env: EnvVar[];
  };
  const operatorEnv = resolveEnv(container.env, objects, 'flashsale');
  const operator = loadOperatorConfig(operatorEnv);
  expect(operatorEnv).toMatchObject({
    KAFKA_TLS: 'true',
    KAFKA_TLS_CA: '-----BEGIN CERTIFICATE-----',
    KAFKA_SASL_MECHANISM: 'scram-sha-512',
    KAFKA_SASL_USERNAME: 'flashsale',
    KAFKA_SASL_PASSWORD: 'kafka-secret',
  });
  const runtime = loadRuntimeConfig('api', {
    ...roleSecretData(objects, operator.runtime.secretName, 'api'),
    ACTIVITY_ID: 'a1',
  });
  expect(runtime).toMatchObject({
    JWT_ISSUER: 'https://login.shop.example/',
    JWT_AUDIENCE: 'flashsale-buyers',
    JWT_MAX_TOKEN_AGE_SECONDS: 900,
  });
  // Kafka's credentials go to the roles that talk to Kafka, never to the api.
  expect(runtime).not.toHaveProperty('KAFKA_SASL_MECHANISM');
  for (const role of ['relay', 'consumer'] as const) {
    const cfg = loadRuntimeConfig(role, {
      ...roleSecretData(objects, operator.runtime.secretName, role),
      ACTIVITY_ID: 'a1',
    });
    expect(cfg).toMatchObject({ KAFKA_SASL_MECHANISM: 'scram-sha-512', KAFKA_TLS: 'true' });
  }
});

it('scrapes the runtime on its metrics port, the one the operator gives the runtime pods', () => {
  const objects = parseManifests(
    renderChart(helm, [], [...connection, 'metrics.podMonitor.enabled=true', 'runtime.metricsPort=9464']),
  );
  const container = at(findObject(objects, 'Deployment', '-operator'), 'spec.template.spec.containers.0') as {
    env: EnvVar[];
  };
  const operator = loadOperatorConfig(resolveEnv(container.env, objects, 'flashsale'));
  expect([operator.runtime.httpPort, operator.runtime.metricsPort]).toEqual([8080, 9464]);
  expect(at(findObject(objects, 'PodMonitor', '-runtime'), 'spec.podMetricsEndpoints.0.port')).toBe(
    'metrics',
  );
});

it('passes the default runtime resources to the operator unchanged', () => {
  const objects = parseManifests(renderChart(helm, [], connection));
  const container = at(findObject(objects, 'Deployment', '-operator'), 'spec.template.spec.containers.0') as {
    env: EnvVar[];
  };
  const config = loadOperatorConfig(resolveEnv(container.env, objects, 'flashsale'));
  expect(config.runtime.resources).toEqual({
    requests: { cpu: '250m', memory: '256Mi' },
    limits: { memory: '512Mi' },
  });
});

it('carries a Sentinel-managed Redis to the operator and every role, and RESERVE_ACK to the roles that write to Redis and record it', () => {
  const sentinel = [
    ...connection.filter((c) => !c.startsWith('runtime.redis.url=')),
    // renderChart starts from values-connection.yaml, which names a single Redis.
    'runtime.redis.url=',
    'runtime.redis.sentinels={redis-sentinel-0.redis.svc:26379,redis-sentinel-1.redis.svc:26379,redis-sentinel-2.redis.svc:26379}',
    'runtime.redis.sentinelMaster=flashsale',
    'runtime.redis.sentinelPassword=sentinel-secret',
    'runtime.redis.reserveAck=replica',
  ];
  const objects = parseManifests(renderChart(helm, [], sentinel));
  const container = at(findObject(objects, 'Deployment', '-operator'), 'spec.template.spec.containers.0') as {
    env: EnvVar[];
  };
  // No REDIS_URL in the Secret: the operator's reference to it is optional then.
  const operatorEnv = resolveEnv(container.env, objects, 'flashsale');
  expect(operatorEnv.REDIS_URL).toBeUndefined();
  const operator = loadOperatorConfig(operatorEnv);
  expect(operator.redis).toMatchObject({
    sentinels: [
      { host: 'redis-sentinel-0.redis.svc', port: 26379 },
      { host: 'redis-sentinel-1.redis.svc', port: 26379 },
      { host: 'redis-sentinel-2.redis.svc', port: 26379 },
    ],
    sentinelMaster: 'flashsale',
    sentinelPassword: 'sentinel-secret',
  });
  for (const role of ['api', 'relay', 'consumer'] as const) {
    const secret = roleSecretData(objects, operator.runtime.secretName, role);
    const cfg = loadRuntimeConfig(role, { ...secret, ACTIVITY_ID: 'a1' });
    expect(cfg).toMatchObject({
      REDIS_SENTINEL_MASTER: 'flashsale',
      REDIS_SENTINEL_PASSWORD: 'sentinel-secret',
    });
    // The api's 202 and the consumer's jobs' stock returns wait for the replicas; the relay
    // writes nothing that PostgreSQL records.
    expect(secret.RESERVE_ACK).toBe(role === 'relay' ? undefined : 'replica');
  }
  const afterSale = objects.find(
    (o) => o.kind === 'Secret' && String(at(o, 'metadata.name')).endsWith('-after-sale'),
  );
  expect(at(afterSale, 'stringData.RESERVE_ACK')).toBe('replica');

  // Sentinels without a master name are refused at render time, with the reason.
  const refused = run(helm, [
    'template',
    'flashsale',
    chartDir,
    '--kube-version',
    kubeVersion,
    ...valuesArgs(
      [],
      sentinel.filter((c) => !c.startsWith('runtime.redis.sentinelMaster=')),
    ),
  ]);
  expect(refused.status).not.toBe(0);
  expect(refused.stderr).toContain('runtime.redis.sentinels needs runtime.redis.sentinelMaster');
  // And a value that is not host:port is refused by the values schema.
  const badAddress = run(helm, [
    'template',
    'flashsale',
    chartDir,
    '--kube-version',
    kubeVersion,
    ...valuesArgs([], [...sentinel, 'runtime.redis.sentinels={redis-sentinel}']),
  ]);
  expect(badAddress.status).not.toBe(0);
  expect(badAddress.stderr).toContain('sentinels');
});

it('gives the topics the operator and the after-sale role create the same replication settings', () => {
  const namespace = 'flashsale-system';
  const objects = parseManifests(
    renderChart(
      helm,
      [],
      [...connection, 'runtime.kafka.replicationFactor=3', 'runtime.kafka.minInsyncReplicas=2'],
      namespace,
    ),
  );
  const operatorEnv = at(
    findObject(objects, 'Deployment', '-operator'),
    'spec.template.spec.containers.0.env',
  ) as EnvVar[];
  const operator = loadOperatorConfig(resolveEnv(operatorEnv, objects, namespace));
  expect(operator.kafka).toMatchObject({ replicationFactor: 3, minInsyncReplicas: 2 });

  const afterSaleEnv = at(
    findObject(objects, 'Deployment', '-after-sale'),
    'spec.template.spec.containers.0.env',
  ) as EnvVar[];
  const secret = roleSecretData(objects, operator.runtime.secretName, 'after-sale');
  const afterSale = loadRuntimeConfig('after-sale', {
    ...secret,
    ...resolveEnv(afterSaleEnv, objects, namespace),
  });
  expect(afterSale).toMatchObject({ KAFKA_REPLICATION_FACTOR: 3, KAFKA_MIN_INSYNC_REPLICAS: 2 });

  // Unset, the after-sale role's topic gets the factor and the runtime's default min.insync.replicas.
  const defaults = parseManifests(renderChart(helm, [], connection, namespace));
  const defaultEnv = at(
    findObject(defaults, 'Deployment', '-after-sale'),
    'spec.template.spec.containers.0.env',
  ) as EnvVar[];
  expect(defaultEnv.map((e) => e.name)).toContain('KAFKA_REPLICATION_FACTOR');
  expect(defaultEnv.map((e) => e.name)).not.toContain('KAFKA_MIN_INSYNC_REPLICAS');
});

it('carries the Redis command timeouts and the registration retention to the programs that read them', () => {
  const namespace = 'flashsale-system';
  const programs = (sets: string[]) => {
    const objects = parseManifests(renderChart(helm, [], [...connection, ...sets], namespace));
    const envOf = (suffix: string): Record<string, string> =>
      resolveEnv(
        at(findObject(objects, 'Deployment', suffix), 'spec.template.spec.containers.0.env') as EnvVar[],
        objects,
        namespace,
      );
    const operator = loadOperatorConfig(envOf('-operator'));
    const role = (r: 'api' | 'relay' | 'consumer') =>
      loadRuntimeConfig(r, { ...roleSecretData(objects, operator.runtime.secretName, r), ACTIVITY_ID: 'a1' });
    const afterSale = loadRuntimeConfig('after-sale', {
      ...roleSecretData(objects, operator.runtime.secretName, 'after-sale'),
      ...envOf('-after-sale'),
    });
    return { operator, roles: [role('api'), role('relay'), role('consumer'), afterSale] };
  };

  // The defaults: the operator's 10 s, the runtime's own default, 30 days.
  const defaults = programs([]);
  expect(defaults.operator.redisCommandTimeoutMs).toBe(10_000);
  for (const cfg of defaults.roles) expect(cfg.REDIS_COMMAND_TIMEOUT_MS).toBe(5_000);
  expect(defaults.roles[3]!.REGISTRATION_RETENTION_DAYS).toBe(30);

  const set = programs([
    'operator.redisCommandTimeoutMs=20000',
    'runtime.redis.commandTimeoutMs=8000',
    'afterSale.registrationRetentionDays=0',
  ]);
  expect(set.operator.redisCommandTimeoutMs).toBe(20_000);
  for (const cfg of set.roles) expect(cfg.REDIS_COMMAND_TIMEOUT_MS).toBe(8_000);
  expect(set.roles[3]!.REGISTRATION_RETENTION_DAYS).toBe(0);

  // A timeout a wait the programs ask Redis for would run into is refused by the values schema.
  for (const bad of ['runtime.redis.commandTimeoutMs=1500', 'operator.redisCommandTimeoutMs=500']) {
    const refused = run(helm, [
      'template',
      'flashsale',
      chartDir,
      '--kube-version',
      kubeVersion,
      ...valuesArgs([], [...connection, bad]),
    ]);
    expect(refused.status).not.toBe(0);
    expect(refused.stderr).toContain(bad.split('=')[0]!.split('.').at(-1));
  }
});
