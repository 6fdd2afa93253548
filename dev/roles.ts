// Runs the runtime's roles as real child processes for integration tests, and helpers around
// them: buyer tokens, activity set-up on the real servers, a keep-alive HTTP client.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createWriteStream } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { SignJWT } from 'jose';
import pg from 'pg';
import { Agent, request } from 'undici';
import { loadActivity, setGate } from '../core/activity-cache.js';
import { recordActivityItems } from '../core/db/activity-items-store.js';
import { createKafka, ensureTopics, topicsFor } from '../core/kafka.js';
import type { TopicNames } from '../core/kafka.js';
import type { ActivityDefinition, CatalogItem } from '../core/model.js';
import { testEnv } from './servers.js';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
export const JWT_SECRET = 'test-secret-test-secret-test-secret-0123';

export async function freePort(): Promise<number> {
  const srv = createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const port = (srv.address() as { port: number }).port;
  await new Promise((r) => srv.close(r));
  return port;
}

export async function waitFor<T>(
  what: string,
  probe: () => Promise<T | undefined | false>,
  timeoutMs = 60_000,
  intervalMs = 200,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined && v !== false) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

export interface RoleProcess {
  role: string;
  port: number;
  url: string;
  /** Base URL of the metrics port (/metrics, /healthz, /readyz). */
  metricsUrl: string;
  proc: ChildProcess;
  output: () => string;
  /**
   * SIGTERM and wait for the exit code. A process still running `graceMs` later (default
   * stopGraceMs: its SHUTDOWN_TIMEOUT_MS plus a margin, as a kubelet's grace period) is SIGKILLed
   * and the promise rejects with IgnoredSigterm: a role that outlives its own shutdown deadline
   * is a defect (its forced exit never ran: a loop that never yields), and a test waiting for it
   * would otherwise wait for ever.
   */
  stop: (graceMs?: number) => Promise<number | null>;
  /** SIGKILL and wait. */
  kill: () => Promise<void>;
  exited: Promise<number | null>;
}

export interface RoleOptions {
  activityId?: string;
  databaseUrl: string;
  /** Extra environment; `undefined` removes a default (e.g. JWT_HS256_SECRET for a key set). */
  env?: Record<string, string | undefined>;
  /** Wait for /readyz (default true). */
  waitReady?: boolean;
  /** Also append the whole output to this file (kept for post-mortems of fault runs). */
  logFile?: string;
}

/** runtime/config.ts's default SHUTDOWN_TIMEOUT_MS. */
const ROLE_SHUTDOWN_TIMEOUT_MS = 20_000;
/** What stop() adds to a role's SHUTDOWN_TIMEOUT_MS before it gives up on SIGTERM. */
const STOP_GRACE_MARGIN_MS = 10_000;

/** How long stop() waits for a role started with `env` to exit after SIGTERM. */
export function stopGraceMs(env: Record<string, string | undefined> = {}): number {
  const own = Number(env.SHUTDOWN_TIMEOUT_MS);
  return (Number.isFinite(own) && own > 0 ? own : ROLE_SHUTDOWN_TIMEOUT_MS) + STOP_GRACE_MARGIN_MS;
}

/** A role that was still running `graceMs` after SIGTERM, SIGKILLed by stop(). */
export class IgnoredSigterm extends Error {
  constructor(
    readonly role: string,
    readonly pid: number | undefined,
    readonly graceMs: number,
    output: string,
  ) {
    super(
      `${role} (pid ${pid ?? '?'}) was still running ${graceMs} ms after SIGTERM and was SIGKILLed: ` +
        `a role must exit within its SHUTDOWN_TIMEOUT_MS (runtime/main.ts forces the exit; a process ` +
        `past it is stuck in a loop that never yields). Its last output:\n${output.slice(-3000)}`,
    );
    this.name = 'IgnoredSigterm';
  }
}

/** A start that ended with the process gone before it was ready: what it printed, and the error to report. */
export class ExitedEarly {
  constructor(
    readonly output: string,
    readonly error: Error,
  ) {}
}

/**
 * Starts a process on ports from freePort(), which closes the port it found before the process
 * binds it, so another socket (a client connection's ephemeral port, often) can take it in
 * between. `start` returns the started process, or ExitedEarly for one that exited before it was
 * ready: one whose output says EADDRINUSE is started again on other ports, up to three times;
 * any other early exit fails at once with its error.
 */
