// The precompiled request checks (runtime/api/schemas.ts) accept exactly what the zod schemas
// accept and refuse with zod's own errors; the JSON body reader (runtime/api/json-body.ts) answers
// every body like express.json() does. Both are compared with their reference, on generated
// inputs and on real HTTP requests to two local servers.
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import express from 'express';
import type { ErrorRequestHandler, RequestHandler } from 'express';
import fc from 'fast-check';
import { jsonBody, parseByteLimit } from '../../../runtime/api/json-body.js';
import { parse, parseSubmitOrder, submitOrderBody } from '../../../runtime/api/schemas.js';

const outcome = (f: () => unknown): unknown => {
  try {
    return { ok: f() };
  } catch (err) {
    return { err: (err as { code?: string }).code, extra: (err as { extra?: unknown }).extra };
  }
};

describe('parseSubmitOrder', () => {
  const idChars = fc.constantFrom(...'aZ09._-:/ é'.split(''));
  const text = fc.oneof(
    fc.string({ unit: idChars, minLength: 0, maxLength: 70 }),
    fc.constantFrom('hot', 'q1', 'A'.repeat(63), 'A'.repeat(64), 'c'.repeat(16), '_x'),
  );
  const value = fc.oneof(
    text,
    fc.integer({ min: -2, max: 102 }),
    fc.constantFrom(1, 100, 1.5, Number.MAX_SAFE_INTEGER + 2, null, true, [], {}),
  );
  const body = fc.oneof(
    fc.record(
      { skuId: value, quantity: value, requestId: value, orderCode: value, other: value },
      { requiredKeys: [] },
    ),
    fc.record({ skuId: text, quantity: fc.integer({ min: 0, max: 101 }), requestId: text }),
    fc.constantFrom(null, [], 'x', 3, {
      skuId: 'hot',
      quantity: 1,
      requestId: 'q1',
      orderCode: 'c'.repeat(16),
    }),
  );

  test('gives the zod schema answer for every body', () => {
    fc.assert(
      fc.property(body, (b) => {
        expect(outcome(() => parseSubmitOrder(b))).toEqual(outcome(() => parse(submitOrderBody, b)));
      }),
      { numRuns: 3000 },
    );
  });

  test('a valid body passes, an unknown key is refused with the validation code', () => {
    expect(parseSubmitOrder({ skuId: 'hot', quantity: 2, requestId: 'q-1' })).toEqual({
      skuId: 'hot',
      quantity: 2,
      requestId: 'q-1',
    });
    expect(
      outcome(() => parseSubmitOrder({ skuId: 'hot', quantity: 2, requestId: 'q-1', x: 1 })),
    ).toMatchObject({
      err: 'VALIDATION_ERROR',
    });
  });
});

describe('jsonBody', () => {
  const LIMIT = '1kb';
  const servers: Server[] = [];
  const start = async (reader: RequestHandler): Promise<string> => {
    const app = express();
    app.use(reader);
    app.post('/', (req, res) => {
      res.json({ body: req.body as unknown });
    });
    const onError: ErrorRequestHandler = (err: { status?: number; type?: string }, _req, res, _next) => {
      res.status(err.status ?? 500).json({ status: err.status, type: err.type });
    };
    app.use(onError);
    const server = createServer(app);
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  };
  let ours = '';
  let reference = '';
  beforeAll(async () => {
    ours = await start(jsonBody(LIMIT));
    reference = await start(express.json({ limit: LIMIT, strict: true }));
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  });

  const send = async (base: string, body: string | Buffer | undefined, headers: Record<string, string>) => {
    const res = await fetch(base, { method: 'POST', headers, body });
    return { status: res.status, body: await res.text() };
  };

  const json = { 'content-type': 'application/json' };
  const cases: [string, string | Buffer | undefined, Record<string, string>][] = [
    ['an object', '{"skuId":"hot","quantity":1}', json],
    ['an array', ' [1,2]', json],
    ['with charset', '{"a":"é"}', { 'content-type': 'application/json; charset=utf-8' }],
    ['a byte order mark', '\ufeff{"a":1}', json],
    ['empty', '', json],
    ['a number (strict)', '1', json],
    ['a string (strict)', '"x"', json],
    ['whitespace then a number', ' \n 7', json],
    ['malformed', '{"a":', json],
    ['over the limit', `{"a":"${'x'.repeat(2000)}"}`, json],
    ['exactly at the limit', `{"a":"${'x'.repeat(1024 - 8)}"}`, json],
    ['gzip (delegated)', gzipSync('{"z":1}'), { ...json, 'content-encoding': 'gzip' }],
    ['latin1 (delegated)', '{"a":1}', { 'content-type': 'application/json; charset=latin1' }],
    ['another type (not read)', '{"a":1}', { 'content-type': 'text/plain' }],
    ['no body', undefined, json],
  ];
  test.each(cases)('%s: same status and body as express.json()', async (_name, body, headers) => {
    expect(await send(ours, body, headers)).toEqual(await send(reference, body, headers));
  });

  test('a declared length over the limit is refused before reading', async () => {
    const res = await send(ours, 'x'.repeat(1500), json);
    expect(res).toEqual({ status: 413, body: JSON.stringify({ status: 413, type: 'entity.too.large' }) });
  });

  test('limits are read like body-parser reads them', () => {
    expect(parseByteLimit('8kb')).toBe(8192);
    expect(parseByteLimit('1mb')).toBe(1048576);
    expect(parseByteLimit('512')).toBe(512);
    expect(() => parseByteLimit('lots')).toThrow(/not a size/);
  });
});
