/**
 * Buyer cancellation (behind buyer authentication):
 *
 *   DELETE /v1/activities/{activityId}/orders/{reservationId}
 *   DELETE /v1/activities/{activityId}/orders?requestId=...   (by the submission's requestId, e.g.
 *          when the 202 never arrived: the cancellation may even precede the reservation)
 *
 * 200 { reservationId, outcome: cancelled | already-cancelled | tombstoned, orderId? }
 * 409 ALREADY_PAID for a paid order; 404 UNKNOWN_RESERVATION for somebody else's or an unknown
 * one after the sale (nothing can arrive any more).
 */
import { Router } from 'express';
import type { Request, Response } from 'express';
import { FlashSaleError } from '../../core/errors.js';
import { cancelReservation } from '../../core/order-lifecycle.js';
import type { CancelOutcome, LifecycleDeps } from '../../core/order-lifecycle.js';
import { reservationIdFor } from '../../core/reservations.js';
import { parse, requestIdQuery, reservationParam, servedActivity } from './schemas.js';

export interface CancelDeps extends LifecycleDeps {
  /** When set, this api serves only this activity. */
  activityId: string | undefined;
}

const metricOutcome: Record<CancelOutcome['outcome'], string> = {
  cancelled: 'cancelled',
  'already-cancelled': 'already_cancelled',
  tombstoned: 'tombstoned',
};

export function cancelRouter(deps: CancelDeps): Router {
  const router = Router();

  const activityOf = (req: Request): string => servedActivity(req, deps.activityId);

  const cancel = async (res: Response, activityId: string, reservationId: string): Promise<void> => {
    try {
      const r = await cancelReservation(deps, {
        activityId,
        userId: res.locals.userId as string,
        reservationId,
        traceId: res.locals.traceId as string,
      });
      deps.metrics?.cancellations.inc({ activity: activityId, outcome: metricOutcome[r.outcome] });
      res.status(200).json({
        reservationId,
        outcome: r.outcome,
        ...(r.outcome !== 'tombstoned' && r.orderId ? { orderId: r.orderId } : {}),
      });
    } catch (err) {
      if (err instanceof FlashSaleError && err.code === 'ALREADY_PAID') {
        deps.metrics?.cancellations.inc({ activity: activityId, outcome: 'already_paid' });
      }
      throw err;
    }
  };

  router.delete('/v1/activities/:activityId/orders/:reservationId', async (req: Request, res: Response) => {
    const activityId = activityOf(req);
    await cancel(res, activityId, parse(reservationParam, req.params.reservationId));
  });

  router.delete('/v1/activities/:activityId/orders', async (req: Request, res: Response) => {
    const activityId = activityOf(req);
    const requestId = parse(requestIdQuery, req.query.requestId);
    await cancel(res, activityId, reservationIdFor(activityId, res.locals.userId as string, requestId));
  });

  return router;
}
