/**
 * Kubernetes Events on FlashSaleActivities (core/v1, visible in `kubectl describe fsa` and
 * `kubectl get events`). Reasons are CamelCase constants (EventReason); the operator records
 * lifecycle milestones, not every operation. Best effort: a failed Event never fails a reconcile.
 */
import type { CoreV1Api } from '@kubernetes/client-node';
import type { Logger } from '../../core/logger.js';
import type { EventReason, FlashSaleActivity } from '../api/v1alpha1/types.js';

export type EventType = 'Normal' | 'Warning';

export interface EventSink {
  record(fsa: FlashSaleActivity, type: EventType, reason: EventReason, message: string): Promise<void>;
}

export class EventRecorder implements EventSink {
  constructor(
    private readonly api: CoreV1Api,
    private readonly identity: string,
    private readonly log: Logger,
  ) {}

  async record(fsa: FlashSaleActivity, type: EventType, reason: EventReason, message: string): Promise<void> {
    const now = new Date();
    try {
      await this.api.createNamespacedEvent({
        namespace: fsa.metadata.namespace,
        body: {
          metadata: { generateName: `${fsa.metadata.name}.`, namespace: fsa.metadata.namespace },
          involvedObject: {
            apiVersion: fsa.apiVersion,
            kind: fsa.kind,
            name: fsa.metadata.name,
            namespace: fsa.metadata.namespace,
            uid: fsa.metadata.uid,
            resourceVersion: fsa.metadata.resourceVersion,
          },
          type,
          reason,
          message: message.slice(0, 1024),
          source: { component: 'flashsale-operator' },
          reportingComponent: 'flashsale.io/operator',
          reportingInstance: this.identity.slice(0, 128),
          firstTimestamp: now,
          lastTimestamp: now,
          count: 1,
        },
      });
    } catch (err) {
      this.log.warn({ err: String(err), reason }, 'could not record event');
    }
  }
}
