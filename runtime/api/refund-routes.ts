/**
 * Buyer refund request (behind buyer authentication; docs/after-sale.md "Refunds"):
 *
 *   POST /v1/activities/{activityId}/orders/{reservationId}/refund   body: {} or {"reason": "..."}
 *
 * 202 { reservationId, orderId, refundId, status: "REFUNDING", outcome: requested | already-requested }
 * 409 NOT_PAID (unpaid or closed), 409 ALREADY_REFUNDED, 404 UNKNOWN_RESERVATION (unknown or
 * someone else's), 400 VALIDATION_ERROR. The refund worker then asks the provider; the order
 * becomes REFUNDED when the provider confirms. Stock is not returned (a refund is a money flow).
 */
import { Router } from 'express';
import type { Request, Response } from 'express';
import { z } from 'zod';
import { requestOrderRefund } from '../../core/refunds.js';
import type { RefundDeps } from '../../core/refunds.js';
import { parse, reservationParam, servedActivity, storableText } from './schemas.js';

export interface RefundRouteDeps extends RefundDeps {
  /** When set, this api serves only this activity. */
  activityId: string | undefined;
}

export const REFUND_PATH = '/v1/activities/:activityId/orders/:reservationId/refund';

const refundBody = z
  .object({
    // Stored in refunds.reason and in the journal's jsonb detail.
    reason: storableText(
      z
        .string()
        .min(1)
        .max(200)
        .refine(
          (v) => ![...v].some((ch) => ch.charCodeAt(0) < 0x20 || ch.charCodeAt(0) === 0x7f),
          'no control characters',
        ),
    ).optional(),
  })
  .strict();

export function refundRouter(deps: RefundRouteDeps): Router {
  const router = Router();
  router.post(REFUND_PATH, async (req: Request, res: Response) => {
    const activityId = servedActivity(req, deps.activityId);
    const reservationId = parse(reservationParam, req.params.reservationId);
    // No body (or an empty one) is an empty object; anything else must match the schema.
    const body = parse(refundBody, req.body === undefined ? {} : req.body);
    const userId = res.locals.userId as string;
    const r = await requestOrderRefund(deps, {
      reservationId,
      buyerId: userId,
      activityId,
      reason: body.reason ?? 'BUYER_REQUEST',
      requestedBy: `buyer:${userId}`,
      traceId: res.locals.traceId as string,
    });
    res.status(202).json({
      reservationId,
      orderId: r.order.id,
      refundId: r.refund.refundId,
      status: 'REFUNDING',
      outcome: r.outcome,
    });
  });
  return router;
}
