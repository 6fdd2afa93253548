// A sale opens with a burst of new connections (buyers, or an ingress opening more upstream
// connections under load). The api's listening socket holds those its event loop has not accepted
// yet, up to its backlog (HTTP_BACKLOG, runtime/roles/process.ts serveHttp): past it the kernel drops
// a handshake, and that buyer's client only tries again a second later (TCP's SYN retransmission),
// which the fairness benchmark measured as an honest buyer's p99 of about a second. Node's own
// default backlog is 511.
import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import type { Socket } from 'node:net';
import { freshDatabase } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

/** More than Node's default backlog of 511, less than the kernel's default somaxconn of 4096. */
const BURST = 1_200;

/** Connections waiting in the accept queue of the IPv4 socket listening on `port` (/proc/net/tcp). */
function acceptQueue(port: number): number {
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const [, local, , state, queues] = line.trim().split(/\s+/);
    if (state === '0A' && local?.endsWith(`:${hexPort}`)) return parseInt(queues!.split(':')[1]!, 16);
  }
  throw new Error(`nothing listens on port ${port}`);
}

describe('the api under a burst of new connections', () => {
  let db: FreshDatabase;
  let api: RoleProcess | undefined;

  beforeAll(async () => {
    db = await freshDatabase();
  });

  afterAll(async () => {
    await api?.stop();
    await db?.drop();
  });

  it('holds every connection of a burst larger than Node’s default backlog until it serves them', async () => {
    const somaxconn = Number(readFileSync('/proc/sys/net/core/somaxconn', 'utf8'));
    // The kernel caps any backlog at net.core.somaxconn (4096 by default since Linux 5.4).
    if (somaxconn < BURST) throw new Error(`net.core.somaxconn is ${somaxconn}: this test needs ${BURST}`);
    api = await startRole('api', { databaseUrl: db.url });
    const pid = api.proc.pid!;
    const sockets: Socket[] = [];
    // Stopped, the api accepts nothing: the whole burst has to wait in its accept queue.
    process.kill(pid, 'SIGSTOP');
    let answers: string[];
    try {
      const answered = Array.from({ length: BURST }, () => {
        const s = connect(api!.port, '127.0.0.1');
        sockets.push(s);
        s.write('GET /healthz HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n');
        return new Promise<string>((resolve) => {
          let text = '';
          s.setEncoding('utf8');
          s.on('data', (d: string) => (text += d));
          s.on('error', (err) => resolve(`error: ${err.message}`));
          s.on('close', () => resolve(text));
        });
      });
      // Those the kernel dropped would come back only after their client's retransmission (1 s):
      // wait for the queue to hold the burst, or to stay put for 2 s.
      let last = -1;
      let since = Date.now();
      await waitFor(
        'the accept queue to settle',
        async () => {
          const q = acceptQueue(api!.port);
          if (q !== last) [last, since] = [q, Date.now()];
          return q === BURST || Date.now() - since >= 2_000 ? true : undefined;
        },
        30_000,
        100,
      );
      expect({ queued: acceptQueue(api.port) }).toEqual({ queued: BURST });
      process.kill(pid, 'SIGCONT');
      answers = await Promise.all(answered);
    } finally {
      process.kill(pid, 'SIGCONT');
      for (const s of sockets) s.destroy();
    }
    const statuses = new Map<string, number>();
    for (const a of answers) {
      const status = /^HTTP\/1\.1 (\d{3})/.exec(a)?.[1] ?? a.slice(0, 80);
      statuses.set(status, (statuses.get(status) ?? 0) + 1);
    }
    expect(Object.fromEntries(statuses)).toEqual({ '200': BURST });
  });
});
