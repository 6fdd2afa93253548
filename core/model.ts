/** Shared domain types: what every role and the operator agree on. */

export type GateState = 'pending' | 'open' | 'paused' | 'closed' | 'frozen';

export interface CatalogItem {
  skuId: string;
  name: string;
  /** Decimal string, e.g. "1999.00"; never a float. */
  price: string;
  /** Initial stock of this SKU (grows only). */
  stock: number;
  limitPerUser: number;
  /**
   * Stock buckets of a hot SKU (ARCHITECTURE.md "Stock buckets"): 2 or more splits its stock over
   * that many reservation scopes; absent or 1 keeps it in the activity's own scope.
   */
  buckets?: number | undefined;
}

/** What the cache needs to know of an activity; built by the operator from the custom resource. */
export interface ActivityDefinition {
  id: string;
  /** The custom resource's generation; fences cache loading. */
  generation: number;
  startAt: Date;
  endAt: Date;
  requireOrderCode: boolean;
  /** Whether a released reservation gives the buyer their limit back. */
  reopenOnRelease: boolean;
  items: CatalogItem[];
}

// The order message and the reservation states are defined with their schema in order-message.ts.
export type { OrderMessage, ReservationState } from './order-message.js';

/** What a buyer sees when polling a reservation. */
export type ReservationResult =
  { status: 'QUEUED' } | { status: 'CREATED'; orderId: string } | { status: 'FAILED'; reason: string };
