// The FlashSaleActivity the operator's unit tests start from: one SKU, one replica of each role
// per phase unless a test says otherwise, a sale in 2030.
import type {
  FlashSaleActivity,
  FlashSaleActivityStatus,
  RoleReplicas,
} from '../../../operator/api/v1alpha1/types.js';

export interface ActivityFixture {
  generation?: number;
  replicas?: Partial<Record<'warmUp' | 'active' | 'draining', Partial<RoleReplicas>>>;
  status?: FlashSaleActivityStatus;
}

export function activityFixture({
  generation = 3,
  replicas = {},
  status,
}: ActivityFixture = {}): FlashSaleActivity {
  const role = (phase: 'warmUp' | 'active' | 'draining'): RoleReplicas => ({
    api: 1,
    relay: 1,
    consumer: 1,
    ...replicas[phase],
  });
  return {
    apiVersion: 'flashsale.io/v1alpha1',
    kind: 'FlashSaleActivity',
    metadata: { name: 'spring', namespace: 'shop', uid: 'uid-1', generation, resourceVersion: '9' },
    spec: {
      schedule: { startAt: '2030-01-01T10:00:00Z', endAt: '2030-01-01T11:00:00Z' },
      items: [{ skuId: 'a', name: 'A', price: '1.00', stock: 1, limitPerUser: 1 }],
      requireOrderCode: false,
      reopenOnRelease: true,
      paused: false,
      runtime: { replicas: { warmUp: role('warmUp'), active: role('active'), draining: role('draining') } },
      payment: { timeout: '10m' },
      drain: { timeout: '5m' },
      cleanup: { policy: 'Delete', resultRetention: '24h' },
    },
    ...(status ? { status } : {}),
  };
}
