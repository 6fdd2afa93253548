/**
 * Process-local sold-out flags: once a SKU is sold out, new attempts are refused without touching
 * Redis. A restock event (published by release-6.lua) clears the flag at once; a flag also
 * expires after `recheckMs`, so a missed event costs at most one Redis call per interval.
 */
export class SoldOutFlags {
  private readonly flags = new Map<string, number>();
  constructor(private readonly recheckMs: number) {}

  private static key(activityId: string, skuId: string): string {
    return `${activityId}\n${skuId}`;
  }

  isSoldOut(activityId: string, skuId: string, now = Date.now()): boolean {
    const k = SoldOutFlags.key(activityId, skuId);
    const until = this.flags.get(k);
    if (until === undefined) return false;
    if (until > now) return true;
    this.flags.delete(k);
    return false;
  }

  markSoldOut(activityId: string, skuId: string, now = Date.now()): void {
    this.flags.set(SoldOutFlags.key(activityId, skuId), now + this.recheckMs);
  }

  restocked(activityId: string, skuId: string): void {
    this.flags.delete(SoldOutFlags.key(activityId, skuId));
  }
}
