// The fault harness' buyers (test/faults/harness/sale.ts) against a stand-in api on loopback: an
// answer that never comes is an unanswered attempt, named and tried again, not a test that hangs
// until its own timeout.
import { jest } from '@jest/globals';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { buyers } from '../../faults/harness/sale.js';
import type { Sale } from '../../faults/harness/sale.js';

test('a buyer whose request gets no answer in time tries again and says why', async () => {
  let requests = 0;
  // The first request is never answered; the retry is.
  const server = createServer((req, res) => {
    requests += 1;
    req.resume();
    if (requests === 1) return;
    res.writeHead(202, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ reservationId: 'r1' }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const sale = { url: () => base } as unknown as Sale;
  const attempts: { status: number; error?: string }[] = [];
  const log = jest.spyOn(console, 'log').mockImplementation(() => undefined);
  try {
    const [answer] = await buyers(sale, 'act', ['b1'], {
      skuId: 's',
      requestTimeoutMs: 300,
      onAttempt: (a) => attempts.push({ status: a.status, ...(a.error ? { error: a.error } : {}) }),
    });
    expect(answer).toMatchObject({ buyer: 'b1', status: 202, attempts: 2, reservationId: 'r1' });
    expect(attempts).toEqual([{ status: 0, error: 'UND_ERR_HEADERS_TIMEOUT' }, { status: 202 }]);
    expect(log).toHaveBeenCalledWith(
      expect.stringMatching(/^buyer b1 \(act\), attempt 1: no answer in 300 ms/),
    );
  } finally {
    log.mockRestore();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});
