/**
 * Buyer cancellation (behind buyer authentication):
 *
 *   DELETE /v1/activities/{activityId}/orders/{reservationId}
 *   DELETE /v1/activities/{activityId}/orders?requestId=...   (by the submission's requestId, e.g.
 *          when the 202 never arrived: the cancellation may even precede the reservation)
 *
 * 200 { reservationId, outcome: cancelled | already-cancelled | tombstoned, orderId? }
 * 409 ALREADY_PAID for a paid order; 404 UNKNOWN_RESERVATION for somebody else's or an unknown
 * reservation id, and for an unknown requestId after the sale (nothing can arrive any more);
 * 429 CANCEL_MARKER_LIMIT when this buyer left the most markers allowed, with Retry-After: the
 * seconds until the sale's end, from when nothing can arrive any more (then 404).
 *
 * Only the requestId form can leave a cancel marker ("tombstoned"), and only under the id derived
 * from this buyer's own requestId: a made-up reservation id writes nothing to Redis or PostgreSQL.
 */
import { Router } from 'express';
import type { Request, Response } from 'express';
import { FlashSaleError } from '../../core/errors.js';
import { cancelReservation } from '../../core/order-lifecycle.js';
import type { CancelInput, CancelOutcome, LifecycleDeps } from '../../core/order-lifecycle.js';
import { retryAfterMs } from '../../core/reservations.js';
import type { CancelMarkerPolicy } from '../../core/reservations.js';
import { parse, requestIdQuery, reservationParam, servedActivity } from './schemas.js';

export interface CancelDeps extends LifecycleDeps {
  /** When set, this api serves only this activity. */
  activityId: string | undefined;
  /** Bounds of cancel markers (CANCEL_MARKER_GRACE_SECONDS, CANCEL_MARKERS_PER_BUYER). */
  markers?: CancelMarkerPolicy | undefined;
}

const metricOutcome: Record<CancelOutcome['outcome'], string> = {
  cancelled: 'cancelled',
  'already-cancelled': 'already_cancelled',
  tombstoned: 'tombstoned',
};

export function cancelRouter(deps: CancelDeps): Router {
  const router = Router();

  const activityOf = (req: Request): string => servedActivity(req, deps.activityId);

  const cancel = async (res: Response, activityId: string, target: CancelInput['target']): Promise<void> => {
    try {
      const r = await cancelReservation(deps, {
        activityId,
        userId: res.locals.userId as string,
        target,
        traceId: res.locals.traceId as string,
        markers: deps.markers,
      });
      deps.metrics?.cancellations.inc({ activity: activityId, outcome: metricOutcome[r.outcome] });
      res.status(200).json({
        reservationId: r.reservationId,
        outcome: r.outcome,
        ...(r.outcome !== 'tombstoned' && r.orderId ? { orderId: r.orderId } : {}),
      });
    } catch (err) {
      if (err instanceof FlashSaleError && err.code === 'ALREADY_PAID') {
        deps.metrics?.cancellations.inc({ activity: activityId, outcome: 'already_paid' });
      }
      // Once the sale ends no submission can reserve, so the cancellation is answered then.
      if (err instanceof FlashSaleError && err.code === 'CANCEL_MARKER_LIMIT') {
        res.setHeader('retry-after', String(Math.ceil(retryAfterMs(err) / 1000)));
      }
      throw err;
    }
  };

  router.delete('/v1/activities/:activityId/orders/:reservationId', async (req: Request, res: Response) => {
    const activityId = activityOf(req);
    await cancel(res, activityId, { reservationId: parse(reservationParam, req.params.reservationId) });
  });

  router.delete('/v1/activities/:activityId/orders', async (req: Request, res: Response) => {
    const activityId = activityOf(req);
    const requestId = parse(requestIdQuery, req.query.requestId);
    await cancel(res, activityId, { requestId });
  });

  return router;
}
