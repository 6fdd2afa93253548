// A sale on real servers with the runtime roles as real processes, a supervisor that restarts a
// role killed by SIGKILL (as Kubernetes would), concurrent buyers that retry until they get a
// definitive answer (same requestId, so a retry is a replay), and the wait for recovery before
// the invariant checker runs. Used by test/integration/faults/*.test.ts.
import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { countUnconfirmed, loadActivity, readOutbox, setGate } from '../../../core/activity-cache.js';
import { recordActivityItems } from '../../../core/db/activity-items-store.js';
import { createKafka, ensureTopics, topicsFor } from '../../../core/kafka.js';
import type { CatalogItem } from '../../../core/model.js';
import { createRedis, parseSentinels } from '../../../core/redis.js';
import type { RedisConnection, SentinelAddress } from '../../../core/redis.js';
import { registerScripts } from '../../../core/scripts.js';
import type { RedisClient } from '../../../core/scripts.js';
import { httpClient, IgnoredSigterm, startRole, tokenFor } from '../../../dev/roles.js';
import type { RoleOptions, RoleProcess } from '../../../dev/roles.js';
import { checkActivity } from './invariants.js';
import type { Violation } from './invariants.js';

export type RoleName = 'api' | 'relay' | 'consumer';
export const ROLES: readonly RoleName[] = ['api', 'relay', 'consumer'];

/** Where the servers are: the suite's shared ones (testEnv) or a private set (window 11). */
export interface Servers {
  databaseUrl: string;
  redisUrl: string;
  kafkaBrokers: string[];
  /** A Sentinel-managed Redis (window 12): used instead of redisUrl by the roles and the checks. */
  sentinel?: Required<Pick<RedisConnection, 'sentinels' | 'sentinelMaster'>>;
  /** A Redis Cluster's seed nodes: used instead of redisUrl by the roles and the checks. */
  cluster?: SentinelAddress[];
}

/** The servers of a private Sentinel set (test/env/start-redis-sentinel.sh's variables). */
export function sentinelServers(
  env: Record<string, string>,
  databaseUrl: string,
  kafkaBrokers: string[],
): Servers {
  return {
    databaseUrl,
    redisUrl: `redis://127.0.0.1:${env.REDIS_SENTINEL_PRIMARY_PORT!}`,
    kafkaBrokers,
    sentinel: {
      sentinels: parseSentinels(env.REDIS_SENTINELS!.split(',')),
      sentinelMaster: env.REDIS_SENTINEL_MASTER!,
    },
  };
}

/** The servers of a Redis Cluster given by its seed nodes (the first one also as REDIS_URL). */
export function clusterServers(
  nodes: SentinelAddress[],
  databaseUrl: string,
  kafkaBrokers: string[],
): Servers {
  return {
    databaseUrl,
    redisUrl: `redis://${nodes[0]!.host}:${nodes[0]!.port}`,
    kafkaBrokers,
    cluster: nodes,
  };
}

