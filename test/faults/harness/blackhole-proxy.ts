// A TCP proxy on loopback in front of a real server, for the failure a client cannot see: its
// connections to a server that stopped answering (a primary whose machine hung or was cut off)
// stay open and take in what is sent, and nothing ever comes back, while new connections reach a
// server that answers (what a database Service does after a failover). `blackhole()` does that to
// every connection open at the time; connections opened afterwards are proxied as before.
import { createConnection, createServer } from 'node:net';
import type { Server, Socket } from 'node:net';

export interface BlackholeProxy {
  /** The port the proxy listens on (127.0.0.1). */
  port: number;
  /** Stops forwarding on every open connection, both ways, without closing any; returns how many. */
  blackhole: () => number;
  close: () => Promise<void>;
}

export async function startBlackholeProxy(target: { host: string; port: number }): Promise<BlackholeProxy> {
  const open = new Set<{ client: Socket; upstream: Socket }>();
  const held: Socket[] = [];
  const server: Server = createServer((client) => {
    const upstream = createConnection(target);
    const pair = { client, upstream };
    open.add(pair);
    client.pipe(upstream);
    upstream.pipe(client);
    const end = (): void => {
      open.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('the proxy has no TCP port');
  return {
    port: address.port,
    blackhole: () => {
      const n = open.size;
      for (const pair of open) {
        pair.client.unpipe(pair.upstream);
        pair.upstream.unpipe(pair.client);
        pair.client.removeAllListeners('close');
        pair.client.removeAllListeners('error');
        pair.client.on('error', () => undefined);
        // Read and drop what the client sends: its kernel goes on accepting, as a hung server's does.
        pair.client.on('data', () => undefined);
        pair.client.resume();
        // The server side is let go: what it would answer never reaches the client.
        pair.upstream.removeAllListeners();
        pair.upstream.on('error', () => undefined);
        pair.upstream.destroy();
        held.push(pair.client);
      }
      open.clear();
      return n;
    },
    close: async () => {
      for (const pair of open) {
        pair.client.destroy();
        pair.upstream.destroy();
      }
      for (const s of held) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
