/** Pre-registration (docs/operator.md "Traffic shaping and eligibility"): during warm-up only. */
import { Router } from 'express';
import type { Request, Response } from 'express';
import { isRegistered, registerBuyer } from '../../core/traffic-policy.js';
import type { RedisClient } from '../../core/scripts.js';
import { servedActivity } from './schemas.js';

export interface RegistrationDeps {
  redis: RedisClient;
  activityId: string | undefined;
}

export const REGISTRATION_PATH = '/v1/activities/:activityId/registrations';

export function registrationRouter(deps: RegistrationDeps): Router {
  const router = Router();

  router.post(REGISTRATION_PATH, async (req: Request, res: Response) => {
    const activityId = servedActivity(req, deps.activityId);
    const outcome = await registerBuyer(deps.redis, activityId, res.locals.userId as string);
    res.status(outcome === 'registered' ? 201 : 200).json({ registered: true });
  });

  router.get('/v1/activities/:activityId/registrations/me', async (req: Request, res: Response) => {
    const activityId = servedActivity(req, deps.activityId);
    res.json({ registered: await isRegistered(deps.redis, activityId, res.locals.userId as string) });
  });

  return router;
}
