// Orders outlive the sale (docs/after-sale.md "The after-sale tier"), end to end on the real API
// server, PostgreSQL, Redis and Kafka: a sale ends with unpaid orders; after the gate closed the
// activity waits in Settling while payment notifications arrive (one paid in time but notified
// after the timeout closed its order, one duplicate trade) and the rest are closed at their
// deadline with their stock returned to PostgreSQL; only then is it Completed and its runtime
// scaled to zero. The after-sale process is the one the chart declares: its Deployment and Secret
// are rendered with helm and `node dist/runtime/main.js after-sale` runs with that command and
// environment.
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import type { Pool } from '../../../core/db/pool.js';
import { readStockRows } from '../../../core/db/stock-store.js';
import { Phase } from '../../../operator/api/v1alpha1/types.js';
import { testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { sendPaymentNotification, startFakeProvider } from '../../../dev/fake-provider.js';
import type { FakeProvider } from '../../../dev/fake-provider.js';
import { JWT_SECRET, startRole, tokenFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import {
  at,
  findObject,
  helmBinary,
  parseManifests,
  renderChart,
} from '../../integration/chart/chart-helpers.js';
import {
  ROOT,
  activityBody,
  admin,
  createActivity,
  eventsOf,
  freePort,
  getActivity,
  startOperator,
  waitFor,
  waitForPhase,
} from '../../../dev/operator-harness.js';
import type { OperatorNamespace, OperatorProcess, Recorder } from '../../../dev/operator-harness.js';
import { operatorWorld } from './setup.js';
import type { OperatorWorld } from './setup.js';

const TIMEOUT_MS = 240_000;
const PAY_SECRET = 'settlement-e2e-provider-secret-0123456789';
const PAYMENT_TIMEOUT_SECONDS = 20;

interface EnvVar {
  name: string;
  value?: string;
}

/** The chart's after-sale container, rendered with this test's connection settings. */
/** The buyer tokens' issuer and audience the chart requires (runtime.jwt.issuer / audience). */
const TOKEN_CLAIMS = { issuer: 'https://login.shop.example/', audience: 'flashsale-buyers' };

function renderAfterSale(o: { databaseUrl: string; port: number; refundUrl: string }): {
  command: string[];
  env: Record<string, string>;
} {
  const env = testEnv();
  const objects = parseManifests(
    renderChart(
      helmBinary(),
      [],
      [
        `runtime.database.url=${o.databaseUrl}`,
        `runtime.redis.url=${env.redisUrl}`,
        `runtime.kafka.brokers={${env.kafkaBrokers.join(',')}}`,
        `runtime.jwt.hs256Secret=${JWT_SECRET}`,
        `runtime.jwt.issuer=${TOKEN_CLAIMS.issuer}`,
        `runtime.jwt.audience=${TOKEN_CLAIMS.audience}`,
        `runtime.payment.hmacSecret=${PAY_SECRET}`,
        `runtime.payment.refundUrl=${o.refundUrl}`,
        'runtime.payment.appId=fs-app',
        'runtime.payment.merchantId=fs-merchant',
        `runtime.httpPort=${o.port}`,
        // Short waits for a test: the sweeper every second, a 5 s payment-time tolerance.
        'afterSale.paymentSweepCron=*/1 * * * * *',
        'afterSale.stockSettleGraceSeconds=1',
        'afterSale.signatureToleranceSeconds=5',
        'afterSale.logLevel=warn',
        // The refund worker retries every second or two (the provider is down at first).
        'afterSale.extraEnv[0].name=REFUND_WORKER_CRON',
        'afterSale.extraEnv[0].value=* * * * * *',
        'afterSale.extraEnv[1].name=REFUND_RETRY_BASE_SECONDS',
        'afterSale.extraEnv[1].value=1',
        'afterSale.extraEnv[2].name=REFUND_RETRY_MAX_SECONDS',
        'afterSale.extraEnv[2].value=2',
      ],
    ),
  );
  const deployment = findObject(objects, 'Deployment', '-after-sale');
  const container = at(deployment, 'spec.template.spec.containers.0') as {
    command: string[];
    args: string[];
    env: EnvVar[];
    envFrom: { secretRef: { name: string } }[];
  };
  const secretName = container.envFrom[0]!.secretRef.name;
  const secret = objects.find((x) => x.kind === 'Secret' && x.metadata.name === secretName);
  const fromSecret = (secret?.stringData ?? {}) as Record<string, string>;
  const fromEnv = Object.fromEntries(container.env.map((e) => [e.name, String(e.value ?? '')]));
  return { command: [...container.command, ...container.args], env: { ...fromSecret, ...fromEnv } };
}

describe('operator + after-sale role: an activity is Completed only once its orders are settled', () => {
  const a = admin();
  let world: OperatorWorld | undefined;
  let db: FreshDatabase;
  let pg: Pool;
  let ns: OperatorNamespace;
  let operator: OperatorProcess | undefined;
  let sale: RoleProcess | undefined;
  let afterSale: ChildProcess | undefined;
  let afterSaleOut = '';
  let recorder: Recorder;
  let provider: FakeProvider | undefined;
  const activityId = uniqueId('settle');
  const name = 'singles-day';

  beforeAll(async () => {
    world = await operatorWorld(a, { namespace: 'op-settle', topicsOf: [activityId] });
    ({ db, pg, ns, recorder } = world);
    // The sale's own roles as one local process (no kubelet here), with the payment window the
    // activity declares (spec.payment.timeout, checked against the operator's Deployment below).
    [sale, operator] = await Promise.all([
      startRole('all', {
        activityId,
        databaseUrl: db.url,
        env: { PAYMENT_TIMEOUT_SECONDS: String(PAYMENT_TIMEOUT_SECONDS) },
      }),
      startOperator({ ns, databaseUrl: db.url, env: { SETTLE_CHECK_SECONDS: '1' } }),
    ]);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await provider?.close();
    await sale?.stop();
    if (afterSale && afterSale.exitCode === null) {
      afterSale.kill('SIGTERM');
      await new Promise((r) => afterSale?.once('exit', r));
    }
    await operator?.kill('SIGTERM');
    await world?.close();
  }, TIMEOUT_MS);

  it(
    'Settling until every order is PAID, CLOSED with its stock returned, or refunded; late in-time payment applied; then Completed and scaled to zero',
    async () => {
      const t0 = Date.now();
      const startAt = new Date(t0 + 10_000);
      const endAt = new Date(startAt.getTime() + 8_000);
      await createActivity(
        a,
        activityBody(ns.namespace, name, {
          warmUpAt: new Date(t0 + 4_000),
          startAt,
          endAt,
          items: [{ skuId: 'tea', name: '明前龙井 250g', price: '88.00', stock: 10, limitPerUser: 1 }],
          extraSpec: { activityId, payment: { timeout: `${PAYMENT_TIMEOUT_SECONDS}s` } },
          replicas: {
            warmUp: { api: 1, relay: 1, consumer: 1 },
            active: { api: 1, relay: 1, consumer: 1 },
            draining: { api: 1, relay: 1, consumer: 1 },
          },
        }),
      );
      await waitForPhase(a, ns.namespace, name, Phase.Active, 90_000);
      const buyers = ['paid-now', 'dup-trade', 'late-in-time', 'times-out-1', 'times-out-2', 'times-out-3'];
      for (const b of buyers) {
        const r = await fetch(`${sale!.url}/v1/activities/${activityId}/orders`, {
          method: 'POST',
          headers: { authorization: `Bearer ${await tokenFor(b)}`, 'content-type': 'application/json' },
          body: JSON.stringify({ skuId: 'tea', quantity: 1, requestId: `req-${b}` }),
        });
        expect(r.status).toBe(202);
      }
      const orderOf = new Map<string, { id: string; expiresAt: Date }>();
      await waitFor('six orders in PostgreSQL', async () => {
        const r = await pg.query<{ user_id: string; id: string; expires_at: Date }>(
          `SELECT user_id, id, expires_at FROM orders WHERE activity_id = $1`,
          [activityId],
        );
        for (const row of r.rows) orderOf.set(row.user_id, { id: row.id, expiresAt: row.expires_at });
        return r.rows.length === buyers.length;
      });

      // The sale ends with six unpaid orders: Settling, not Completed.
      const settling = await waitForPhase(a, ns.namespace, name, Phase.Settling, 90_000);
      expect(settling.status?.settlement).toMatchObject({ unpaid: 6, unsettled: 6 });
      expect(settling.status?.timestamps?.cleaningUp).toBeDefined();
      const consumerDeployment = await a.apps.readNamespacedDeployment({
        name: `${name}-consumer`,
        namespace: ns.namespace,
      });
      const declared = Object.fromEntries(
        (consumerDeployment.spec?.template.spec?.containers[0]?.env ?? []).map((e) => [e.name, e.value]),
      );
      expect(declared.PAYMENT_TIMEOUT_SECONDS).toBe(String(PAYMENT_TIMEOUT_SECONDS));

      // From here on only the platform after-sale role runs (the activity's own pods may be gone).
      await sale!.stop();
      sale = undefined;
      const port = await freePort();
      // The payment provider, down at first: the duplicate trade's refund is retried until it is up.
      provider = await startFakeProvider({ secret: PAY_SECRET });
      provider.mode = 'fail';
      const declaredAfterSale = renderAfterSale({ databaseUrl: db.url, port, refundUrl: provider.refundUrl });
      expect(declaredAfterSale.command.slice(1)).toEqual(['dist/runtime/main.js', 'after-sale']);
      expect(declaredAfterSale.env).not.toHaveProperty('ACTIVITY_ID');
      afterSale = spawn(process.execPath, declaredAfterSale.command.slice(1), {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH,
          HOME: process.env.HOME,
          ...declaredAfterSale.env,
          HTTP_HOST: '127.0.0.1',
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      const keep = (b: Buffer): void => {
        afterSaleOut = (afterSaleOut + b.toString('utf8')).slice(-20_000);
      };
      afterSale.stdout?.on('data', keep);
      afterSale.stderr?.on('data', keep);
      const url = `http://127.0.0.1:${port}`;
      await waitFor('after-sale role ready', async () => {
        if (afterSale?.exitCode !== null) throw new Error(`after-sale exited:\n${afterSaleOut}`);
        const r = await fetch(`${url}/readyz`).catch(() => undefined);
        return r?.status === 200;
      });

      const notify = async (
        orderId: string,
        tradeNo: string,
        paidAt: Date,
      ): Promise<Record<string, unknown>> => {
        const r = await sendPaymentNotification(url, PAY_SECRET, {
          appId: 'fs-app',
          merchantId: 'fs-merchant',
          orderId,
          tradeNo,
          amount: '88.00',
          paidAt,
        });
        expect(r.status).toBe(200);
        return r.json;
      };
      const paidNow = orderOf.get('paid-now')!;
      const dup = orderOf.get('dup-trade')!;
      const late = orderOf.get('late-in-time')!;
      // Paid within the window (gmt_payment before the deadline, and not after the signature).
      const inTime = (o: { expiresAt: Date }): Date =>
        new Date(Math.min(Date.now(), o.expiresAt.getTime() - 2_000));
      expect((await notify(paidNow.id, 'trade-paid-now', inTime(paidNow))).outcome).toBe('PAID');
      expect((await notify(dup.id, 'trade-dup-1', inTime(dup))).outcome).toBe('PAID');
      expect((await notify(dup.id, 'trade-dup-2', inTime(dup))).outcome).toBe('REFUND_PENDING');

      // The after-sale sweeper closes the other four at their deadline, stock back to PostgreSQL.
      await waitFor(
        'the four unpaid orders closed with their stock returned to PostgreSQL',
        async () => {
          const r = await pg.query<{ n: string }>(
            `SELECT count(*)::text AS n FROM orders WHERE activity_id = $1 AND status = 'CLOSED'
                AND close_reason = 'PAYMENT_TIMEOUT' AND stock_return_via = 'postgres'`,
            [activityId],
          );
          return r.rows[0]?.n === '4';
        },
        90_000,
      );
      // The notification of a payment made in time arrives after the close: paid after all.
      expect((await notify(late.id, 'trade-late', inTime(late))).outcome).toBe('PAID');
      const stock = await readStockRows(pg, activityId);
      expect(stock).toEqual([{ skuId: 'tea', initial: 10, remaining: 10 - 3 }]);

      // Every order is settled, but the duplicate trade's money is still to be refunded.
      const waiting = await waitFor('settlement figures', async () => {
        const fsa = await getActivity(a, ns.namespace, name);
        const s = fsa?.status?.settlement;
        return s?.unpaid === 0 && s.closedUnsettled === 0 && s.paid === 3 ? fsa : undefined;
      });
      expect(waiting.status?.phase).toBe(Phase.Settling);
      expect(waiting.status?.settlement).toMatchObject({
        unpaid: 0,
        paid: 3,
        closed: 3,
        closedUnsettled: 0,
        refundPending: 1,
        unsettled: 1,
      });
      // The test environment's kubectl (test/env/build-kube.sh), else the one on PATH: never skipped.
      const kubectl = testEnv().kubectl ?? 'kubectl';
      const out = spawnSync(kubectl, ['get', 'fsa', '-n', ns.namespace], {
        encoding: 'utf8',
        env: { ...process.env, KUBECONFIG: testEnv().kubeconfig },
      });
      expect(out.stdout.split('\n')[0]).toMatch(
        /PHASE\s+START\s+END\s+REMAINING\s+RUNTIME\s+ORDER-GAP\s+UNSETTLED\s+AGE/,
      );
      expect(out.stdout).toMatch(new RegExp(`${name}\\s+Settling\\s+\\S+\\s+\\S+\\s+7\\s+\\S+\\s+0\\s+1\\s`));

      // Nothing is scaled down while something is left to settle.
      for (const role of ['api', 'relay', 'consumer']) {
        const d = await a.apps.readNamespacedDeployment({ name: `${name}-${role}`, namespace: ns.namespace });
        expect([role, d.spec?.replicas]).toEqual([role, 1]);
      }

      // The provider is back: the refund worker returns the duplicate trade's money (the last
      // thing this activity waits for), exactly once.
      const down = provider;
      await waitFor('the refund worker tried the provider while it was down', async () =>
        down.calls.size > 0 ? true : undefined,
      );
      expect(down.executed.size).toBe(0);
      down.mode = 'ok';

      const done = await waitForPhase(a, ns.namespace, name, Phase.Completed, 60_000);
      expect(done.status?.settlement).toMatchObject({ unsettled: 0, paid: 3, closed: 3, refundPending: 0 });
      expect([...down.executed.values()].map((r) => r.tradeNo)).toEqual(['trade-dup-2']);
      expect(new Date(done.status?.timestamps?.completed ?? 0).getTime()).toBeGreaterThanOrEqual(
        new Date(done.status?.timestamps?.settling ?? 0).getTime(),
      );
      await waitFor('runtime scaled to zero after Completed', async () => {
        const list = await a.apps.listNamespacedDeployment({ namespace: ns.namespace });
        return list.items.length === 3 && list.items.every((d) => d.spec?.replicas === 0);
      });
      await recorder.sawPhase(name, Phase.Completed);
      await recorder.sawReplicas(`${name}-consumer`, 0);
      expect(recorder.phases.get(name)?.slice(-3)).toEqual([
        Phase.CleaningUp,
        Phase.Settling,
        Phase.Completed,
      ]);
      expect(recorder.replicas.get(`${name}-consumer`)).toEqual([0, 1, 0]);
      // Their order is the phases' above: Events carry whole seconds, so two in one second sort
      // either way.
      const reasons = (await eventsOf(a, ns.namespace, name)).map((e) => e.reason);
      expect(reasons).toEqual(expect.arrayContaining(['CleanedUp', 'Settled']));

      // After Completed the after-sale role still answers: a second payment goes to the refund
      // path, never a connection refused; buyers see their orders; a replay gets its order back;
      // a new submission is told the sale ended.
      const lateAnswer = await notify(paidNow.id, 'trade-paid-twice', inTime(paidNow));
      expect(lateAnswer.outcome).toBe('REFUND_PENDING');
      const buyer = async (user: string, method: string, path: string, body?: unknown) => {
        const r = await fetch(`${url}${path}`, {
          method,
          headers: {
            authorization: `Bearer ${await tokenFor(user, JWT_SECRET, TOKEN_CLAIMS)}`,
            ...(body ? { 'content-type': 'application/json' } : {}),
          },
          ...(body ? { body: JSON.stringify(body) } : {}),
        });
        return { status: r.status, body: (await r.json()) as Record<string, unknown> };
      };
      const view = await buyer(
        'late-in-time',
        'GET',
        `/v1/activities/${activityId}/orders?requestId=req-late-in-time`,
      );
      expect(view).toMatchObject({
        status: 200,
        body: { status: 'PAID', orderId: late.id, amount: '88.00' },
      });
      const closedView = await buyer(
        'times-out-2',
        'GET',
        `/v1/activities/${activityId}/orders?requestId=req-times-out-2`,
      );
      expect(closedView.body).toMatchObject({ status: 'CLOSED', reason: 'PAYMENT_TIMEOUT' });
      const replay = await buyer('paid-now', 'POST', `/v1/activities/${activityId}/orders`, {
        skuId: 'tea',
        quantity: 1,
        requestId: 'req-paid-now',
      });
      expect(replay).toMatchObject({
        status: 202,
        body: { status: 'PAID', orderId: paidNow.id, replayed: true },
      });
      const fresh = await buyer('newcomer', 'POST', `/v1/activities/${activityId}/orders`, {
        skuId: 'tea',
        quantity: 1,
        requestId: 'req-newcomer',
      });
      expect([fresh.status, fresh.body.code]).toEqual([409, 'ENDED']);
      expect(await readStockRows(pg, activityId)).toEqual([{ skuId: 'tea', initial: 10, remaining: 7 }]);
    },
    TIMEOUT_MS,
  );
});
