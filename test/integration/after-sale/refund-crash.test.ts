// Failure window 15 (also a row of `make faults`): the refund worker (the real jobs role, a child
// process) is SIGKILLed between the provider's answer (the money moved) and its database write. The refund id was committed
// before the call, so the restarted worker sends the same id and the fake provider, which
// deduplicates by it like a real one, refunds exactly once.
import { ensureTopics, createKafka, topicsFor } from '../../../core/kafka.js';
import { findOrderById } from '../../../core/db/orders-store.js';
import { paymentsForOrder } from '../../../core/db/payments-store.js';
import { refundsForOrder } from '../../../core/db/refunds-store.js';
import { testEnv } from '../../../dev/servers.js';
import { startFakeProvider } from '../../../dev/fake-provider.js';
import type { FakeProvider } from '../../../dev/fake-provider.js';
import { startRole } from '../../../dev/roles.js';
import { recorded } from '../../faults/harness/results.js';
import {
  APP_ID,
  MERCHANT_ID,
  PAY_SECRET,
  TIMEOUT_MS,
  buyerCall,
  materialize,
  notify,
  openActivity,
  reserveFor,
  setUp,
  startApi,
  until,
  type Api,
  type Fixture,
} from './fixture.js';

describe('refund worker SIGKILLed between the provider answer and the database write', () => {
  let f: Fixture;
  let api: Api;
  let fake: FakeProvider;

  beforeAll(async () => {
    f = await setUp();
    api = await startApi(f);
    fake = await startFakeProvider({ secret: PAY_SECRET });
  }, TIMEOUT_MS);

  afterAll(async () => {
    await api?.close();
    await fake?.close();
    await f?.close();
  }, TIMEOUT_MS);

  it(
    'refunds exactly once: the retry sends the same refund id',
    () =>
      recorded('window 15', undefined, async () => {
        const { activityId, skuId } = await openActivity(f.redis, { stock: 10, price: '19.90' });
        const kafka = createKafka(testEnv().kafkaBrokers, `test-${activityId}`);
        const admin = kafka.admin();
        await admin.connect();
        await ensureTopics(admin, topicsFor(activityId), 1, 1);
        await admin.disconnect();
        const users = ['crash-a', 'crash-b'];
        const rids = await reserveFor(f.redis, activityId, skuId, users);
        const ids = await materialize(f.pool, f.redis, activityId, rids);
        const dupOrder = ids.get(rids[0]!)!;
        const buyerOrder = ids.get(rids[1]!)!;
        // A duplicate trade (surplus payment) and a buyer's refund of a paid order.
        expect((await notify(api, { orderId: dupOrder, tradeNo: 'CRASH-T1', amount: '19.90' })).status).toBe(
          200,
        );
        expect(
          (await notify(api, { orderId: dupOrder, tradeNo: 'CRASH-T2', amount: '19.90' })).body.outcome,
        ).toBe('REFUND_PENDING');
        expect(
          (await notify(api, { orderId: buyerOrder, tradeNo: 'CRASH-T3', amount: '19.90' })).status,
        ).toBe(200);
        const req = await buyerCall(
          api,
          'POST',
          `/v1/activities/${activityId}/orders/${rids[1]}/refund`,
          'crash-b',
          {},
        );
        expect(req.status).toBe(202);

        const env = {
          PAYMENT_HMAC_SECRET: PAY_SECRET,
          PAYMENT_HMAC_APP_ID: APP_ID,
          PAYMENT_HMAC_MERCHANT_ID: MERCHANT_ID,
          PAYMENT_HMAC_REFUND_URL: fake.refundUrl,
          REFUND_PROVIDER_TIMEOUT_MS: '1000',
          REFUND_RETRY_BASE_SECONDS: '1',
          REFUND_WORKER_CRON: '* * * * * *',
          RECONCILIATION_CRON: '0 0 0 1 1 *',
        };
        const doomed = await startRole('jobs', {
          activityId,
          databaseUrl: f.db.url,
          waitReady: false,
          env: { ...env, FLASHSALE_CRASH_POINT: 'refund-after-provider-answer' },
        });
        await doomed.exited;
        expect(doomed.proc.signalCode).toBe('SIGKILL');
        // The provider refunded one payment; our database does not know it yet.
        expect(fake.executed.size).toBe(1);
        const [done] = [...fake.executed.values()];
        expect(fake.calls.get(done!.refundId)).toBe(1);
        const all = [
          ...(await refundsForOrder(f.pool, dupOrder)),
          ...(await refundsForOrder(f.pool, buyerOrder)),
        ];
        expect(all.map((r) => r.state)).toEqual(['PENDING', 'PENDING']);

        const worker = await startRole('jobs', { activityId, databaseUrl: f.db.url, env });
        try {
          await until(
            'both refunds completed',
            async () => {
              const rows = [
                ...(await refundsForOrder(f.pool, dupOrder)),
                ...(await refundsForOrder(f.pool, buyerOrder)),
              ];
              return rows.length === 2 && rows.every((r) => r.state === 'SUCCEEDED') ? rows : undefined;
            },
            90_000,
          );
        } finally {
          expect(await worker.stop()).toBe(0);
        }
        // Exactly one refund per payment at the provider; the interrupted one was asked twice.
        expect(fake.executed.size).toBe(2);
        expect(fake.calls.get(done!.refundId)).toBe(2);
        expect([...fake.executed.values()].map((e) => e.tradeNo).sort()).toEqual(['CRASH-T2', 'CRASH-T3']);
        expect((await paymentsForOrder(f.pool, dupOrder)).map((p) => [p.tradeNo, p.state])).toEqual([
          ['CRASH-T1', 'APPLIED'],
          ['CRASH-T2', 'REFUNDED'],
        ]);
        expect((await findOrderById(f.pool, dupOrder))?.status).toBe('PAID');
        expect((await findOrderById(f.pool, buyerOrder))?.status).toBe('REFUNDED');
      }),
    TIMEOUT_MS,
  );
});
