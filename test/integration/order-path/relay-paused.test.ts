// A relay that stands still longer than its Redis command timeout (REDIS_COMMAND_TIMEOUT_MS, 5 s):
// a long garbage collection, CPU throttling, a frozen VM, here SIGSTOP. Its blocking read was in
// flight: Redis answered it with the entries that arrived meanwhile, and put them on the relay's
// pending list; on resume the command's timer fires before the reply is read, the client drops the
// reply, the batch fails. Those entries are the relay's own pending ones: they must be read again
// at once, not only when RELAY_RECLAIM_IDLE_MS has passed (set to 5 minutes here, as a relay that
// reclaims late). Found by `make bench` (its backlog phase pauses relay and consumer this way):
// the 100,000 orders were in PostgreSQL, the stream never emptied.
import { formatViolations } from '../../faults/harness/invariants.js';
import { Sale, buyers, prepareActivity, recoverAndCheck, sleep } from '../../faults/harness/sale.js';
import type { Servers } from '../../faults/harness/sale.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { waitFor } from '../../../dev/roles.js';

describe('a relay paused past its Redis command timeout', () => {
  let sale: Sale | undefined;
  let pausedPid = 0;
  let db: FreshDatabase | undefined;

  afterAll(async () => {
    try {
      if (pausedPid) process.kill(pausedPid, 'SIGCONT');
    } catch {
      // gone
    }
    await sale?.stop();
    await db?.drop();
  }, 120_000);

  test('reads its lost batch again at once: every reservation becomes an order', async () => {
    const env = testEnv();
    db = await freshDatabase();
    const servers: Servers = {
      databaseUrl: db.url,
      redisUrl: env.redisUrl,
      kafkaBrokers: env.kafkaBrokers,
    };
    const activityId = uniqueId('relay-pause');
    await prepareActivity(servers, activityId, [
      { skuId: 'tea', name: '碧螺春 明前 100g', price: '68.00', stock: 100, limitPerUser: 1 },
    ]);
    sale = new Sale({ servers, activityId, env: { RELAY_RECLAIM_IDLE_MS: '300000' } });
    const s = sale;
    await s.start();
    const buy = (from: number, n: number) =>
      buyers(
        s,
        activityId,
        Array.from({ length: n }, (_, i) => `${activityId}-b${from + i}`),
        { skuId: 'tea', concurrency: 4 },
      );
    // The relay idles in its blocking read ...
    expect((await buy(0, 10)).every((a) => a.status === 202)).toBe(true);
    await waitFor(
      'the first orders relayed',
      async () => (await recoverAndCheck(servers, activityId, 1)).drained,
      60_000,
      200,
    );
    // ... when it stands still; buyers go on.
    const relay = s.current.get('relay')!;
    pausedPid = relay.proc.pid!;
    process.kill(pausedPid, 'SIGSTOP');
    const pausedAt = Date.now();
    expect((await buy(10, 30)).every((a) => a.status === 202)).toBe(true);
    await sleep(Math.max(0, pausedAt + 6_500 - Date.now()));
    process.kill(pausedPid, 'SIGCONT');
    pausedPid = 0;
    // Well before the 5-minute reclaim: everything relayed, written, and checked.
    const rec = await recoverAndCheck(servers, activityId, 30_000);
    expect(formatViolations(rec.violations)).toBe('');
    expect(rec.drained).toBe(true);
    expect(s.deaths).toEqual([]);
  }, 180_000);
});
