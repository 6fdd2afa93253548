// Refunds end to end on the real PostgreSQL, Redis and a fake provider that is a real HTTP server
// (dev/fake-provider.ts): a duplicate trade refunded automatically, a buyer's refund
// retried through a provider outage and a hanging provider, a provider that answers
// "processing" and then notifies, the buyer's view of money on its way back (refundPending), a
// refusal handled by the operator's command, and every bad input on the new endpoints answered
// with problem+json and no state change.
import { journalFor } from '../../../core/db/journal-store.js';
import { findOrderById } from '../../../core/db/orders-store.js';
import { paymentsForOrder } from '../../../core/db/payments-store.js';
import { refundsForOrder } from '../../../core/db/refunds-store.js';
import type { RefundRow } from '../../../core/db/refunds-store.js';
import { auditStock } from '../../../runtime/jobs/stock-audit.js';
import { runRefundWorker } from '../../../runtime/jobs/refunds.js';
import type { RefundWorkerDeps } from '../../../runtime/jobs/refunds.js';
import { signNotification } from '../../../runtime/payments/hmac-provider.js';
import { runRefundCli } from '../../../runtime/refund-cli.js';
import { runRuntimeCommand, runbookCommand } from '../../../dev/runbook.js';
import { refundNotificationBody, startFakeProvider } from '../../../dev/fake-provider.js';
import type { FakeProvider } from '../../../dev/fake-provider.js';
import {
  APP_ID,
  MERCHANT_ID,
  PAY_SECRET,
  TIMEOUT_MS,
  buyerCall,
  countRows,
  materialize,
  notify,
  openActivity,
  reserveFor,
  setUp,
  startApi,
  testProvider,
  until,
  type Api,
  type Fixture,
} from './fixture.js';

