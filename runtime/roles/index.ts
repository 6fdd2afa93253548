/**
 * One start function per role, each composed of the role parts in this directory and returning
 * its closers in one list (roles/process.ts runs them stage by stage: HTTP, in-flight work, jobs,
 * clients). `all` is the composition of api, relay, consumer and jobs in one process.
 *
 * Start order within a role: the HTTP servers listen first (a relay or consumer waiting for its
 * activity's topics answers /readyz with 503 and why), then the work starts; the process is ready
 * once every part has started.
 */
import type { Role, RoleConfig, ROLE_NEEDS } from '../config.js';
import { startAfterSaleWork } from './after-sale.js';
import { startApi } from './api.js';
import { startConsumer } from './consumer.js';
import { startJobs } from './jobs.js';
import { serveHttp, waitForActivityTopics } from './process.js';
import type { Closer, DatabaseClient, KafkaClient, RoleContext } from './process.js';
import { sampleRelayGauges, startRelays } from './relay.js';

/** The connections a role is given: exactly those ROLE_NEEDS names. */
export type ClientsOf<R extends Role> = ((typeof ROLE_NEEDS)[R]['database'] extends true
  ? DatabaseClient
  : unknown) &
  ((typeof ROLE_NEEDS)[R]['kafka'] extends true ? KafkaClient : unknown);

export type RoleStart<R extends Role> = (
  ctx: RoleContext,
  cfg: RoleConfig<R>,
  clients: ClientsOf<R>,
) => Promise<Closer[]>;

const probeRedis = (ctx: RoleContext): void => ctx.readiness.probe('redis', () => ctx.redis.ping());
const probePostgres = (ctx: RoleContext, { pool }: DatabaseClient): void =>
  ctx.readiness.probe('postgres', () => pool.query('SELECT 1'));

export const START_ROLE: { [R in Role]: RoleStart<R> } = {
  api: async (ctx, cfg, clients) => {
    probeRedis(ctx);
    const api = await startApi(ctx, cfg, clients);
    return [...(await serveHttp(ctx, cfg, api.app)), ...api.closers];
  },

  relay: async (ctx, cfg, clients) => {
    probeRedis(ctx);
    const http = await serveHttp(ctx, cfg);
    const topics = await waitForActivityTopics(ctx, clients.kafka, cfg, { dlq: false });
    const { relays, closers } = await startRelays(ctx, cfg, clients, topics);
    return [...http, ...closers, ...relays.slice(0, 1).map(sampleRelayGauges)];
  },

  consumer: async (ctx, cfg, clients) => {
    probeRedis(ctx);
    probePostgres(ctx, clients);
    const http = await serveHttp(ctx, cfg);
    const topics = await waitForActivityTopics(ctx, clients.kafka, cfg, { dlq: true });
    const consumer = startConsumer(ctx, cfg, clients, topics);
    const jobs = cfg.JOBS_IN_CONSUMER ? await startJobs(ctx, cfg, clients) : [];
    await consumer.started;
    return [...http, ...consumer.closers, ...jobs];
  },

  jobs: async (ctx, cfg, clients) => {
    probeRedis(ctx);
    probePostgres(ctx, clients);
    const http = await serveHttp(ctx, cfg);
    return [...http, ...(await startJobs(ctx, cfg, clients))];
  },

  'after-sale': async (ctx, cfg, clients) => {
    // Ready on PostgreSQL alone: this role serves every sale long after `Completed`, when PostgreSQL
    // holds everything (payments, refunds, buyers' answers). A Redis outage then must not take it
    // out of its Service; what a live sale still needs from Redis is refused per request (503).
    probePostgres(ctx, clients);
    const api = await startApi(ctx, cfg, clients);
    const http = await serveHttp(ctx, cfg, api.app);
    return [...http, ...api.closers, ...(await startAfterSaleWork(ctx, cfg, clients))];
  },

  all: async (ctx, cfg, clients) => {
    probeRedis(ctx);
    probePostgres(ctx, clients);
    const api = await startApi(ctx, cfg, clients);
    const http = await serveHttp(ctx, cfg, api.app);
    const topics = await waitForActivityTopics(ctx, clients.kafka, cfg, { dlq: true });
    const relay = await startRelays(ctx, cfg, clients, topics);
    const consumer = startConsumer(ctx, cfg, clients, topics);
    const jobs = await startJobs(ctx, cfg, clients);
    await consumer.started;
    return [...http, ...api.closers, ...relay.closers, ...consumer.closers, ...jobs];
  },
};
