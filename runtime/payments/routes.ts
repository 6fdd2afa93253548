/**
 * The public payment-notification endpoint (no buyer token: notifications are authenticated by
 * the provider's signature): POST /v1/payments/{provider}/notifications. Answers as
 * notification-route.ts says: 200 with the committed outcome (PAID, ALREADY_PAID,
 * REFUND_PENDING, IGNORED); 409 when the trade number is recorded for another order or amount.
 */
import type { Router } from 'express';
import { applyPaymentNotification } from './apply.js';
import type { PaymentDeps } from './apply.js';
import { notificationRouter } from './notification-route.js';
import type { NotificationDeps } from './notification-route.js';
import type { PaymentProvider } from '../../core/payment-provider.js';

export type PaymentsRouterDeps = PaymentDeps & NotificationDeps<PaymentProvider>;

export const NOTIFICATION_PATH = '/v1/payments/:provider/notifications';

export function paymentsRouter(deps: PaymentsRouterDeps): Router {
  return notificationRouter(deps, {
    path: NOTIFICATION_PATH,
    refusedMessage: 'notification refused',
    verify: (provider, req) => provider.verify(req),
    apply: (provider, notice, traceId) => applyPaymentNotification(deps, provider.name, notice, traceId),
    count: (provider, outcome) => deps.metrics?.payments.inc({ provider, outcome }),
  });
}
