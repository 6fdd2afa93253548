// Connection details of the test environment (see docs/test-environment.md) and helpers that give
// each test file its own isolated resources on the shared servers.
import { randomBytes } from 'node:crypto';
import { CoreV1Api, KubeConfig, type ApiException } from '@kubernetes/client-node';
import pg from 'pg';

export interface TestEnv {
  /** postgres://… of a superuser on the server's `postgres` database. */
  databaseUrl: string;
  /** redis://host:port */
  redisUrl: string;
  /** Kafka bootstrap brokers, `host:port` each. */
  kafkaBrokers: string[];
  /** Path of an admin (system:masters) kubeconfig. */
  kubeconfig: string;
  /** kubectl binary, when known (built into the cache by test/env/build-kube.sh). */
  kubectl: string | undefined;
  /** State directory of the environment started by env-up.sh, when one was started. */
  stateDir: string | undefined;
}

const REQUIRED = ['DATABASE_URL', 'REDIS_URL', 'KAFKA_BROKERS', 'KUBECONFIG'] as const;
type RequiredVar = (typeof REQUIRED)[number];

function required(name: RequiredVar): string {
  const value = process.env[name];
  if (value === undefined || value === '') {
    const missing = REQUIRED.filter((n) => !process.env[n]).join(', ');
    throw new Error(
      `test environment variable ${name} is not set (missing: ${missing}). Run the tests through ` +
        '`npm test` / `bash test/run.sh`, or start servers with `make env-up` and ' +
        '`source /tmp/flashsale-env/env.sh` before running jest.',
    );
  }
  return value;
}

/** The test environment from process.env; throws a clear error naming what is missing. */
export function testEnv(): TestEnv {
  return {
    databaseUrl: required('DATABASE_URL'),
    redisUrl: required('REDIS_URL'),
    kafkaBrokers: required('KAFKA_BROKERS')
      .split(',')
      .map((b) => b.trim())
      .filter((b) => b !== ''),
    kubeconfig: required('KUBECONFIG'),
    kubectl: process.env.KUBECTL || undefined,
    stateDir: process.env.FLASHSALE_STATE || undefined,
  };
}

/**
 * `prefix-xxxxxxxx`: a short random suffix, lowercase [a-z0-9-] only, so the result is a valid
 * Kubernetes name (DNS-1123 label) and a safe Redis key part or Kafka topic / group id.
 */
export function uniqueId(prefix = 't'): string {
  const clean =
    prefix
      .toLowerCase()
      .replace(/[^a-z0-9-]+/g, '-')
      .replace(/^-+|-+$/g, '')
      .slice(0, 50) || 't';
  const suffix = randomBytes(6).readUIntBE(0, 6).toString(36).padStart(8, '0').slice(-8);
  return `${clean}-${suffix}`;
}

function urlFor(database: string, base: string): string {
  const url = new URL(base);
  url.pathname = `/${encodeURIComponent(database)}`;
  return url.toString();
}

/** The URL of another database on the test PostgreSQL server. */
export function databaseUrlFor(database: string, base = testEnv().databaseUrl): string {
  return urlFor(database, base);
}

function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/** Runs fn with a client connected to the server's `postgres` database. */
async function withAdmin<T>(base: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: urlFor('postgres', base) });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/** Name of the template database migrated with the project's migration runner. */
export const TEMPLATE_DATABASE = 'flashsale_test_template';
/** pg_advisory_lock key serialising template creation and cloning across jest workers. */
const TEMPLATE_LOCK_KEY = 0x466c5348; // "FlSH"

export type Migrator = (databaseUrl: string) => Promise<string[]>;

export interface FreshDatabaseOptions {
  /** Template database to clone (created and migrated on first use). */
  template?: string;
  /** Migrates the template; defaults to the project's runner, core/db/migrate.ts. */
  migrate?: Migrator;
}

export interface FreshDatabase {
  name: string;
  url: string;
  /** Drops the database, closing any connection still open to it. */
  drop(): Promise<void>;
}

async function projectMigrator(): Promise<Migrator> {
  // Imported lazily so that tests not using PostgreSQL do not load the migration runner.
  const mod = await import('../core/db/migrate.js');
  return mod.migrate;
}

/**
 * Creates a new database for one test file by cloning a template database that has been migrated
 * with the project's migration runner. Safe when several jest workers race: template creation,
 * migration and cloning are serialised by an advisory lock on the server's `postgres` database.
 * The template is re-created once per jest run (FLASHSALE_TEST_RUN, set by global setup) and
 * migrated on each call (a no-op when up to date).
 */