/** A client of the servers' Redis (through Sentinel when there is one). */
export function redisOf(servers: Servers, options: { maxRetriesPerRequest?: number } = {}): RedisClient {
  return createRedis(
    {
      url: servers.redisUrl,
      ...servers.sentinel,
      ...(servers.cluster ? { clusterNodes: servers.cluster } : {}),
    },
    options,
  );
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Topics, cache load and open gate for one activity (setUpActivity, for any set of servers). */
export async function prepareActivity(
  servers: Servers,
  id: string,
  items: CatalogItem[],
  topics: { partitions?: number; replicationFactor?: number } = {},
): Promise<void> {
  const kafka = createKafka(servers.kafkaBrokers, `faults-${id}`);
  const admin = kafka.admin();
  await admin.connect();
  try {
    await ensureTopics(admin, topicsFor(id), topics.partitions ?? 2, topics.replicationFactor ?? 1);
  } finally {
    await admin.disconnect();
  }
  // The items go to PostgreSQL first, as the operator records them (the consumer checks against them).
  const sql = new pg.Pool({ connectionString: servers.databaseUrl, max: 1 });
  try {
    await recordActivityItems(sql, id, 1, items);
  } finally {
    await sql.end();
  }
  const redis = redisOf(servers);
  try {
    const now = Date.now();
    await loadActivity(redis, {
      id,
      generation: 1,
      startAt: new Date(now - 1000),
      endAt: new Date(now + 3_600_000),
      requireOrderCode: false,
      reopenOnRelease: true,
      items,
    });
    await setGate(redis, id, 'open');
  } finally {
    redis.disconnect();
  }
}

export interface SaleOptions {
  servers: Servers;
  activityId: string;
  /** Extra environment per role (crash points). A restarted role never gets it again. */
  roleEnv?: Partial<Record<RoleName, Record<string, string>>>;
  /** Extra environment of every role and every incarnation (settings under test). */
  env?: Record<string, string>;
}

/** The three roles of one activity, restarted when they die (any signal or exit) until stop(). */
export class Sale {
  readonly current = new Map<RoleName, RoleProcess>();
  readonly deaths: { role: RoleName; signal: string | null; code: number | null }[] = [];
  private stopping = false;
  private readonly watchers: Promise<void>[] = [];
  private readonly extra: RoleProcess[] = [];

  /** Every incarnation's whole output, one file per role, for post-mortems. */
  readonly logDir: string;

  constructor(private readonly options: SaleOptions) {
    this.logDir = join(tmpdir(), 'flashsale-faults', options.activityId);
    mkdirSync(this.logDir, { recursive: true });
  }

  private env(extra: Record<string, string> | undefined): Record<string, string> {
    const s = this.options.servers;
    return {
      REDIS_URL: s.redisUrl,
      ...(s.sentinel
        ? {
            REDIS_SENTINELS: s.sentinel.sentinels.map((x) => `${x.host}:${x.port}`).join(','),
            REDIS_SENTINEL_MASTER: s.sentinel.sentinelMaster,
          }
        : {}),
      ...(s.cluster ? { REDIS_CLUSTER_NODES: s.cluster.map((x) => `${x.host}:${x.port}`).join(',') } : {}),
      KAFKA_BROKERS: s.kafkaBrokers.join(','),
      // A stable relay name: a restarted relay picks up its own pending entries at once.
      RELAY_CONSUMER_NAME: 'relay-0',
      RELAY_BATCH_SIZE: '5',
      CONSUMER_BATCH_SIZE: '5',
      // The order-gap repair job is a safety net that re-publishes lost half messages; off here so
      // that the primary path alone must be exactly-once (a lost message shows as order gap).
      ORDER_GAP_REPAIR: 'false',
      ...this.options.env,
      ...extra,
    };
  }

  /** How a process of the sale starts: its settings, its output in `<logName>.log`. */
  private roleOptions(extra: Record<string, string> | undefined, logName: string): RoleOptions {
    return {
      activityId: this.options.activityId,
      databaseUrl: this.options.servers.databaseUrl,
      env: this.env(extra),
      logFile: join(this.logDir, `${logName}.log`),
    };
  }

  private async launch(role: RoleName, first: boolean): Promise<RoleProcess> {
    const extra = first ? this.options.roleEnv?.[role] : undefined;
    for (let attempt = 1; ; attempt += 1) {
      try {
        const p = await startRole(role, this.roleOptions(extra, role));
        if (this.stopping) {
          // stop() began while this replacement was starting: it was not among the processes
          // stop() stopped, so it stops here (else it would outlive the sale, and stop() would
          // wait for it forever).
          await p.stop();
          return p;
        }
        this.current.set(role, p);
        this.watchers.push(this.watch(role, p));
        return p;
      } catch (err) {
        // A role may not become ready while a server is down: try again, as a kubelet would.
        if (this.stopping || attempt >= 20) throw err;
        await sleep(1000);
      }
    }
  }

  private async watch(role: RoleName, p: RoleProcess): Promise<void> {
    const code = await p.exited;
    if (this.stopping) return;
    this.deaths.push({ role, signal: p.proc.signalCode, code });
    await this.launch(role, false);
  }

  async start(): Promise<void> {
    await Promise.all(ROLES.map((r) => this.launch(r, true)));
  }

  url(role: RoleName = 'api'): string {
    const p = this.current.get(role);
    if (!p) throw new Error(`${role} not running`);
    return p.url;
  }

  /**
   * One more process of `role` beside the supervised one, as a Deployment scaled out mid-sale
   * runs it (same settings; its output in `<name>.log`). Not restarted when it dies; stop() stops it.
   */
  async addInstance(role: RoleName, name: string): Promise<RoleProcess> {
    const p = await startRole(role, this.roleOptions(undefined, name));
    this.extra.push(p);
    return p;
  }

  /** SIGKILL the running instance of a role (the supervisor restarts it). */
  async kill(role: RoleName): Promise<void> {
    await this.current.get(role)?.kill();
  }

  /** Resolves when the role has died `n` times in all (crash point reached, or killed). */
  async diedTimes(role: RoleName, n: number, timeoutMs = 90_000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (this.deaths.filter((d) => d.role === role).length >= n) return true;
      await sleep(100);
    }
    return false;
  }

  /**
   * Stops every role (SIGTERM; a role still running past its grace is SIGKILLed) and rejects with
   * the first IgnoredSigterm once all are gone, so a role that does not stop fails its test by name
   * instead of holding it until the test's timeout.
   */
  async stop(): Promise<void> {
    this.stopping = true;
    const stopped = await Promise.allSettled([...this.current.values(), ...this.extra].map((p) => p.stop()));
    // Watchers still restarting a role stop what they started (see launch); a start cut short by
    // the stop is no failure, a replacement that ignored SIGTERM is.
    const restarts = await Promise.allSettled(this.watchers);
    const failed = [...stopped, ...restarts].find(
      (s): s is PromiseRejectedResult => s.status === 'rejected' && s.reason instanceof IgnoredSigterm,
    );
    if (failed) throw failed.reason;
  }

  output(): string {
    const tails = [...this.current.entries()].map(([r, p]) => `--- ${r}\n${p.output().slice(-3000)}`);
    return [`(whole output of every incarnation: ${this.logDir})`, ...tails].join('\n');
  }
}

