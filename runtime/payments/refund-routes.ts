/**
 * The public refund-notification endpoint (no buyer token; authenticated by the provider's
 * signature, the same scheme as payment notifications): POST /v1/payments/{provider}/refund-notifications.
 * Answers as notification-route.ts says: 200 with REFUNDED / ALREADY_REFUNDED / REFUND_FAILED /
 * IGNORED committed; 404 UNKNOWN_REFUND; 409 REFUND_CONFLICT (the notification does not match the
 * refund recorded under its id). A replay inside the signature tolerance is answered
 * ALREADY_REFUNDED and changes nothing; an older one is refused (401) like a payment notification.
 */
import type { Router } from 'express';
import { applyRefundNotification } from '../../core/refunds.js';
import type { RefundDeps } from '../../core/refunds.js';
import type { RefundProvider } from '../../core/payment-provider.js';
import { notificationRouter } from './notification-route.js';
import type { NotificationDeps } from './notification-route.js';

export type RefundNotificationsDeps = RefundDeps & NotificationDeps<RefundProvider>;

export const REFUND_NOTIFICATION_PATH = '/v1/payments/:provider/refund-notifications';

export function refundNotificationsRouter(deps: RefundNotificationsDeps): Router {
  return notificationRouter(deps, {
    path: REFUND_NOTIFICATION_PATH,
    refusedMessage: 'refund notification refused',
    verify: (provider, req) => provider.verifyRefund(req),
    apply: (provider, notice, traceId) => applyRefundNotification(deps, provider.name, notice, traceId),
  });
}
