// kafkajs 2.2.4 as patched (patches/kafkajs+2.2.4.patch) against upstream: the consumer's fetch
// manager when it stops while it is replacing its fetchers after a change of brokers (one of the
// consumer's brokers dropped, as the patch does for a broker that stalls). Upstream created the new
// fetchers after stop() had stopped the old ones; nothing stopped them, and a stopped runner
// answers their fetches at once, so the process looped at 100 % CPU without serving timers or
// SIGTERM (found by stalled-broker.test.ts: its consumer never exited). Here the fetches take a
// few milliseconds, so upstream's loop shows as fetches that go on after stop() has returned.
import { kafkajsModule } from '../../../bench/lib/patched-packages.js';

type Which = 'installed' | 'upstream';

interface FetchManager {
  start(): Promise<void>;
  stop(): Promise<void>;
}
type CreateFetchManager = (options: {
  logger: unknown;
  getNodeIds: () => number[];
  fetch: (nodeId: number) => Promise<unknown[]>;
  handler: () => Promise<void>;
  concurrency?: number;
}) => FetchManager;
interface Loggers {
  LEVELS: { NOTHING: number };
  createLogger(options: { level: number; logCreator: () => () => void }): unknown;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Fetches made after stop() returned, within 200 ms. */
async function fetchesAfterStop(which: Which): Promise<number> {
  const createFetchManager = kafkajsModule<CreateFetchManager>(which, 'src/consumer/fetchManager.js');
  const { LEVELS, createLogger } = kafkajsModule<Loggers>(which, 'src/loggers/index.js');
  const logger = createLogger({ level: LEVELS.NOTHING, logCreator: () => () => undefined });
  let nodeIds = [1, 2];
  let fetches = 0;
  const fm = createFetchManager({
    logger,
    getNodeIds: () => nodeIds,
    // Node 2's fetch is slow: the fetch manager's own stop of the old fetchers waits for it.
    fetch: async (nodeId) => {
      fetches += 1;
      await sleep(nodeId === 2 ? 60 : 2);
      return [];
    },
    handler: async () => undefined,
  });
  const started = fm.start().catch(() => undefined);
  await sleep(10);
  // A broker dropped: node 1's next fetch finds the brokers changed, the fetchers are replaced...
  nodeIds = [1, 3];
  await sleep(10);
  // ...and the consumer stops while the old node 2 fetcher is still finishing.
  await fm.stop();
  await sleep(80);
  const before = fetches;
  await sleep(200);
  const after = fetches - before;
  // Upstream's new fetchers run on: stop them so the test leaves nothing behind.
  if (after > 0) await fm.stop();
  await started;
  return after;
}

describe('the consumer stops while its fetchers are replaced (patches/kafkajs+2.2.4.patch)', () => {
  test('patched: no fetch after stop() (upstream: new fetchers nobody stops fetch on)', async () => {
    expect(await fetchesAfterStop('installed')).toBe(0);
    expect(await fetchesAfterStop('upstream')).toBeGreaterThan(0);
  });
});