export interface BuyerAnswer {
  buyer: string;
  status: number;
  reservationId?: string;
  code?: string;
  attempts: number;
  /** Why the attempt got no answer (status 0): the connection's error, or no answer in time. */
  error?: string;
}

/**
 * How long a buyer waits for one answer before it counts the attempt as unanswered and tries
 * again (same requestId): the api answers within its dependencies' timeouts, a few seconds; an
 * answer that never comes is logged with its buyer, so a stalled step names itself.
 */
export const BUYER_REQUEST_TIMEOUT_MS = 30_000;

/**
 * Every buyer submits one order (same requestId on every attempt) and retries while the answer is
 * not definitive (connection error, 5xx), reading the api's current address each time.
 */
export async function buyers(
  sale: Sale,
  activityId: string,
  ids: string[],
  o: {
    skuId: string;
    quantity?: number;
    concurrency?: number;
    maxAttempts?: number;
    /** Once aborted, no buyer tries again (a failed test stops its load with the sale). */
    signal?: AbortSignal;
    /** Every answer, retried ones included (the returned answers are each buyer's last). */
    onAttempt?: (answer: BuyerAnswer) => void;
    /** A worker's pause before its next buyer, to spread the load over time. */
    pauseMs?: number;
    /** Default BUYER_REQUEST_TIMEOUT_MS. */
    requestTimeoutMs?: number;
  },
): Promise<BuyerAnswer[]> {
  const timeoutMs = o.requestTimeoutMs ?? BUYER_REQUEST_TIMEOUT_MS;
  const http = httpClient(o.concurrency ?? 8, { timeoutMs });
  const tokens = new Map<string, string>();
  for (const b of ids) tokens.set(b, await tokenFor(b));
  const out: BuyerAnswer[] = new Array<BuyerAnswer>(ids.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    for (;;) {
      const i = next++;
      if (i >= ids.length) return;
      const b = ids[i]!;
      let answer: BuyerAnswer = { buyer: b, status: 0, attempts: 0 };
      for (let a = 1; a <= (o.maxAttempts ?? 200); a += 1) {
        answer = { buyer: b, status: 0, attempts: a };
        try {
          const r = await http.post(
            `${sale.url('api')}/v1/activities/${activityId}/orders`,
            { skuId: o.skuId, quantity: o.quantity ?? 1, requestId: `req-${b}` },
            tokens.get(b),
          );
          answer = {
            buyer: b,
            status: r.status,
            attempts: a,
            ...(typeof r.json.reservationId === 'string' ? { reservationId: r.json.reservationId } : {}),
            ...(typeof r.json.code === 'string' ? { code: r.json.code } : {}),
          };
        } catch (err) {
          // The connection died with the process, the api is restarting, or no answer came.
          const e = err as { code?: string; message?: string };
          answer.error = e.code ?? e.message ?? String(err);
          if (/TIMEOUT/.test(answer.error))
            console.log(
              `buyer ${b} (${activityId}), attempt ${a}: no answer in ${timeoutMs} ms (${answer.error})`,
            );
        }
        o.onAttempt?.(answer);
        if ((answer.status >= 200 && answer.status < 500) || o.signal?.aborted) break;
        await sleep(Math.min(1000, 50 * a));
      }
      out[i] = answer;
      if (o.pauseMs) await sleep(o.pauseMs);
    }
  };
  try {
    await Promise.all(Array.from({ length: Math.min(o.concurrency ?? 8, ids.length) }, worker));
  } finally {
    await http.close();
  }
  return out;
}