describe('refunds (worker, fake provider, buyer endpoint, notifications, operator command)', () => {
  let f: Fixture;
  let api: Api;
  let fake: FakeProvider;
  let worker: RefundWorkerDeps;
  let activityId: string;
  const orders: { orderId: string; reservationId: string; userId: string }[] = [];
  let next = 0;
  const nextOrder = () => orders[next++]!;
  let tradeSeq = 0;
  const tradeNo = () => `RT${process.pid}x${(tradeSeq += 1)}`;

  /** Pays the order with a fresh trade number through the real notification endpoint. */
  const pay = async (orderId: string, trade = tradeNo()): Promise<string> => {
    const r = await notify(api, { orderId, tradeNo: trade, amount: '19.90' });
    expect(r.status).toBe(200);
    return trade;
  };
  /** Runs the worker (as its cron would) until `done` holds; bounded, no timing assumptions. */
  const driveUntil = async <T>(what: string, done: () => Promise<T | undefined>): Promise<T> =>
    until(
      what,
      async () => {
        await runRefundWorker(worker);
        return done();
      },
      60_000,
    );
  /** flashsale_refunds_failed of the activity, as the refund worker last set it. */
  const failedGauge = async (): Promise<number | undefined> =>
    (await f.metrics.registry.getSingleMetric('flashsale_refunds_failed')?.get())?.values.find(
      (v) => v.labels.activity === activityId,
    )?.value;
  const refundOf = async (orderId: string, kind: RefundRow['kind']): Promise<RefundRow | undefined> =>
    (await refundsForOrder(f.pool, orderId)).find((r) => r.kind === kind);
  const snapshot = async () => ({
    orders: await countRows(f.pool, `SELECT count(*) AS n FROM orders WHERE status <> 'UNPAID'`),
    refunds: await countRows(f.pool, 'SELECT count(*) AS n FROM refunds'),
    refundStates: (
      await f.pool.query<{ s: string }>(
        `SELECT string_agg(refund_id || state || attempts, ',' ORDER BY refund_id) AS s FROM refunds`,
      )
    ).rows[0]?.s,
    payments: (
      await f.pool.query<{ s: string }>(
        `SELECT string_agg(trade_no || state, ',' ORDER BY trade_no) AS s FROM payments`,
      )
    ).rows[0]?.s,
    journal: await countRows(f.pool, 'SELECT count(*) AS n FROM order_journal'),
  });

  beforeAll(async () => {
    f = await setUp();
    let skuId: string;
    ({ activityId, skuId } = await openActivity(f.redis, { stock: 40, price: '19.90' }));
    const users = Array.from({ length: 24 }, (_, i) => `refunder-${i}`);
    const rids = await reserveFor(f.redis, activityId, skuId, users);
    const ids = await materialize(f.pool, f.redis, activityId, rids);
    rids.forEach((rid, i) => orders.push({ orderId: ids.get(rid)!, reservationId: rid, userId: users[i]! }));
    api = await startApi(f);
    fake = await startFakeProvider({ secret: PAY_SECRET });
    worker = {
      cfg: {
        REFUND_WORKER_CRON: '* * * * * *',
        REFUND_BATCH_SIZE: 50,
        REFUND_RETRY_BASE_SECONDS: 1,
        REFUND_RETRY_MAX_SECONDS: 2,
        REFUND_PROVIDER_TIMEOUT_MS: 1000,
      },
      activityId,
      pool: f.pool,
      logger: f.logger,
      metrics: f.metrics,
      providers: [testProvider(fake.refundUrl, 1000)],
    };
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.close();
    await fake?.close();
    await f?.close();
  }, TIMEOUT_MS);

  beforeEach(() => {
    fake.mode = 'ok';
  });

  it(
    'a duplicate trade is refunded through the provider: payment REFUND_PENDING -> REFUNDING -> REFUNDED, the order stays PAID',
    async () => {
      const { orderId, reservationId } = nextOrder();
      const first = await pay(orderId);
      const second = tradeNo();
      const dup = await notify(api, { orderId, tradeNo: second, amount: '19.90' });
      expect(dup).toEqual({ status: 200, body: { result: 'success', outcome: 'REFUND_PENDING' } });

      const refund = await driveUntil('the duplicate trade refunded', async () => {
        const r = await refundOf(orderId, 'PAYMENT');
        return r?.state === 'SUCCEEDED' ? r : undefined;
      });
      expect(refund).toMatchObject({ tradeNo: second, amount: '19.90', reason: 'PAID_BY_OTHER_TRADE' });
      expect(refund.refundId).toMatch(/^rf-[0-9a-f]{32}$/);
      const pays = await paymentsForOrder(f.pool, orderId);
      expect(pays.map((p) => [p.tradeNo, p.state]).sort()).toEqual(
        [
          [first, 'APPLIED'],
          [second, 'REFUNDED'],
        ].sort(),
      );
      expect((await findOrderById(f.pool, orderId))?.status).toBe('PAID');
      expect([...fake.executed.values()].filter((e) => e.tradeNo === second)).toEqual([
        expect.objectContaining({ refundId: refund.refundId, orderId, amount: '19.90' }),
      ]);
      expect(fake.calls.get(refund.refundId)).toBe(1);
      const events = (await journalFor(f.pool, reservationId)).map((j) => j.event);
      expect(events).toEqual(expect.arrayContaining(['PAYMENT_REFUNDING', 'PAYMENT_REFUNDED']));

      // The provider redelivers the duplicate: same answer, nothing changes, no second refund.
      const before = await snapshot();
      const again = await notify(api, { orderId, tradeNo: second, amount: '19.90' });
      expect(again).toEqual({ status: 200, body: { result: 'success', outcome: 'REFUND_PENDING' } });
      await runRefundWorker(worker);
      const after = await snapshot();
      expect({ ...after, journal: 0 }).toEqual({ ...before, journal: 0 });
      expect(fake.calls.get(refund.refundId)).toBe(1);
      const surplus = await f.metrics.registry.getSingleMetric('flashsale_surplus_payments_total')?.get();
      expect(surplus?.values).toContainEqual(
        expect.objectContaining({
          labels: { activity: activityId, reason: 'PAID_BY_OTHER_TRADE' },
          value: 1,
        }),
      );
    },
    TIMEOUT_MS,
  );

  it(
    'a buyer refund survives a provider outage and a hanging provider: retried with the same id, refunded once',
    async () => {
      const { orderId, reservationId, userId } = nextOrder();
      await pay(orderId);
      fake.mode = 'fail';
      const r = await buyerCall(
        api,
        'POST',
        `/v1/activities/${activityId}/orders/${reservationId}/refund`,
        userId,
        {
          reason: 'changed my mind',
        },
      );
      expect(r.status).toBe(202);
      expect(r.body).toMatchObject({ reservationId, orderId, status: 'REFUNDING', outcome: 'requested' });
      const refundId = String(r.body.refundId);
      expect((await findOrderById(f.pool, orderId))?.status).toBe('REFUNDING');

      // Down: 503 on every call; the refund stays PENDING and is retried with backoff.
      await driveUntil('three failed attempts', async () =>
        (fake.calls.get(refundId) ?? 0) >= 3 ? true : undefined,
      );
      let row = await refundOf(orderId, 'ORDER');
      expect(row).toMatchObject({ refundId, state: 'PENDING' });
      expect(row!.lastError).toMatch(/503/);
      expect(fake.executed.has(refundId)).toBe(false);

      // Hanging: the call times out and is retried later.
      fake.mode = 'hang';
      const hung = fake.calls.get(refundId)!;
      await driveUntil('a hanging attempt', async () =>
        (fake.calls.get(refundId) ?? 0) > hung ? true : undefined,
      );
      row = await refundOf(orderId, 'ORDER');
      expect(row?.state).toBe('PENDING');

      // Back: the next attempt succeeds; order REFUNDED; exactly one refund moved money.
      fake.mode = 'ok';
      await driveUntil('the order refunded', async () =>
        (await findOrderById(f.pool, orderId))?.status === 'REFUNDED' ? true : undefined,
      );
      row = await refundOf(orderId, 'ORDER');
      expect(row).toMatchObject({
        refundId,
        state: 'SUCCEEDED',
        reason: 'changed my mind',
        requestedBy: `buyer:${userId}`,
      });
      expect(row!.attempts).toBeGreaterThanOrEqual(5);
      expect([...fake.executed.values()].filter((e) => e.orderId === orderId)).toHaveLength(1);
      expect([...fake.calls.keys()].filter((id) => id === refundId)).toHaveLength(1);
      const pays = await paymentsForOrder(f.pool, orderId);
      expect(pays.map((p) => p.state)).toEqual(['APPLIED']);
      const journal = (await journalFor(f.pool, reservationId)).map((j) => [j.event, j.toStatus]);
      expect(journal).toEqual(
        expect.arrayContaining([
          ['ORDER_REFUNDING', 'REFUNDING'],
          ['ORDER_REFUNDED', 'REFUNDED'],
        ]),
      );
      const counted = await f.metrics.registry.getSingleMetric('flashsale_refunds_total')?.get();
      const value = (outcome: string) =>
        counted?.values.find((v) => v.labels.outcome === outcome && v.labels.activity === activityId)
          ?.value ?? 0;
      expect(value('retried')).toBeGreaterThanOrEqual(4);
      expect(value('succeeded')).toBeGreaterThanOrEqual(2);
    },
    TIMEOUT_MS,
  );

  it(
    'a provider that answers "processing" completes through a signed refund notification; replays change nothing',
    async () => {
      const { orderId, reservationId, userId } = nextOrder();
      const trade = await pay(orderId);
      fake.mode = 'processing';
      const r = await buyerCall(
        api,
        'POST',
        `/v1/activities/${activityId}/orders/${reservationId}/refund`,
        userId,
      );
      expect(r.status).toBe(202);
      const refundId = String(r.body.refundId);
      await driveUntil('a processing answer', async () =>
        (fake.calls.get(refundId) ?? 0) >= 1 ? true : undefined,
      );
      expect((await refundOf(orderId, 'ORDER'))?.state).toBe('PENDING');

      const body = refundNotificationBody({
        refundId,
        orderId,
        tradeNo: trade,
        amount: '19.9',
        appId: APP_ID,
        merchantId: MERCHANT_ID,
        refundNo: 'PR-1',
      });
      const post = (raw: string, signature: string | null) =>
        fetch(`${api.url}/v1/payments/hmac/refund-notifications`, {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            ...(signature !== null ? { 'x-fs-signature': signature } : {}),
          },
          body: raw,
        }).then(async (res) => ({
          status: res.status,
          type: res.headers.get('content-type') ?? '',
          body: (await res.json()) as Record<string, unknown>,
        }));
      const now = () => Math.floor(Date.now() / 1000);
      const ok = await post(body, signNotification(PAY_SECRET, body, now()));
      expect(ok).toMatchObject({ status: 200, body: { result: 'success', outcome: 'REFUNDED' } });
      expect((await findOrderById(f.pool, orderId))?.status).toBe('REFUNDED');
      expect(await refundOf(orderId, 'ORDER')).toMatchObject({
        state: 'SUCCEEDED',
        providerRefundNo: 'PR-1',
      });

      const before = await snapshot();
      // A replay inside the tolerance: acknowledged, nothing changes.
      const replay = await post(body, signNotification(PAY_SECRET, body, now()));
      expect(replay).toMatchObject({ status: 200, body: { outcome: 'ALREADY_REFUNDED' } });
      // A replay of an old signature, unsigned, wrong secret, malformed, wrong merchant, unknown
      // refund, wrong amount: problem+json with a stable code.
      const bad: [string, string | null, number, string][] = [
        [body, signNotification(PAY_SECRET, body, now() - 3600), 401, 'BAD_SIGNATURE'],
        [body, null, 401, 'BAD_SIGNATURE'],
        [
          body,
          signNotification('another-secret-another-secret-0123456789', body, now()),
          401,
          'BAD_SIGNATURE',
        ],
        ['{"app_id":', null, 401, 'BAD_SIGNATURE'],
        ['{"app_id":', signNotification(PAY_SECRET, '{"app_id":', now()), 400, 'VALIDATION_ERROR'],
        ...[
          { refund_amount: 19.9 },
          { out_refund_no: 'rf-nope' },
          { refund_amount: '-1' },
          { out_trade_no: '0' },
        ].map((patch): [string, string | null, number, string] => {
          const raw = JSON.stringify({ ...(JSON.parse(body) as object), ...patch });
          return [raw, signNotification(PAY_SECRET, raw, now()), 400, 'VALIDATION_ERROR'];
        }),
        ...[
          [{ merchant_id: 'other' }, 403, 'MERCHANT_MISMATCH'],
          [{ out_refund_no: `rf-${'0'.repeat(32)}` }, 404, 'UNKNOWN_REFUND'],
          [{ refund_amount: '1.00' }, 409, 'REFUND_CONFLICT'],
          [{ trade_no: 'OTHER' }, 409, 'REFUND_CONFLICT'],
          [{ refund_status: 'REFUND_FAILED' }, 409, 'REFUND_CONFLICT'],
        ].map(([patch, status, code]): [string, string | null, number, string] => {
          const raw = JSON.stringify({ ...(JSON.parse(body) as object), ...(patch as object) });
          return [raw, signNotification(PAY_SECRET, raw, now()), status as number, code as string];
        }),
      ];
      for (const [raw, sig, status, code] of bad) {
        const res = await post(raw, sig);
        expect([raw.slice(0, 60), res.status, res.type.split(';')[0], res.body.code]).toEqual([
          raw.slice(0, 60),
          status,
          'application/problem+json',
          code,
        ]);
      }
      const after = await snapshot();
      expect(after).toEqual(before);
      // The worker never calls the provider again for a completed refund.
      const calls = fake.calls.get(refundId);
      fake.mode = 'ok';
      await runRefundWorker(worker);
      expect(fake.calls.get(refundId)).toBe(calls);
    },
    TIMEOUT_MS,
  );

  it(
    'the buyer sees refundPending until the money is back: an UNPAID order paid the wrong amount, a second trade being refunded',
    async () => {
      const view = async (o: { reservationId: string; userId: string }) => {
        const r = await buyerCall(
          api,
          'GET',
          `/v1/activities/${activityId}/orders/${o.reservationId}`,
          o.userId,
        );
        expect(r.status).toBe(200);
        return r.body;
      };
      // A second trade for a paid order, and a wrong amount (the order stays UNPAID).
      const dup = nextOrder();
      await pay(dup.orderId);
      const second = tradeNo();
      expect((await notify(api, { orderId: dup.orderId, tradeNo: second, amount: '19.90' })).body).toEqual({
        result: 'success',
        outcome: 'REFUND_PENDING',
      });
      const wrong = nextOrder();
      const mismatch = tradeNo();
      expect((await notify(api, { orderId: wrong.orderId, tradeNo: mismatch, amount: '9.90' })).body).toEqual(
        { result: 'success', outcome: 'REFUND_PENDING' },
      );

      // One run of the worker takes both for refund (payments REFUNDING); the provider is down,
      // so the money is still on its way back.
      fake.mode = 'fail';
      const run = await runRefundWorker(worker);
      expect(run.enqueued).toBe(2);
      const stateOf = async (orderId: string, trade: string) =>
        (await paymentsForOrder(f.pool, orderId)).find((p) => p.tradeNo === trade)?.state;
      expect(await stateOf(dup.orderId, second)).toBe('REFUNDING');
      expect(await stateOf(wrong.orderId, mismatch)).toBe('REFUNDING');
      expect(await view(dup)).toMatchObject({ status: 'PAID', refundPending: { amount: '19.90', count: 1 } });
      expect(await view(wrong)).toMatchObject({
        status: 'UNPAID',
        refundPending: { amount: '9.90', count: 1 },
      });

      // Refunded: nothing is owed any more.
      fake.mode = 'ok';
      await driveUntil('both surplus payments refunded', async () =>
        (await stateOf(dup.orderId, second)) === 'REFUNDED' &&
        (await stateOf(wrong.orderId, mismatch)) === 'REFUNDED'
          ? true
          : undefined,
      );
      expect(await view(dup)).not.toHaveProperty('refundPending');
      expect(await view(wrong)).not.toHaveProperty('refundPending');
      expect((await view(wrong)).status).toBe('UNPAID');
    },
    TIMEOUT_MS,
  );

  it(
    'bad refund requests from buyers: problem+json with a stable code and no state change',
    async () => {
      const unpaid = nextOrder();
      const paid = nextOrder();
      await pay(paid.orderId);
      const refunded = nextOrder();
      await pay(refunded.orderId);
      const ok = await buyerCall(
        api,
        'POST',
        `/v1/activities/${activityId}/orders/${refunded.reservationId}/refund`,
        refunded.userId,
        {},
      );
      expect(ok.status).toBe(202);
      await driveUntil('refunded', async () =>
        (await findOrderById(f.pool, refunded.orderId))?.status === 'REFUNDED' ? true : undefined,
      );
      const path = (o: { reservationId: string }, activity = activityId) =>
        `/v1/activities/${activity}/orders/${o.reservationId}/refund`;
      const before = await snapshot();
      const cases: [
        string,
        () => Promise<{ status: number; body: Record<string, unknown> }>,
        number,
        string,
      ][] = [
        ['unpaid order', () => buyerCall(api, 'POST', path(unpaid), unpaid.userId, {}), 409, 'NOT_PAID'],
        [
          'refunded order',
          () => buyerCall(api, 'POST', path(refunded), refunded.userId, {}),
          409,
          'ALREADY_REFUNDED',
        ],
        [
          "someone else's order",
          () => buyerCall(api, 'POST', path(paid), unpaid.userId, {}),
          404,
          'UNKNOWN_RESERVATION',
        ],
        [
          'unknown reservation',
          () => buyerCall(api, 'POST', path({ reservationId: 'nope' }), paid.userId, {}),
          404,
          'UNKNOWN_RESERVATION',
        ],
        [
          'another activity',
          () => buyerCall(api, 'POST', path(paid, 'other-activity'), paid.userId, {}),
          404,
          'UNKNOWN_RESERVATION',
        ],
        [
          'bad reservation id',
          () => buyerCall(api, 'POST', path({ reservationId: 'a%20b' }), paid.userId, {}),
          400,
          'VALIDATION_ERROR',
        ],
        [
          'reason not a string',
          () => buyerCall(api, 'POST', path(paid), paid.userId, { reason: 5 }),
          400,
          'VALIDATION_ERROR',
        ],
        [
          'unknown field',
          () => buyerCall(api, 'POST', path(paid), paid.userId, { amount: '1.00' }),
          400,
          'VALIDATION_ERROR',
        ],
        [
          'reason too long',
          () => buyerCall(api, 'POST', path(paid), paid.userId, { reason: 'x'.repeat(201) }),
          400,
          'VALIDATION_ERROR',
        ],
        [
          'body is an array',
          () => buyerCall(api, 'POST', path(paid), paid.userId, []),
          400,
          'VALIDATION_ERROR',
        ],
        [
          'no token',
          () =>
            fetch(`${api.url}${path(paid)}`, {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: '{}',
            }).then(async (r) => ({ status: r.status, body: (await r.json()) as Record<string, unknown> })),
          401,
          'UNAUTHORIZED',
        ],
      ];
      for (const [name, call, status, code] of cases) {
        const r = await call();
        expect([name, r.status, r.body.code]).toEqual([name, status, code]);
      }
      expect(await snapshot()).toEqual(before);
      expect((await findOrderById(f.pool, paid.orderId))?.status).toBe('PAID');

      // A repeated request while REFUNDING answers the same refund (the first answer may be lost).
      fake.mode = 'fail';
      const first = await buyerCall(api, 'POST', path(paid), paid.userId, {});
      const second = await buyerCall(api, 'POST', path(paid), paid.userId, {});
      expect(first.status).toBe(202);
      expect(second).toEqual({ status: 202, body: { ...first.body, outcome: 'already-requested' } });
      expect(
        await countRows(f.pool, 'SELECT count(*) AS n FROM refunds WHERE order_id = $1', [paid.orderId]),
      ).toBe(1);
      fake.mode = 'ok';
      await driveUntil('the repeated request refunded', async () =>
        (await findOrderById(f.pool, paid.orderId))?.status === 'REFUNDED' ? true : undefined,
      );
    },
    TIMEOUT_MS,
  );

  it(
    'a refusal marks the refund FAILED for a human; the operator command retries it with the same id, and requests refunds',
    async () => {
      const lines: string[] = [];
      const errors: string[] = [];
      const cli = (...argv: string[]) =>
        runRefundCli(
          argv,
          { DATABASE_URL: f.db.url, LOG_LEVEL: 'silent' },
          (l) => lines.push(l),
          (t) => errors.push(t),
        );
      const o = nextOrder();
      await pay(o.orderId);
      fake.mode = 'refuse';
      expect(await cli('request', o.orderId, '--reason', 'customer service', '--by', 'alice')).toBe(0);
      expect((await findOrderById(f.pool, o.orderId))?.status).toBe('REFUNDING');
      const failed = await driveUntil('refused', async () => {
        const r = await refundOf(o.orderId, 'ORDER');
        return r?.state === 'FAILED' ? r : undefined;
      });
      expect(failed).toMatchObject({ requestedBy: 'operator:alice', reason: 'customer service' });
      expect(failed.lastError).toMatch(/not refundable/);
      expect((await findOrderById(f.pool, o.orderId))?.status).toBe('REFUNDING');
      expect((await journalFor(f.pool, o.reservationId)).map((j) => j.event)).toContain('REFUND_FAILED');
      // Owed until a human acts: every worker run counts it again (FlashSaleRefundFailed holds).
      await runRefundWorker(worker);
      await runRefundWorker(worker);
      expect(await failedGauge()).toBe(1);

      // docs/runbooks/FlashSaleRefundFailed.md's diagnosis and mitigation, as written there, with
      // the program's entry point (dev/runbook.ts); then FlashSaleRefundPendingTooLong.md's listing.
      const runbook = async (page: string, what: string): Promise<string[]> => {
        const args = runbookCommand(page, what, { ID: activityId, '<refundId>': failed.refundId });
        const r = await runRuntimeCommand(args, { DATABASE_URL: f.db.url, LOG_LEVEL: 'silent' });
        expect({ args, code: r.code, stderr: r.stderr }).toEqual({ args, code: 0, stderr: '' });
        return r.stdout.trimEnd().split('\n');
      };
      const listed = await runbook('FlashSaleRefundFailed.md', 'refund list --state FAILED');
      expect(listed[0]).toBe('1 refund(s)');
      expect(listed[1]).toContain(failed.refundId);
      expect(listed[1]).toMatch(/not refundable/); // the provider's message in the last column

      fake.mode = 'ok';
      expect(await runbook('FlashSaleRefundFailed.md', 'refund retry')).toEqual([
        `refund ${failed.refundId} is PENDING again; the worker sends it with the same id`,
      ]);
      expect((await runbook('FlashSaleRefundPendingTooLong.md', 'refund list --state PENDING'))[1]).toContain(
        `${failed.refundId}\tPENDING`,
      );
      expect(await cli('retry', failed.refundId)).toBe(1); // not FAILED any more
      await driveUntil('refunded after the retry', async () =>
        (await findOrderById(f.pool, o.orderId))?.status === 'REFUNDED' ? true : undefined,
      );
      expect([...fake.executed.values()].filter((e) => e.orderId === o.orderId)).toEqual([
        expect.objectContaining({ refundId: failed.refundId }),
      ]);
      expect(await failedGauge()).toBe(0);

      // Refused requests and usage errors: exit codes, nothing written.
      const before = await snapshot();
      const unpaid = nextOrder();
      expect(await cli('request', unpaid.orderId)).toBe(1);
      expect(await cli('request', o.orderId)).toBe(1);
      expect(await cli('request', '999999999')).toBe(1);
      expect(await cli('request', 'abc')).toBe(2);
      expect(await cli('retry', 'rf-x')).toBe(2);
      expect(await cli('frobnicate')).toBe(2);
      expect(errors.slice(-6).map((e) => e.split(/[:\n]/)[0])).toEqual([
        'NOT_PAID',
        'ALREADY_REFUNDED',
        'UNKNOWN_ORDER',
        'request takes an order id (digits)',
        'retry takes a refund id (rf-...)',
        'unknown command',
      ]);
      expect(await snapshot()).toEqual(before);
    },
    TIMEOUT_MS,
  );

  it(
    'reconciliation agrees with every refund above, and flags a refund state without its refund',
    async () => {
      const ok = await auditStock({ ...f.deps, activityId, remeasureDelayMs: 20 });
      expect(ok.mismatches).toEqual([]);
      expect(ok.figures).toMatchObject({ refundsSucceeded: expect.any(Number), refundsFailed: 0 });
      expect(Number(ok.figures.refundsSucceeded)).toBeGreaterThanOrEqual(5);
      // An order moved to REFUNDED by hand (no refund: no money went back) is reported.
      const o = nextOrder();
      await pay(o.orderId);
      await f.pool.query(`UPDATE orders SET status = 'REFUNDED' WHERE id = $1`, [o.orderId]);
      const bad = await auditStock({ ...f.deps, activityId, remeasureDelayMs: 20 });
      expect(bad.mismatches.map((m) => m.check)).toEqual(['order-refund-state-without-refund']);
    },
    TIMEOUT_MS,
  );

  it(
    'a refusal whose message PostgreSQL cannot store (a NUL, half a surrogate pair) still marks the refund FAILED, the text made storable',
    async () => {
      const o = nextOrder();
      await pay(o.orderId);
      fake.mode = 'refuse-garbled';
      try {
        const requested = await runRefundCli(
          ['request', o.orderId],
          { DATABASE_URL: f.db.url, LOG_LEVEL: 'silent' },
          () => undefined,
          () => undefined,
        );
        expect(requested).toBe(0);
        const failed = await driveUntil('refused', async () => {
          const r = await refundOf(o.orderId, 'ORDER');
          return r?.state === 'FAILED' ? r : undefined;
        });
        expect(failed.lastError).toBe('trade \ufffdnot refundable \ufffd');
        expect((await journalFor(f.pool, o.reservationId)).map((j) => j.event)).toContain('REFUND_FAILED');
      } finally {
        fake.mode = 'ok';
      }
    },
    TIMEOUT_MS,
  );
});
