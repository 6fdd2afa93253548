/**
 * The operator's entry point: `node dist/operator/main.js`. Configured by environment variables
 * (operator/config.ts, docs/operator.md). Serves /healthz, /readyz and /metrics on HTTP_PORT at
 * once; reconciles only while it holds the leader Lease; on SIGTERM/SIGINT it stops the workers,
 * releases the Lease (so a standby takes over at once) and closes its connections, each waited for
 * a bounded time (controller/shutdown.ts) so that a server that does not answer cannot hold it.
 */
import {
  AppsV1Api,
  PolicyV1Api,
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  KubeConfig,
} from '@kubernetes/client-node';
import { createRedis, describeRedis, exitWhenRedisEnds, whenEndedForGood } from '../core/redis.js';
import { QUERY_TIMEOUT_MS, createPool } from '../core/db/pool.js';
import { createLogger, redactUrl } from '../core/logger.js';
import { createOperatorMetrics } from '../core/metrics.js';
import { loadOperatorConfig } from './config.js';
import { Controller } from './controller/controller.js';
import { startHealthServer } from './controller/health-server.js';
import { LeaderElector } from './controller/leader-election.js';
import { SHUTDOWN_TIMEOUT_MS, stopOperator } from './controller/shutdown.js';
import { ActivityClient } from './kube/activities.js';
import { EventRecorder } from './kube/events.js';
import { KafkaAdminAccess } from './reconcile/kafka-access.js';
import { Reconciler } from './reconcile/reconciler.js';

async function main(): Promise<void> {
  const config = loadOperatorConfig();
  const log = createLogger('operator', config.logLevel);
  log.info(
    {
      identity: config.identity,
      watchNamespaces: config.watchNamespaces.length > 0 ? config.watchNamespaces.join(',') : '(all)',
      lease: config.leaderElection.enabled
        ? `${config.leaderElection.namespace}/${config.leaderElection.name}`
        : '(leader election off)',
      database: redactUrl(config.databaseUrl),
      redis: describeRedis(config.redis),
      kafka: config.kafkaBrokers.join(','),
    },
    'starting flashsale operator',
  );

  const kc = new KubeConfig();
  kc.loadFromDefault();
  const activities = new ActivityClient(kc.makeApiClient(CustomObjectsApi));
  const apps = kc.makeApiClient(AppsV1Api);
  const policy = kc.makeApiClient(PolicyV1Api);
  const core = kc.makeApiClient(CoreV1Api);
  const metrics = createOperatorMetrics();
  // A server that does not answer (frozen, partitioned) fails the pass instead of holding it until
  // TCP gives up: counted in flashsale_reconcile_errors_total and retried with backoff.
  const redis = createRedis(config.redis, {
    maxRetriesPerRequest: 3,
    lazyConnect: false,
    commandTimeout: config.redisCommandTimeoutMs,
  });
  redis.on('error', (err: Error) => log.warn({ err: err.message }, 'redis connection error'));
  // A client that will never reconnect fails every pass that touches Redis while the operator
  // still holds its Lease: exit, as for a lost Lease, and start afresh.
  let stopping = false;
  const onRedisEnd = exitWhenRedisEnds(() => stopping, log);
  whenEndedForGood(redis, onRedisEnd, 'operator');
  const pool = createPool(config.databaseUrl, 4, 'flashsale-operator', {
    queryTimeoutMs: QUERY_TIMEOUT_MS,
  });
  pool.on('error', (err: Error) => log.warn({ err: err.message }, 'postgres pool error'));
  const kafka = new KafkaAdminAccess({
    brokers: config.kafkaBrokers,
    clientId: `flashsale-operator-${config.identity}`.slice(0, 200),
    topicPrefix: config.kafka.topicPrefix,
    partitions: config.kafka.partitions,
    replicationFactor: config.kafka.replicationFactor,
    minInsyncReplicas: config.kafka.minInsyncReplicas,
    logger: log,
  });

  // The controller's Deployment cache is read through this late-bound reference.
  const ref: { controller?: Controller } = {};
  const reconciler = new Reconciler({
    config,
    log,
    activities,
    apps,
    core,
    policy,
    events: new EventRecorder(core, config.identity, log),
    deployment: (ns, name) => ref.controller?.deployment(ns, name),
    redis,
    pool,
    kafka,
    metrics,
    identity: config.identity,
    now: () => new Date(),
  });
  const ctl = new Controller({
    kubeConfig: kc,
    activities,
    apps,
    reconciler,
    namespaces: config.watchNamespaces,
    workers: config.workers,
    relistMs: config.relistMs,
    retryBaseMs: config.retryBaseMs,
    retryMaxMs: config.retryMaxMs,
    metrics,
    log,
  });
  ref.controller = ctl;

  const elector = config.leaderElection.enabled
    ? new LeaderElector({
        api: kc.makeApiClient(CoordinationV1Api),
        namespace: config.leaderElection.namespace,
        name: config.leaderElection.name,
        identity: config.identity,
        leaseDurationMs: config.leaderElection.leaseDurationMs,
        renewDeadlineMs: config.leaderElection.renewDeadlineMs,
        retryPeriodMs: config.leaderElection.retryPeriodMs,
        log,
        onStartedLeading: () => {
          metrics.leader.set(1);
          ctl.start().catch((err: unknown) => {
            log.error({ err: String(err) }, 'controller failed to start');
            process.exit(1);
          });
        },
        onBlocked: (reason) => metrics.leaderElectionBlocked.set(reason ? 1 : 0),
        onStoppedLeading: () => {
          metrics.leader.set(0);
          // Lost while stopping (a renewal that missed its deadline during the stop's last passes):
          // the stop goes on and exits as it would; an exit 1 here would cut its passes short.
          if (stopping) {
            log.warn('lost the leader Lease while stopping');
            return;
          }
          // As controller-runtime does: a replica that lost the Lease exits and starts afresh.
          log.error('lost the leader Lease; exiting');
          process.exit(1);
        },
      })
    : undefined;

  const server = await startHealthServer(config.httpPort, metrics.registry, {
    notReady: async () => {
      if (redis.status !== 'ready') return `redis ${redis.status}`;
      // A standby is ready; a replica that can never lead is not (docs/operator.md "Operations").
      const blocked = elector?.blockedReason;
      if (blocked) return `cannot lead: ${blocked}`;
      if (ctl.isRunning && !ctl.synced) return 'informers not synced';
      return undefined;
    },
  });
  log.info({ port: config.httpPort }, 'serving /healthz /readyz /metrics');

  const shutdown = async (signal: string): Promise<void> => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'shutting down');
    const force = setTimeout(() => {
      log.error('shutdown timed out; exiting');
      process.exit(1);
    }, SHUTDOWN_TIMEOUT_MS);
    force.unref();
    // The Lease stays renewed while the passes in flight finish; released (not left to expire)
    // right after them, so a standby takes over at once and never beside one of them.
    await stopOperator({
      stopPasses: () => ctl.stop(),
      releaseLease: async () => elector?.release(),
      connections: [
        { name: 'kafka', close: () => kafka.close() },
        { name: 'postgres', close: () => pool.end() },
        { name: 'redis', close: () => redis.quit(), abandon: () => redis.disconnect() },
      ],
      log,
    });
    metrics.leader.set(0);
    server.close();
    log.info('stopped');
    process.exit(0);
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));

  if (elector) {
    void elector.run();
  } else {
    metrics.leader.set(1);
    await ctl.start();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(
    `flashsale operator failed to start: ${err instanceof Error ? err.message : String(err)}\n`,
  );
  process.exit(1);
});