export async function retryWhenPortTaken<T>(start: () => Promise<T | ExitedEarly>): Promise<T> {
  for (let attempt = 1; ; attempt += 1) {
    const started = await start();
    if (!(started instanceof ExitedEarly)) return started;
    if (attempt < 3 && started.output.includes('EADDRINUSE')) continue;
    throw started.error;
  }
}

/** Starts a runtime role as a real process on free loopback ports (retryWhenPortTaken). */
export function startRole(role: string, o: RoleOptions): Promise<RoleProcess> {
  return retryWhenPortTaken(async () => {
    const { p, closed } = spawnRole(role, o, await freePort(), await freePort());
    if (o.waitReady === false) return p;
    let ready: 'ready' | 'exited';
    try {
      ready = await waitFor(
        `${role} readiness`,
        async () => {
          if (p.proc.exitCode !== null || p.proc.signalCode !== null) return 'exited';
          const r = await request(`${p.url}/readyz`);
          await r.body.dump();
          return r.statusCode === 200 ? 'ready' : undefined;
        },
        60_000,
      );
    } catch (err) {
      // Whoever called gets no handle on a process that never became ready: it must not live on.
      await p.kill();
      throw err;
    }
    // A consumer answers 200 only once it is a member of its group (runtime/main.ts), so tests
    // do not race the group's first rebalance.
    if (ready === 'ready') return p;
    // 'close' comes after the last output; 'exit' may come before it.
    await closed;
    return new ExitedEarly(
      p.output(),
      new Error(`${role} exited early (${p.proc.exitCode ?? p.proc.signalCode}):\n${p.output()}`),
    );
  });
}

function spawnRole(
  role: string,
  o: RoleOptions,
  port: number,
  metricsPort: number,
): { p: RoleProcess; closed: Promise<void> } {
  const env = testEnv();
  const childEnv: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    DATABASE_URL: o.databaseUrl,
    REDIS_URL: env.redisUrl,
    KAFKA_BROKERS: env.kafkaBrokers.join(','),
    HTTP_PORT: String(port),
    METRICS_PORT: String(metricsPort),
    HTTP_HOST: '127.0.0.1',
    JWT_HS256_SECRET: JWT_SECRET,
    LOG_LEVEL: 'warn',
    KAFKAJS_NO_PARTITIONER_WARNING: '1',
    RELAY_RECLAIM_IDLE_MS: '2000',
    ...(o.activityId ? { ACTIVITY_ID: o.activityId } : {}),
    ...o.env,
  };
  for (const [k, v] of Object.entries(childEnv)) if (v === undefined) delete childEnv[k];
  const proc = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'runtime', 'main.ts'), role], {
    cwd: ROOT,
    env: childEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const log = o.logFile ? createWriteStream(o.logFile, { flags: 'a' }) : undefined;
  log?.write(`=== ${role} pid ${proc.pid ?? '?'} started ${new Date().toISOString()}\n`);
  const keep = (b: Buffer): void => {
    out = (out + b.toString('utf8')).slice(-20_000);
    log?.write(b);
  };
  proc.stdout!.on('data', keep);
  proc.stderr!.on('data', keep);
  // 'close' comes after the last output; 'exit' may come before it.
  const closed = new Promise<void>((resolve) =>
    proc.once('close', (code, signal) => {
      log?.end(
        `=== ${role} pid ${proc.pid ?? '?'} exited code=${code} signal=${signal} ${new Date().toISOString()}\n`,
      );
      resolve();
    }),
  );
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  const url = `http://127.0.0.1:${port}`;
  const p: RoleProcess = {
    role,
    port,
    url,
    metricsUrl: `http://127.0.0.1:${metricsPort}`,
    proc,
    output: () => out,
    exited,
    stop: async (graceMs = stopGraceMs(o.env)) => {
      if (proc.exitCode !== null || proc.signalCode !== null) return exited;
      proc.kill('SIGTERM');
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<'late'>((resolve) => {
        timer = setTimeout(() => resolve('late'), graceMs);
      });
      const first = await Promise.race([exited, late]);
      clearTimeout(timer);
      if (first !== 'late') return first;
      proc.kill('SIGKILL');
      await exited;
      throw new IgnoredSigterm(role, proc.pid, graceMs, out);
    },
    kill: async () => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
    },
  };
  return { p, closed };
}

export async function tokenFor(
  userId: string,
  secret = JWT_SECRET,
  claims: { issuer?: string; audience?: string } = {},
): Promise<string> {
  const jwt = new SignJWT({})
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(userId)
    .setIssuedAt()
    .setExpirationTime('1h');
  if (claims.issuer) jwt.setIssuer(claims.issuer);
  if (claims.audience) jwt.setAudience(claims.audience);
  return jwt.sign(new TextEncoder().encode(secret));
}

