// patches/ioredis+5.11.1.patch, a backport of ioredis 6.1.0's fix (redis/ioredis#2198), checked
// against upstream 5.11.1's own code (the patch reversed, bench/lib/patched-packages.ts).
//
// Through Sentinel, core/redis.ts turns on ioredis' failover detector: it subscribes to the
// sentinels' `+switch-master` and drops the connection when the primary changes. In 5.11.1 the
// detector of a connection outlived it: when the primary died, its stream closed by itself, the
// client started to reconnect (asking the sentinels for the primary), and the old detector, still
// subscribed, then heard the promotion and called the connector's disconnect(). That aborted the
// reconnect in flight with "Connection is closed." and ioredis set the client to `end`: it never
// reconnected, and every command failed with that message until the process restarted. `make
// faults` met it once in window 12 (an api answering 503 for the seven minutes the test lasted).
import { EventEmitter } from 'node:events';
import { createServer } from 'node:net';
import type { AddressInfo, Socket } from 'node:net';
import { IOREDIS_PATCH, patchedPackageModule } from '../../../bench/lib/patched-packages.js';

/** The parts of ioredis' SentinelConnector the race goes through. */
interface SentinelConnector {
  stream: unknown;
  connectToSentinel: (address: unknown, options: unknown) => FakeSentinelClient;
  resolve: (endpoint: unknown) => Promise<{ host: string; port: number }>;
  initFailoverDetector: () => Promise<void>;
  connect: (emit: (type: string, err: unknown) => void) => Promise<Socket>;
}
type SentinelConnectorClass = new (options: Record<string, unknown>) => SentinelConnector;

interface FakeSentinelClient {
  subscribe: () => Promise<void>;
  on: (event: string, listener: (channel: string) => void) => void;
  disconnect: () => void;
}

/**
 * A client connected through Sentinel loses its primary; the promotion is announced while its
 * reconnect is asking the sentinels for the new primary. Returns how the reconnect ended.
 */
async function failoverDuringReconnect(which: 'installed' | 'upstream', port: number): Promise<string> {
  const { default: Connector } = patchedPackageModule<{ default: SentinelConnectorClass }>(
    'ioredis',
    IOREDIS_PATCH,
    which,
    'built/connectors/SentinelConnector/index.js',
  );
  const connector = new Connector({
    sentinels: [{ host: '127.0.0.1', port: 1 }],
    name: 'primary',
    failoverDetector: true,
    sentinelMaxConnections: 10,
    disconnectTimeout: 100,
  });
  const announce: ((channel: string) => void)[] = [];
  connector.connectToSentinel = () => ({
    subscribe: () => Promise.resolve(),
    on: (event, listener) => {
      if (event === 'message') announce.push(listener);
    },
    disconnect: () => undefined,
  });
  // The connection to the primary, and its failover detector subscribed.
  const primary = Object.assign(new EventEmitter(), {
    end: () => primary.emit('close'),
    destroy: () => undefined,
  });
  connector.stream = primary;
  await connector.initFailoverDetector();
  // The primary dies: its stream closes by itself, not through the connector.
  primary.emit('close');
  // ioredis reconnects and asks the sentinels for the primary; Sentinel promotes the replica and
  // announces it before the answer comes.
  let answer!: (address: { host: string; port: number }) => void;
  connector.resolve = () => new Promise((r) => (answer = r));
  const reconnect = connector.connect(() => undefined);
  for (const listener of announce) listener('+switch-master');
  answer({ host: '127.0.0.1', port });
  return reconnect.then(
    (stream) => {
      stream.destroy();
      return 'connected to the new primary';
    },
    (err: Error) => `failed: ${err.message}`,
  );
}

describe('ioredis Sentinel connector (patches/ioredis+5.11.1.patch)', () => {
  const newPrimary = createServer((s) => s.destroy());
  let port = 0;

  beforeAll(async () => {
    await new Promise<void>((r) => newPrimary.listen(0, '127.0.0.1', r));
    port = (newPrimary.address() as AddressInfo).port;
  });

  afterAll(async () => {
    await new Promise((r) => newPrimary.close(r));
  });

  test('a promotion announced while the client reconnects does not end the client', async () => {
    expect(await failoverDuringReconnect('installed', port)).toBe('connected to the new primary');
  });

  test('upstream 5.11.1 aborts that reconnect and ends the client (the patch is still needed)', async () => {
    expect(await failoverDuringReconnect('upstream', port)).toBe('failed: Connection is closed.');
  });
});