export async function freshDatabase(options: FreshDatabaseOptions = {}): Promise<FreshDatabase> {
  const template = options.template ?? TEMPLATE_DATABASE;
  const migrate = options.migrate ?? (await projectMigrator());
  const name = uniqueId('t').replace(/-/g, '_');
  const base = testEnv().databaseUrl;
  // Set by global setup: the template is re-created once per jest run, so that an edited
  // migration takes effect even on a long-lived server.
  const run = `flashsale test run ${process.env.FLASHSALE_TEST_RUN ?? 'none'}`;
  await withAdmin(base, async (admin) => {
    await admin.query('SELECT pg_advisory_lock($1)', [TEMPLATE_LOCK_KEY]);
    try {
      const found = await admin.query<{ run: string | null }>(
        'SELECT shobj_description(oid, $2) AS run FROM pg_database WHERE datname = $1',
        [template, 'pg_database'],
      );
      const current = found.rows[0];
      if (current && current.run !== run) {
        await admin.query(`DROP DATABASE ${quoteIdent(template)} WITH (FORCE)`);
      }
      if (!current || current.run !== run) {
        await admin.query(`CREATE DATABASE ${quoteIdent(template)}`);
        await admin.query(`COMMENT ON DATABASE ${quoteIdent(template)} IS ${pg.escapeLiteral(run)}`);
      }
      await migrate(urlFor(template, base));
      // CREATE DATABASE … TEMPLATE fails while anything is connected to the template.
      await admin.query(
        'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
        [template],
      );
      await admin.query(`CREATE DATABASE ${quoteIdent(name)} TEMPLATE ${quoteIdent(template)}`);
    } finally {
      await admin.query('SELECT pg_advisory_unlock($1)', [TEMPLATE_LOCK_KEY]);
    }
  });
  return {
    name,
    url: urlFor(name, base),
    drop: () =>
      withAdmin(base, async (admin) => {
        await admin.query(`DROP DATABASE IF EXISTS ${quoteIdent(name)} WITH (FORCE)`);
      }),
  };
}

/** The admin KubeConfig of the test API server, loaded from KUBECONFIG. */
export function kubeConfigFor(): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromFile(testEnv().kubeconfig);
  return kc;
}

/** True when err is an ApiException from @kubernetes/client-node with the given HTTP status. */
export function isApiError(err: unknown, code: number): err is ApiException<unknown> {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === code;
}

export interface ServiceAccountKubeConfigOptions {
  /** Token lifetime; the API server enforces a minimum of 600 s. */
  expirationSeconds?: number;
  /** Create the ServiceAccount when it does not exist (default true). */
  create?: boolean;
}

/**
 * A KubeConfig that authenticates as `system:serviceaccount:<namespace>:<name>` with a token from
 * the TokenRequest API (`serviceaccounts/token`, served by the API server itself: no
 * controller-manager is needed). Use it to run code under its own least-privilege Role.
 */
export async function serviceAccountKubeConfig(
  namespace: string,
  serviceAccountName: string,
  options: ServiceAccountKubeConfigOptions = {},
): Promise<KubeConfig> {
  const admin = kubeConfigFor();
  const core = admin.makeApiClient(CoreV1Api);
  if (options.create ?? true) {
    try {
      await core.createNamespacedServiceAccount({
        namespace,
        body: { metadata: { name: serviceAccountName } },
      });
    } catch (err) {
      if (!isApiError(err, 409)) throw err;
    }
  }
  const tokenRequest = await core.createNamespacedServiceAccountToken({
    name: serviceAccountName,
    namespace,
    body: { spec: { audiences: [], expirationSeconds: options.expirationSeconds ?? 3600 } },
  });
  const token = tokenRequest.status?.token;
  if (!token) throw new Error(`TokenRequest for ${namespace}/${serviceAccountName} returned no token`);
  const cluster = admin.getCurrentCluster();
  if (!cluster) throw new Error('admin kubeconfig has no current cluster');
  const user = `system:serviceaccount:${namespace}:${serviceAccountName}`;
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [cluster],
    users: [{ name: user, token }],
    contexts: [{ name: user, cluster: cluster.name, user: user, namespace }],
    currentContext: user,
  });
  return kc;
}