export interface TestActivity {
  id: string;
  topics: TopicNames;
  definition: ActivityDefinition;
}

/** Creates topics, loads the activity into Redis and (by default) opens the gate. */
export async function setUpActivity(
  id: string,
  items: CatalogItem[],
  opts: {
    open?: boolean;
    requireOrderCode?: boolean;
    startInMs?: number;
    durationMs?: number;
    partitions?: number;
    /** Also record the items in this database, as the operator does (the consumer checks orders against them). */
    databaseUrl?: string;
    /** The Redis to load the activity into (a test's private one); default the suite's. */
    redisUrl?: string;
  } = {},
): Promise<TestActivity> {
  const env = testEnv();
  const kafka = createKafka(env.kafkaBrokers, `test-${id}`);
  const admin = kafka.admin();
  await admin.connect();
  const topics = topicsFor(id);
  await ensureTopics(admin, topics, opts.partitions ?? 2, 1);
  await admin.disconnect();
  const now = Date.now();
  const definition: ActivityDefinition = {
    id,
    generation: 1,
    startAt: new Date(now + (opts.startInMs ?? -1000)),
    endAt: new Date(now + (opts.durationMs ?? 3_600_000)),
    requireOrderCode: opts.requireOrderCode ?? false,
    reopenOnRelease: true,
    items,
  };
  if (opts.databaseUrl) {
    const sql = new pg.Pool({ connectionString: opts.databaseUrl, max: 1 });
    try {
      await recordActivityItems(sql, id, definition.generation, items);
    } finally {
      await sql.end();
    }
  }
  const redis = new Redis(opts.redisUrl ?? env.redisUrl);
  try {
    await loadActivity(redis, definition);
    if (opts.open !== false) await setGate(redis, id, 'open');
  } finally {
    redis.disconnect();
  }
  return { id, topics, definition };
}

/**
 * A keep-alive HTTP client for load from the test process. `timeoutMs` bounds the wait for an
 * answer's headers and for each part of its body (undici's default is 300 s).
 */
export function httpClient(
  connections = 64,
  o: { timeoutMs?: number } = {},
): {
  post: (
    url: string,
    body: unknown,
    token?: string,
  ) => Promise<{ status: number; json: Record<string, unknown> }>;
  get: (url: string, token?: string) => Promise<{ status: number; json: Record<string, unknown> }>;
  raw: (
    url: string,
    init: { method: string; body?: string | Buffer; headers?: Record<string, string> },
  ) => Promise<{
    status: number;
    contentType: string;
    json: Record<string, unknown>;
  }>;
  close: () => Promise<void>;
} {
  const dispatcher = new Agent({
    connections,
    pipelining: 1,
    keepAliveTimeout: 30_000,
    ...(o.timeoutMs ? { headersTimeout: o.timeoutMs, bodyTimeout: o.timeoutMs } : {}),
  });
  const raw = async (
    url: string,
    init: { method: string; body?: string | Buffer; headers?: Record<string, string> },
  ) => {
    const r = await request(url, {
      method: init.method as 'GET',
      body: init.body,
      headers: init.headers,
      dispatcher,
    });
    const text = await r.body.text();
    let json: Record<string, unknown> = {};
    try {
      json = text ? (JSON.parse(text) as Record<string, unknown>) : {};
    } catch {
      json = { raw: text };
    }
    return { status: r.statusCode, contentType: String(r.headers['content-type'] ?? ''), json };
  };
  const auth = (token?: string): Record<string, string> =>
    token ? { authorization: `Bearer ${token}` } : {};
  return {
    raw,
    post: (url, body, token) =>
      raw(url, {
        method: 'POST',
        body: JSON.stringify(body),
        headers: { 'content-type': 'application/json', ...auth(token) },
      }),
    get: (url, token) => raw(url, { method: 'GET', headers: auth(token) }),
    close: () => dispatcher.close(),
  };
}

/** Runs `tasks` with at most `limit` in flight. */
export async function pool<T>(limit: number, tasks: (() => Promise<T>)[]): Promise<T[]> {
  const results = new Array<T>(tasks.length);
  let next = 0;
  const workers = Array.from({ length: Math.min(limit, tasks.length) }, async () => {
    for (;;) {
      const i = next++;
      if (i >= tasks.length) return;
      results[i] = await tasks[i]!();
    }
  });
  await Promise.all(workers);
  return results;
}
