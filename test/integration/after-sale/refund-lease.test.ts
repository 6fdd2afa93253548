// The refund worker's lease (docs/after-sale.md "Refunds", "Retries"): the claim of a refund is
// the lease of its provider call, so no other worker sends the same refund while its call may be
// in flight. Two workers run side by side as in production (the activity's jobs worker and the
// platform after-sale worker, each looping like its cron with noOverlap) over 20 pending refunds,
// on the real PostgreSQL, with the built-in provider against the fake provider's HTTP server,
// slowed down so that 20 calls in a row outlast one lease. Claiming the whole batch at once
// leased every row from the same instant: calls later in the batch started after their lease had
// run out, while the other worker had claimed and was calling the same refund id.
import { journalFor } from '../../../core/db/journal-store.js';
import { findOrderById } from '../../../core/db/orders-store.js';
import { refundsForOrder } from '../../../core/db/refunds-store.js';
import type { RefundProvider } from '../../../core/payment-provider.js';
import { runRefundWorker } from '../../../runtime/jobs/refunds.js';
import type { RefundWorkerDeps } from '../../../runtime/jobs/refunds.js';
import { startFakeProvider } from '../../../dev/fake-provider.js';
import type { FakeProvider } from '../../../dev/fake-provider.js';
import {
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
  type Api,
  type Fixture,
} from './fixture.js';

const REFUNDS = 20;
/** The call timeout: the lease of a first attempt is timeout + 1 s = 3 s (backoff 1..2 s is shorter). */
const PROVIDER_TIMEOUT_MS = 2000;
/** How long the provider takes per call: 20 calls in a row (10 s) outlast a lease three times. */
const CALL_MS = 500;

describe('refund worker lease: two workers side by side never send one refund concurrently', () => {
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
    'every call starts and ends within its lease: no refund id in flight twice, each refunded once',
    async () => {
      const { activityId, skuId } = await openActivity(f.redis, { stock: REFUNDS, price: '19.90' });
      const users = Array.from({ length: REFUNDS }, (_, i) => `lease-${i}`);
      const rids = await reserveFor(f.redis, activityId, skuId, users);
      const ids = await materialize(f.pool, f.redis, activityId, rids);
      const orders = rids.map((rid, i) => ({
        reservationId: rid,
        orderId: ids.get(rid)!,
        userId: users[i]!,
      }));
      for (const [i, o] of orders.entries()) {
        const paid = await notify(api, {
          orderId: o.orderId,
          tradeNo: `LT${process.pid}x${i}`,
          amount: '19.90',
        });
        expect(paid.body.outcome).toBe('PAID');
        const asked = await buyerCall(
          api,
          'POST',
          `/v1/activities/${activityId}/orders/${o.reservationId}/refund`,
          o.userId,
          {},
        );
        expect(asked.status).toBe(202);
      }
      expect(
        await countRows(
          f.pool,
          `SELECT count(*) AS n FROM refunds WHERE activity_id = $1 AND state = 'PENDING'`,
          [activityId],
        ),
      ).toBe(REFUNDS);

      // The built-in provider against the fake provider's server, answering after CALL_MS; every
      // call is recorded with the worker that made it.
      const inFlight = new Map<string, string>();
      const overlaps: string[] = [];
      const calls = new Map<string, number>();
      const slow = (worker: string): RefundProvider => {
        const real = testProvider(fake.refundUrl, PROVIDER_TIMEOUT_MS);
        return {
          name: real.name,
          verifyRefund: (req) => real.verifyRefund(req),
          acknowledge: (outcome) => real.acknowledge(outcome),
          refund: async (req) => {
            const other = inFlight.get(req.refundId);
            if (other !== undefined) overlaps.push(`${req.refundId}: ${worker} while ${other}`);
            inFlight.set(req.refundId, worker);
            calls.set(req.refundId, (calls.get(req.refundId) ?? 0) + 1);
            try {
              await new Promise((r) => setTimeout(r, CALL_MS));
              return await real.refund(req);
            } finally {
              if (inFlight.get(req.refundId) === worker) inFlight.delete(req.refundId);
            }
          },
        };
      };
      const workerFor = (name: string, activity: string | undefined): RefundWorkerDeps => ({
        cfg: {
          REFUND_WORKER_CRON: '* * * * * *',
          REFUND_BATCH_SIZE: 50,
          REFUND_RETRY_BASE_SECONDS: 1,
          REFUND_RETRY_MAX_SECONDS: 2,
          REFUND_PROVIDER_TIMEOUT_MS: PROVIDER_TIMEOUT_MS,
        },
        activityId: activity,
        pool: f.pool,
        logger: f.logger,
        metrics: f.metrics,
        providers: [slow(name)],
      });
      const refunded = () =>
        countRows(f.pool, `SELECT count(*) AS n FROM orders WHERE activity_id = $1 AND status = 'REFUNDED'`, [
          activityId,
        ]);
      // Each worker runs again as soon as its run ends (cron with noOverlap), until all are refunded.
      const deadline = Date.now() + 25_000;
      const loop = async (w: RefundWorkerDeps): Promise<void> => {
        while ((await refunded()) < REFUNDS && Date.now() < deadline) {
          await runRefundWorker(w);
          await new Promise((r) => setTimeout(r, 50));
        }
      };
      await Promise.all([loop(workerFor('activity', activityId)), loop(workerFor('platform', undefined))]);

      expect(overlaps).toEqual([]);
      expect(await refunded()).toBe(REFUNDS);
      for (const o of orders) {
        expect((await findOrderById(f.pool, o.orderId))?.status).toBe('REFUNDED');
        const rows = await refundsForOrder(f.pool, o.orderId);
        expect(rows.map((r) => r.state)).toEqual(['SUCCEEDED']);
        const refundId = rows[0]!.refundId;
        expect(calls.get(refundId)).toBeGreaterThanOrEqual(1);
        expect([...fake.executed.values()].filter((e) => e.orderId === o.orderId)).toEqual([
          expect.objectContaining({ refundId }),
        ]);
        const journal = (await journalFor(f.pool, o.reservationId)).map((j) => j.event);
        expect(journal.filter((e) => e === 'ORDER_REFUNDED')).toHaveLength(1);
      }
    },
    TIMEOUT_MS,
  );
});