/**
 * Buyers arriving steadily (batches of ten, two at a time, a pause after each) until stop(); each
 * buys one unit of `skuId`: a load that lasts exactly as long as the disturbance a test makes.
 */
export function steadyBuyers(
  sale: Sale,
  activityId: string,
  o: { skuId: string; onAttempt?: (a: BuyerAnswer) => void },
): { answers: BuyerAnswer[]; stop: () => Promise<void> } {
  const answers: BuyerAnswer[] = [];
  let buying = true;
  let next = 0;
  const load = (async () => {
    while (buying) {
      const ids = Array.from({ length: 10 }, () => `${activityId}-b${next++}`);
      answers.push(
        ...(await buyers(sale, activityId, ids, {
          skuId: o.skuId,
          concurrency: 2,
          maxAttempts: 400,
          pauseMs: 100,
          ...(o.onAttempt ? { onAttempt: o.onAttempt } : {}),
        })),
      );
    }
  })();
  return {
    answers,
    stop: async () => {
      buying = false;
      await load;
    },
  };
}

/**
 * Every answer of a load, retried ones included (`buyers`' `onAttempt`): a buyer who retried a
 * 5xx until a definitive answer shows only that answer, so a 500 along the way (an error the api
 * did not know as a dependency outage) is seen here only.
 */
export function answerLog(): { onAttempt: (a: BuyerAnswer) => void; violations: () => Violation[] } {
  const internal: string[] = [];
  return {
    onAttempt: (a) => {
      if (a.status === 500) internal.push(`${a.buyer} (attempt ${a.attempts}): 500 ${a.code ?? ''}`.trim());
    },
    violations: () =>
      internal.length === 0
        ? []
        : [
            {
              rule: 'internal-error',
              detail: `${internal.length} answer(s) 500, e.g. ${internal.slice(0, 3).join('; ')} (the api's log names the error)`,
            },
          ],
  };
}

/** Every buyer's answer against the orders in PostgreSQL (a Kafka fault's yardstick). */
export interface AnswersToOrders {
  /** Answers 202. */
  accepted: number;
  /** Orders of the activity. */
  orders: number;
  /** 202s without an order. */
  lost: number;
  /** Reservations with two or more orders. */
  duplicated: number;
  /** `missing-order` (a lost 202, a buyer never answered for good) and `duplicate-order`. */
  violations: Violation[];
}

/** The activity's orders in PostgreSQL, whatever their status. */
export async function countOrders(sql: pg.Pool, activityId: string): Promise<number> {
  const { rows } = await sql.query<{ n: string }>(
    'SELECT count(*)::text AS n FROM orders WHERE activity_id = $1',
    [activityId],
  );
  return Number(rows[0]!.n);
}

