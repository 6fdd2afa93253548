// The layer every request of every role passes (runtime/http.ts): a trace id per request, taken
// from the caller or new, echoed in x-request-id; a sample in the request histogram labelled by
// route template, method and status. Checked on real HTTP requests to a local server.
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createMetrics } from '../../../core/metrics.js';
import { createServiceApp, newTraceId } from '../../../runtime/http.js';

describe('the service app', () => {
  const metrics = createMetrics('api-test');
  let server: Server;
  let base = '';
  beforeAll(async () => {
    const app = createServiceApp({ metrics, ready: async () => true });
    app.get('/v1/things/:id', (_req, res) => {
      res.json({ traceId: res.locals.traceId as string });
    });
    app.post('/v1/things/:id', (_req, res) => {
      res.status(409).json({});
    });
    server = createServer(app);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await new Promise((resolve) => server.close(resolve));
  });

  const get = async (headers: Record<string, string> = {}) => {
    const res = await fetch(`${base}/v1/things/a1`, { headers });
    const body = (await res.json()) as { traceId: string };
    return { header: res.headers.get('x-request-id'), seen: body.traceId };
  };

  test('a new trace id is 32 hex digits, echoed, and different on every request', async () => {
    const ids = new Set<string>();
    for (let i = 0; i < 20; i += 1) {
      const { header, seen } = await get();
      expect(header).toMatch(/^[\da-f]{32}$/);
      expect(seen).toBe(header);
      ids.add(header!);
    }
    expect(ids.size).toBe(20);
  });

  test('newTraceId draws fresh random bytes when its block is used up', () => {
    const ids = Array.from({ length: 1000 }, () => newTraceId());
    expect(new Set(ids).size).toBe(1000);
    expect(ids.every((id) => /^[\da-f]{32}$/.test(id))).toBe(true);
  });

  test("the caller's trace id is kept: traceparent first, then a well-formed x-request-id", async () => {
    const trace = '4bf92f3577b34da6a3ce929d0e0e4736';
    expect(await get({ traceparent: `00-${trace}-00f067aa0ba902b7-01` })).toEqual({
      header: trace,
      seen: trace,
    });
    expect(await get({ 'x-request-id': 'order-flow-42' })).toEqual({
      header: 'order-flow-42',
      seen: 'order-flow-42',
    });
    const refused = await get({ 'x-request-id': 'no spaces allowed' });
    expect(refused.header).toMatch(/^[\da-f]{32}$/);
  });

  test('each response is one sample of its route template, method and status', async () => {
    const count = async (labels: string): Promise<number> => {
      const text = await metrics.registry.metrics();
      const line = text
        .split('\n')
        .find((l) => l.startsWith('flashsale_http_request_duration_seconds_count{') && l.includes(labels));
      return line ? Number(line.split(' ').pop()) : 0;
    };
    const counts = async (): Promise<number[]> => [
      await count('route="/v1/things/:id",method="GET",code="200"'),
      await count('route="/v1/things/:id",method="POST",code="409"'),
      await count('route="unmatched",method="GET",code="404"'),
    ];
    const before = await counts();
    await get();
    await get();
    await fetch(`${base}/v1/things/b2`, { method: 'POST' });
    await fetch(`${base}/nowhere`);
    const expected = [before[0]! + 2, before[1]! + 1, before[2]! + 1];
    // A sample is taken on 'finish' (the answer handed to the socket), which this process's client
    // may see a moment before the server's callback runs.
    let after = await counts();
    for (let i = 0; i < 50 && after.join() !== expected.join(); i += 1) {
      await new Promise((r) => setTimeout(r, 20));
      after = await counts();
    }
    expect(after).toEqual(expected);
  });
});
