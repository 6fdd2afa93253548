// The relay's reclaim of entries other relays left pending (runtime/relay/relay.ts), as Redis 7
// and Redis 6.2 answer XAUTOCLAIM for an entry deleted while pending.
import { createLogger } from '../../../core/logger.js';
import { Relay } from '../../../runtime/relay/relay.js';
import type { RelayOptions } from '../../../runtime/relay/relay.js';

function relayAnswered(reply: unknown[]): { relay: Relay; acked: string[][] } {
  const acked: string[][] = [];
  const redis = {
    xautoclaim: async () => reply,
    xack: async (_stream: string, _group: string, ...ids: string[]) => {
      acked.push(ids);
      return ids.length;
    },
  };
  const relay = new Relay({
    activityId: 'sale-1',
    topic: 'orders',
    redis,
    blockingRedis: redis,
    logger: createLogger('test', 'silent'),
    batchSize: 10,
    reclaimIdleMs: 5_000,
  } as unknown as RelayOptions);
  return { relay, acked };
}

const reclaim = (relay: Relay) => (relay as unknown as { reclaim(): Promise<unknown[]> }).reclaim();
const live: [string, string[]] = ['2-0', ['msg', '{}']];

describe('relay reclaim', () => {
  it('Redis 7: acknowledges the ids of deleted entries, publishes the live ones', async () => {
    const { relay, acked } = relayAnswered(['0-0', [live], ['1-0']]);
    expect(await reclaim(relay)).toEqual([live]);
    expect(acked).toEqual([['1-0']]);
  });

  it('Redis 6.2: a nil in place of a deleted entry (or a nil payload) is passed over, not a failed batch', async () => {
    const { relay, acked } = relayAnswered(['0-0', [null, ['1-1', null], live]]);
    expect(await reclaim(relay)).toEqual([live]);
    // The one whose id Redis gave is acknowledged; a bare nil cannot be.
    expect(acked).toEqual([['1-1']]);
  });
});