export async function answersToOrders(
  sql: pg.Pool,
  activityId: string,
  answers: readonly BuyerAnswer[],
): Promise<AnswersToOrders> {
  const accepted = answers.filter((a) => a.status === 202);
  const undecided = answers.filter((a) => a.status === 0 || a.status >= 500);
  const perRsv = await sql.query<{ reservation_id: string; n: string }>(
    `SELECT reservation_id, count(*)::text AS n FROM orders WHERE activity_id = $1 GROUP BY reservation_id`,
    [activityId],
  );
  const n = new Map(perRsv.rows.map((r) => [r.reservation_id, Number(r.n)]));
  const lost = accepted.filter((a) => n.get(a.reservationId!) === undefined).length;
  const duplicated = [...n.values()].filter((x) => x > 1).length;
  const violations: Violation[] = [];
  if (lost > 0) violations.push({ rule: 'missing-order', detail: `${lost} 202(s) without an order` });
  if (duplicated > 0)
    violations.push({ rule: 'duplicate-order', detail: `${duplicated} reservation(s) with 2+ orders` });
  if (undecided.length > 0)
    violations.push({
      rule: 'missing-order',
      detail: `${undecided.length} buyer(s) never got a definitive answer`,
    });
  return {
    accepted: accepted.length,
    orders: [...n.values()].reduce((a, b) => a + b, 0),
    lost,
    duplicated,
    violations,
  };
}

export interface Recovery {
  violations: Violation[];
  /** True when the outbox and the unconfirmed ledger drained before the deadline. */
  drained: boolean;
}

/**
 * Waits (bounded) until half messages and unconfirmed reservations are 0, then reads the final
 * state and checks the invariants. Not draining is not an error here: the checker reports the
 * half messages / order gap left, with everything else it finds.
 */
export async function recoverAndCheck(
  servers: Servers,
  activityId: string,
  timeoutMs = 120_000,
): Promise<Recovery> {
  const redis = redisOf(servers, { maxRetriesPerRequest: 3 });
  registerScripts(redis);
  const sql = new pg.Pool({ connectionString: servers.databaseUrl, max: 2 });
  try {
    const deadline = Date.now() + timeoutMs;
    let drained = false;
    while (Date.now() < deadline) {
      try {
        // Every outbox and ledger of the activity (its stock buckets' too).
        const [outbox, ledger] = await Promise.all([
          readOutbox(redis, activityId),
          countUnconfirmed(redis, activityId, Number.MAX_SAFE_INTEGER),
        ]);
        if (outbox.halfMessages === 0 && ledger === 0) {
          drained = true;
          break;
        }
      } catch {
        // a server is still coming back
      }
      await sleep(300);
    }
    return { violations: await checkActivity(redis, sql, activityId), drained };
  } finally {
    redis.disconnect();
    await sql.end();
  }
}

/** What a sale run ended with: endSale's verdict. */
export interface SaleEnd {
  /** The invariants after the drain, every answer against the orders, and any 500 logged. */
  violations: Violation[];
  got: AnswersToOrders;
  /** Every role death (`role (signal or code)`); empty when no role died. */
  deaths: string[];
  /** The roles' last output, for a failure's message. */
  roleOutput: string;
}

/**
 * Ends a sale run whose load has stopped: waits (bounded) for the drain, stops the roles, checks
 * the invariants and every buyer's answer against the orders in PostgreSQL.
 */
export async function endSale(
  s: Sale,
  servers: Servers,
  activityId: string,
  sql: pg.Pool,
  answers: readonly BuyerAnswer[],
  o: { drainMs: number; log?: { violations: () => Violation[] } },
): Promise<SaleEnd> {
  const rec = await recoverAndCheck(servers, activityId, o.drainMs);
  const roleOutput = s.output();
  await s.stop();
  const got = await answersToOrders(sql, activityId, answers);
  return {
    violations: [...rec.violations, ...(o.log?.violations() ?? []), ...got.violations],
    got,
    deaths: s.deaths.map((d) => `${d.role} (${d.signal ?? d.code})`),
    roleOutput,
  };
}

/** A small seeded PRNG (mulberry32) so any randomized run replays exactly from its seed. */
export function prng(seed: number): { next: () => number; int: (lo: number, hi: number) => number } {
  let a = seed >>> 0;
  const next = (): number => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return { next, int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)) };
}
