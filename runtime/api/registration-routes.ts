/** Pre-registration (docs/operator.md "Traffic shaping and eligibility"): during warm-up only. */
import { Router } from 'express';
import type { Request, Response } from 'express';
import type { Pool } from '../../core/db/pool.js';
import type { ReservationAck } from '../../core/durable-ack.js';
import { isRegistered, registerBuyer } from '../../core/traffic-policy.js';
import type { RedisClient } from '../../core/scripts.js';
import { servedActivity } from './schemas.js';

export interface RegistrationDeps {
  redis: RedisClient;
  /** Where the registration is recorded (activity_registrations) before the buyer's Redis flags. */
  pool: Pool;
  activityId: string | undefined;
  /** RESERVE_ACK: the flags on a replica before the answer, as a reservation before its 202. */
  reservationAck?: ReservationAck | undefined;
}

export const REGISTRATION_PATH = '/v1/activities/:activityId/registrations';

export function registrationRouter(deps: RegistrationDeps): Router {
  const router = Router();

  router.post(REGISTRATION_PATH, async (req: Request, res: Response) => {
    const activityId = servedActivity(req, deps.activityId);
    // PostgreSQL first (core/traffic-policy.ts registerBuyer): a cache restore flags the buyer again.
    const outcome = await registerBuyer(
      deps.redis,
      activityId,
      res.locals.userId as string,
      deps.pool,
      deps.reservationAck,
    );
    res.status(outcome === 'registered' ? 201 : 200).json({ registered: true });
  });

  router.get('/v1/activities/:activityId/registrations/me', async (req: Request, res: Response) => {
    const activityId = servedActivity(req, deps.activityId);
    res.json({ registered: await isRegistered(deps.redis, activityId, res.locals.userId as string) });
  });

  return router;
}
