/** What every phase gets: configuration, servers, the measured core, and shared clients. */
import { randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import pg from 'pg';
import { recordActivityItems } from '../../core/db/activity-items-store.js';
import type { CatalogItem } from '../../core/model.js';
import type { BenchConfig, CoreModules, Servers } from './env.js';
import { log, mustRun } from './util.js';

export interface Ctx {
  cfg: BenchConfig;
  servers: Servers;
  core: CoreModules;
  /** The harness's own Redis connection (auto-pipelined: the bursts it makes are the load). */
  redis: Redis;
  pool: pg.Pool;
  /** Unique per run: activity ids, buyer ids and rows carry it, so runs never collide. */
  runId: string;
  secret: string;
  logDir: string;
  /** Activity ids and Kafka topics this run created (cleaned up on servers it does not own). */
  activities: Set<string>;
  topics: Set<string>;
}

export function openClients(servers: Servers): { redis: Redis; pool: pg.Pool } {
  return {
    redis: new Redis(servers.env.REDIS_URL!, { enableAutoPipelining: true, maxRetriesPerRequest: 3 }),
    pool: new pg.Pool({ connectionString: servers.env.DATABASE_URL!, max: 4 }),
  };
}

/** A run's context: its own clients, run id, token secret and log directory (<stateDir>/<logSubdir>). */
export function openContext(cfg: BenchConfig, servers: Servers, core: CoreModules, logSubdir: string): Ctx {
  const logDir = join(cfg.stateDir, logSubdir);
  mkdirSync(logDir, { recursive: true });
  return {
    cfg,
    servers,
    core,
    ...openClients(servers),
    runId: randomBytes(3).toString('hex'),
    secret: randomBytes(32).toString('hex'),
    logDir,
    activities: new Set(),
    topics: new Set(),
  };
}

/** The schema the api and openActivity() write to, applied by the runtime build under test. */
export async function migrateSchema(servers: Servers, distDir: string, luaDir: string): Promise<void> {
  await mustRun(process.execPath, [join(distDir, 'runtime', 'main.js'), 'migrate'], {
    env: { ...process.env, DATABASE_URL: servers.env.DATABASE_URL!, FLASHSALE_LUA_DIR: luaDir },
  });
}

export function benchItem(skuId: string, stock: number, name = `Bench item ${skuId}`): CatalogItem {
  return { skuId, name, price: '19.99', stock, limitPerUser: 1 };
}

/** Loads an activity whose sale window is open now and opens its gate. */
export async function openActivity(ctx: Ctx, activityId: string, items: CatalogItem[]): Promise<void> {
  ctx.activities.add(activityId);
  // Recorded as the operator does: the consumer checks every order against these rows.
  await recordActivityItems(ctx.pool, activityId, 1, items);
  await ctx.core.cache.loadActivity(ctx.redis, {
    id: activityId,
    generation: 1,
    startAt: new Date(Date.now() - 60_000),
    endAt: new Date(Date.now() + 6 * 3600_000),
    requireOrderCode: false,
    reopenOnRelease: false,
    items,
  });
  await ctx.core.cache.setGate(ctx.redis, activityId, 'open');
}

/** One field of an INFO reply (`<key>:<value>` lines), or undefined when it has none. */
export function infoField(info: string, key: string): string | undefined {
  return new RegExp(`^${key}:(\\S+)`, 'm').exec(info)?.[1];
}

/** CPU seconds (user + system, all threads) the Redis server has used so far (INFO cpu). */
export async function redisCpuS(ctx: Ctx): Promise<number> {
  const info = await ctx.redis.info('cpu');
  return Number(infoField(info, 'used_cpu_sys') ?? NaN) + Number(infoField(info, 'used_cpu_user') ?? NaN);
}

/**
 * Drops the keys of every activity the run has opened so far and logs what Redis holds after it.
 * The phases' sales leave their reservations, outbox and ledger behind (the submit sale alone takes
 * hundreds of thousands of reservations), and the run's Redis has the 2 GB maxmemory with
 * noeviction of test/env/start-redis.sh: kept, they filled it, and the later phases met OOM.
 */
export async function releaseActivities(ctx: Ctx, after: string): Promise<void> {
  let keys = 0;
  for (const a of ctx.activities) keys += await dropActivityKeys(ctx, a);
  ctx.activities.clear();
  const info = await ctx.redis.info('memory');
  const field = (k: string): string => infoField(info, k) ?? '?';
  log(
    `after ${after}: dropped ${keys} keys; Redis used_memory ${field('used_memory_human')} of maxmemory ${field('maxmemory_human')}`,
  );
}

/** Deletes every key of an activity (SCAN over its own prefix only, never a global pattern). */
export async function dropActivityKeys(ctx: Ctx, activityId: string): Promise<number> {
  const pattern = ctx.core.keys.activityKeys(activityId).scanPattern;
  let cursor = '0';
  let deleted = 0;
  do {
    const [next, keys] = await ctx.redis.scan(cursor, 'MATCH', pattern, 'COUNT', 20_000);
    cursor = next;
    if (keys.length > 0) deleted += await ctx.redis.unlink(...keys);
  } while (cursor !== '0');
  return deleted;
}
