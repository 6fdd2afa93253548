/**
 * /healthz (the process and its event loop answer), /readyz (dependencies reachable and, when
 * leading, the informers have synced; a standby replica is ready) and /metrics (Prometheus).
 */
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { Registry } from 'prom-client';

export interface HealthSource {
  /** Undefined when ready, else the reason. */
  notReady(): Promise<string | undefined>;
}

export function startHealthServer(port: number, registry: Registry, health: HealthSource): Promise<Server> {
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const send = (code: number, body: string, type = 'text/plain; charset=utf-8'): void => {
      res.writeHead(code, { 'content-type': type });
      res.end(body);
    };
    if (req.method !== 'GET') return send(405, 'method not allowed\n');
    if (path === '/healthz') return send(200, 'ok\n');
    if (path === '/readyz') {
      health
        .notReady()
        .then((reason) => (reason === undefined ? send(200, 'ok\n') : send(503, `not ready: ${reason}\n`)))
        .catch((err: unknown) => send(503, `not ready: ${String(err)}\n`));
      return;
    }
    if (path === '/metrics') {
      registry
        .metrics()
        .then((text) => send(200, text, registry.contentType))
        .catch((err: unknown) => send(500, String(err)));
      return;
    }
    send(404, 'not found\n');
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, () => resolve(server));
  });
}
