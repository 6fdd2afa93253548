/**
 * The public payment-notification endpoint (no buyer token: notifications are authenticated by
 * the provider's signature): POST /v1/payments/{provider}/notifications.
 *
 * Answers so that the provider retries exactly when it should:
 *   200  the outcome (PAID, ALREADY_PAID, REFUND_PENDING, IGNORED) is committed: stop retrying
 *   401  bad or missing signature (nothing written); 403 another merchant/app (nothing written)
 *   400  signed but malformed; 404 unknown order; 409 trade number recorded for another
 *        order/amount: nothing written, the provider keeps the notification alive for a human
 *   503  transient failure (database or Redis): retry
 */
import express, { Router } from 'express';
import type { Request, Response } from 'express';
import { isTransientDbError } from '../../core/db/pool.js';
import { FlashSaleError } from '../../core/errors.js';
import { acceptPayment } from './apply.js';
import type { PaymentDeps } from './apply.js';
import type { PaymentProvider } from '../../core/payment-provider.js';

export interface PaymentsRouterDeps extends PaymentDeps {
  providers: PaymentProvider[];
  /** Largest notification body accepted. */
  bodyLimit?: string;
}

export const NOTIFICATION_PATH = '/v1/payments/:provider/notifications';

function transient(err: unknown): boolean {
  if (err instanceof FlashSaleError) return false;
  return (
    isTransientDbError(err) ||
    /ECONNREFUSED|ECONNRESET|Connection is closed|MaxRetriesPerRequest|timeout/i.test(
      (err as Error)?.message ?? '',
    )
  );
}

export function paymentsRouter(deps: PaymentsRouterDeps): Router {
  const providers = new Map(deps.providers.map((p) => [p.name, p]));
  const router = Router();
  router.post(
    NOTIFICATION_PATH,
    express.raw({ type: () => true, limit: deps.bodyLimit ?? '64kb' }),
    async (req: Request, res: Response) => {
      const provider = providers.get(String(req.params.provider));
      if (!provider) throw new FlashSaleError('NOT_FOUND', 'unknown payment provider');
      const count = (outcome: string) => deps.metrics?.payments.inc({ provider: provider.name, outcome });
      const traceId = res.locals.traceId as string;
      let notice;
      try {
        notice = provider.verify({
          rawBody: Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0),
          headers: req.headers,
          now: new Date(),
        });
      } catch (err) {
        count(`rejected_${err instanceof FlashSaleError ? err.code.toLowerCase() : 'error'}`);
        deps.logger.warn(
          { err: (err as Error).message, traceId, provider: provider.name },
          'notification refused',
        );
        throw err;
      }
      if (notice.status !== 'success') {
        count('IGNORED');
        const ack = provider.acknowledge('IGNORED');
        res.status(200).type(ack.contentType).send(ack.body);
        return;
      }
      try {
        const result = await acceptPayment(deps, provider.name, notice, traceId);
        count(result.outcome);
        const ack = provider.acknowledge(result.outcome);
        res.status(200).type(ack.contentType).send(ack.body);
      } catch (err) {
        if (err instanceof FlashSaleError) {
          count(`rejected_${err.code.toLowerCase()}`);
          throw err;
        }
        count('error');
        if (transient(err)) throw new FlashSaleError('UNAVAILABLE', 'a dependency is unavailable; retry');
        throw err;
      }
    },
  );
  return router;
}
