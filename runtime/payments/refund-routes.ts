/**
 * The public refund-notification endpoint (no buyer token; authenticated by the provider's
 * signature, the same scheme as payment notifications): POST /v1/payments/{provider}/refund-notifications.
 *
 *   200  REFUNDED / ALREADY_REFUNDED / REFUND_FAILED / IGNORED is committed: stop retrying
 *   401  bad, missing or stale signature; 403 another merchant/app; 400 malformed (nothing written)
 *   404  UNKNOWN_REFUND; 409 REFUND_CONFLICT (the notification does not match the refund recorded
 *        under its id): nothing written, kept alive at the provider for a human
 *   503  transient failure: retry
 * A replay inside the signature tolerance is answered ALREADY_REFUNDED and changes nothing; an
 * older one is refused (401) like a payment notification.
 */
import express, { Router } from 'express';
import type { Request, Response } from 'express';
import { Decimal } from 'decimal.js';
import { isTransientDbError } from '../../core/db/pool.js';
import { findRefund } from '../../core/db/refunds-store.js';
import { FlashSaleError } from '../../core/errors.js';
import { completeRefund, failRefund } from '../../core/refunds.js';
import type { RefundDeps } from '../../core/refunds.js';
import type { RefundNotice, RefundProvider } from '../../core/payment-provider.js';

export interface RefundNotificationsDeps extends RefundDeps {
  providers: RefundProvider[];
  bodyLimit?: string;
}

export const REFUND_NOTIFICATION_PATH = '/v1/payments/:provider/refund-notifications';

async function applyRefundNotice(
  deps: RefundDeps,
  provider: string,
  notice: RefundNotice,
  traceId: string,
): Promise<string> {
  const refund = await findRefund(deps.pool, notice.refundId);
  if (!refund) throw new FlashSaleError('UNKNOWN_REFUND', `no refund ${notice.refundId}`);
  if (
    refund.provider !== provider ||
    refund.tradeNo !== notice.tradeNo ||
    refund.orderId !== notice.orderId ||
    !new Decimal(refund.amount).eq(notice.amount)
  ) {
    throw new FlashSaleError(
      'REFUND_CONFLICT',
      `refund ${notice.refundId} is recorded for another trade or amount`,
    );
  }
  if (notice.status === 'other') return 'IGNORED';
  if (notice.status === 'success') {
    const r = await completeRefund(deps, notice.refundId, notice, traceId);
    return r.outcome;
  }
  if (refund.state === 'SUCCEEDED') {
    throw new FlashSaleError('REFUND_CONFLICT', `refund ${notice.refundId} is recorded as succeeded`);
  }
  await failRefund(
    deps,
    notice.refundId,
    { providerStatus: notice.providerStatus, error: 'refund notification: failed' },
    traceId,
  );
  return 'REFUND_FAILED';
}

export function refundNotificationsRouter(deps: RefundNotificationsDeps): Router {
  const providers = new Map(deps.providers.map((p) => [p.name, p]));
  const router = Router();
  router.post(
    REFUND_NOTIFICATION_PATH,
    express.raw({ type: () => true, limit: deps.bodyLimit ?? '64kb' }),
    async (req: Request, res: Response) => {
      const provider = providers.get(String(req.params.provider));
      if (!provider) throw new FlashSaleError('NOT_FOUND', 'unknown payment provider');
      const traceId = res.locals.traceId as string;
      let notice: RefundNotice;
      try {
        notice = provider.verifyRefund({
          rawBody: Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0),
          headers: req.headers,
          now: new Date(),
        });
      } catch (err) {
        deps.logger.warn(
          { err: (err as Error).message, traceId, provider: provider.name },
          'refund notification refused',
        );
        throw err;
      }
      try {
        const outcome = await applyRefundNotice(deps, provider.name, notice, traceId);
        const ack = provider.acknowledge(outcome);
        res.status(200).type(ack.contentType).send(ack.body);
      } catch (err) {
        if (err instanceof FlashSaleError) throw err;
        if (isTransientDbError(err))
          throw new FlashSaleError('UNAVAILABLE', 'a dependency is unavailable; retry');
        throw err;
      }
    },
  );
  return router;
}
