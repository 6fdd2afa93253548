// The platform as local processes (docs/demo.md "Control plane", "Runtime"): the CRD and the
// operator's RBAC in a fresh namespace, the operator, and the runtime roles api, relay, consumer
// and after-sale (no kubelet runs the Pods the operator's Deployments create).
import type { ChildProcess } from 'node:child_process';
import { migrate } from '../../core/db/migrate.js';
import { createKafka, ensureTopics, topicsFor } from '../../core/kafka.js';
import type { FakeProvider } from '../../dev/fake-provider.js';
import { admin, installCrd, prepareNamespace, startOperator } from '../../dev/operator-harness.js';
import type { Admin, OperatorProcess } from '../../dev/operator-harness.js';
import { startRole, waitFor } from '../../dev/roles.js';
import type { RoleProcess } from '../../dev/roles.js';
import { say } from './display.js';
import type { Knobs } from './knobs.js';
import { providerEnv, startRefundProvider } from './payments.js';
import { started } from './servers.js';

export interface Platform {
  admin: Admin;
  operator: OperatorProcess;
  api: RoleProcess;
  afterSale: RoleProcess;
  /** The payment provider's refund endpoint (what it refunded is checked in the summary). */
  provider: FakeProvider;
}

const ROLES = ['api', 'relay', 'consumer', 'after-sale'] as const;

/**
 * Starts the roles alongside the operator, before the activity exists, because a Node process
 * takes seconds to start: the activity's id is chosen by the caller (spec.activityId) and its
 * topics are created here (the operator's warm-up finds them and goes on); the cache loading,
 * the gate and everything after stay the operator's.
 */
export async function startPlatform(k: Knobs, namespace: string, activityId: string): Promise<Platform> {
  const databaseUrl = process.env.DATABASE_URL ?? '';
  const a = admin();
  say(`installing the CRD, namespace ${namespace} with the operator's RBAC, migrating PostgreSQL`);
  await migrate(databaseUrl);
  const kafkaAdmin = createKafka((process.env.KAFKA_BROKERS ?? '').split(','), 'flashsale-demo').admin();
  await kafkaAdmin.connect();
  await ensureTopics(kafkaAdmin, topicsFor(activityId), 2, 1);
  await kafkaAdmin.disconnect();
  // Own readiness waits (the helpers' are sized for tests): a loaded machine can take minutes to
  // start four Node processes.
  const ready = async (what: string, probe: () => Promise<boolean>, proc: ChildProcess): Promise<void> => {
    await waitFor(
      what,
      async () => {
        if (proc.exitCode !== null || proc.signalCode !== null)
          throw new Error(`${what}: the process exited`);
        return probe();
      },
      k.starttimeout * 1000,
      250,
    );
  };
  const provider = await startRefundProvider();
  started.closers.push(() => provider.close());
  // A short payment window (spec.payment.timeout, the same PAYMENT_TIMEOUT_SECONDS the operator
  // gives its Deployments) and a sweeper every 2 s, so that the orders outlive the sale by seconds.
  const afterSaleEnv = {
    PAYMENT_TIMEOUT_SECONDS: String(Math.max(10, k.paywindow)),
    PAYMENT_SWEEP_CRON: '*/2 * * * * *',
    STOCK_SETTLE_GRACE_SECONDS: '2',
  };
  const roles = Promise.all(
    ROLES.map(async (role) => {
      const r = await startRole(role, {
        databaseUrl,
        waitReady: false,
        ...(role === 'api' || role === 'after-sale' ? {} : { activityId }),
        env: { ...afterSaleEnv, ...(role === 'after-sale' ? providerEnv(provider) : {}) },
      });
      started.roles.push(r);
      await ready(`${role} ready`, async () => (await fetch(`${r.url}/readyz`)).status === 200, r.proc);
      return r;
    }),
  );
  roles.catch(() => undefined);
  await installCrd(a);
  const ns = await prepareNamespace(namespace, a);
  say('starting the operator and the runtime roles (api, relay, consumer, after-sale) as local processes');
  const op = await startOperator({ ns, databaseUrl, waitFor: 'nothing' });
  started.operator = op;
  await ready(
    'operator leading',
    async () => op.records().some((r) => r.msg === 'controller started'),
    op.proc,
  );
  const [api, , , afterSale] = (await roles) as [RoleProcess, RoleProcess, RoleProcess, RoleProcess];
  say(
    `operator leading (metrics http://127.0.0.1:${op.port}/metrics); ` +
      started.roles.map((r) => `${r.role} ${r.url}`).join(', '),
  );
  return { admin: a, operator: op, api, afterSale, provider };
}
