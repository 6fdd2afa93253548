/**
 * What the provider-signed endpoints (payment and refund notifications) share: the raw body (a
 * signature is computed over bytes), the provider named in the path, verification before anything
 * is written, the provider's own acknowledgement, and answers that make the provider retry exactly
 * when it should (docs/after-sale.md):
 *   200  the outcome is committed: stop retrying
 *   401  bad, missing or stale signature; 403 another merchant/app; 400 signed but malformed;
 *        404 unknown provider or order/refund; 409 a conflict kept alive at the provider for a
 *        human: nothing written (the FlashSaleError's code, core/errors.ts)
 *   503  transient failure (database or Redis): retry
 */
import express, { Router } from 'express';
import type { Request, RequestHandler, Response } from 'express';
import { dependencyOutage, FlashSaleError } from '../../core/errors.js';
import type { Logger } from '../../core/logger.js';
import type { Acknowledgement, NotificationRequest } from '../../core/payment-provider.js';

interface SigningProvider {
  readonly name: string;
  acknowledge(outcome: string): Acknowledgement;
}

export interface NotificationDeps<P extends SigningProvider> {
  providers: P[];
  /** Largest notification body accepted (default 64kb). */
  bodyLimit?: string | undefined;
  logger: Logger;
  /** Runs once the body is read (the api's admission count, runtime/api/admission.ts). */
  afterBody?: RequestHandler | undefined;
}

export interface NotificationRoute<P extends SigningProvider, N> {
  path: string;
  /** What the log line of a refused notification says. */
  refusedMessage: string;
  /** Authenticates and parses the notification; throws a FlashSaleError when it is refused. */
  verify(provider: P, req: NotificationRequest): N;
  /** Applies a verified notification (one core function) and returns the outcome to acknowledge. */
  apply(provider: P, notice: N, traceId: string): Promise<string>;
  /** Counts each answer: the outcome, `rejected_<code>` or `error`. */
  count?: ((provider: string, outcome: string) => void) | undefined;
}

function transient(err: unknown): boolean {
  return dependencyOutage(err) !== undefined;
}

const rejected = (err: unknown): string =>
  `rejected_${err instanceof FlashSaleError ? err.code.toLowerCase() : 'error'}`;

export function notificationRouter<P extends SigningProvider, N>(
  deps: NotificationDeps<P>,
  route: NotificationRoute<P, N>,
): Router {
  const providers = new Map(deps.providers.map((p) => [p.name, p]));
  const router = Router();
  const readBody: RequestHandler[] = [express.raw({ type: () => true, limit: deps.bodyLimit ?? '64kb' })];
  if (deps.afterBody) readBody.push(deps.afterBody);
  router.post(route.path, ...readBody, async (req: Request, res: Response) => {
    const provider = providers.get(String(req.params.provider));
    if (!provider) throw new FlashSaleError('NOT_FOUND', 'unknown payment provider');
    const count = (outcome: string): void => route.count?.(provider.name, outcome);
    const traceId = res.locals.traceId as string;
    let notice: N;
    try {
      notice = route.verify(provider, {
        rawBody: Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0),
        headers: req.headers,
        now: new Date(),
      });
    } catch (err) {
      count(rejected(err));
      deps.logger.warn(
        { err: (err as Error).message, traceId, provider: provider.name },
        route.refusedMessage,
      );
      throw err;
    }
    try {
      const outcome = await route.apply(provider, notice, traceId);
      count(outcome);
      const ack = provider.acknowledge(outcome);
      res.status(200).type(ack.contentType).send(ack.body);
    } catch (err) {
      if (err instanceof FlashSaleError) {
        count(rejected(err));
        throw err;
      }
      count('error');
      if (transient(err)) throw new FlashSaleError('UNAVAILABLE', 'a dependency is unavailable; retry');
      throw err;
    }
  });
  return router;
}
