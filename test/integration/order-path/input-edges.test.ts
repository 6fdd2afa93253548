// Input at the edges of what the buyer api and the payment routes accept, on the real api
// (createApiApp with the payment, refund and cancellation routers), PostgreSQL and Redis: text
// PostgreSQL cannot store (U+0000, unpaired surrogates), POSTs without a body, body-parser's own
// 415s and an undecodable path. Each gets a problem+json with a stable code, never a 500, and
// writes nothing.
import { connect } from 'node:net';
import { loadActivity } from '../../../core/activity-cache.js';
import { DEFAULT_TRAFFIC_POLICY, writeTrafficPolicy } from '../../../core/traffic-policy.js';
import { uniqueId } from '../../../dev/servers.js';
import {
  buyerToken,
  countRows,
  materialize,
  notificationBody,
  notify,
  openActivity,
  reserveFor,
  setUp,
  startApi,
  type Api,
  type Fixture,
} from '../after-sale/fixture.js';

interface RawReply {
  status: number;
  code: unknown;
  detail: unknown;
  json: Record<string, unknown>;
}

/**
 * One HTTP/1.1 request written byte for byte (Node's and undici's clients add a Content-Length
 * or a chunked body of their own): `head` lines after the request line, then `body` as is.
 */
async function rawRequest(api: Api, requestLine: string, head: string[], body = ''): Promise<RawReply> {
  const { hostname, port } = new URL(api.url);
  const text = await new Promise<string>((resolve, reject) => {
    const socket = connect(Number(port), hostname);
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    socket.on('error', reject);
    socket.write(
      [requestLine, `host: ${hostname}:${port}`, 'connection: close', ...head, '', ''].join('\r\n') + body,
    );
  });
  const [headPart = '', ...rest] = text.split('\r\n\r\n');
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(headPart)?.[1]);
  let payload = rest.join('\r\n\r\n');
  if (/^transfer-encoding:\s*chunked/im.test(headPart)) {
    let decoded = '';
    for (let i = 0; ;) {
      const eol = payload.indexOf('\r\n', i);
      const size = parseInt(payload.slice(i, eol), 16);
      if (!size) break;
      decoded += payload.slice(eol + 2, eol + 2 + size);
      i = eol + 2 + size + 2;
    }
    payload = decoded;
  }
  let json: Record<string, unknown> = {};
  try {
    json = JSON.parse(payload) as Record<string, unknown>;
  } catch {
    json = { text: payload };
  }
  return { status, code: json.code, detail: json.detail, json };
}

describe('input at the edges: never a 500, never a partial write', () => {
  let f: Fixture;
  let api: Api;
  let activityId: string;
  /** An activity before its start, with pre-registration on. */
  let warmUp: string;
  const orders: { orderId: string; reservationId: string; userId: string }[] = [];
  let next = 0;
  const nextOrder = () => orders[next++]!;
  let trade = 0;
  const tradeNo = () => `ET${process.pid}x${(trade += 1)}`;

  beforeAll(async () => {
    f = await setUp();
    ({ activityId } = await openActivity(f.redis, { stock: 20, price: '19.90' }, f.pool));
    const users = Array.from({ length: 12 }, (_, i) => `edge-${i}`);
    const rids = await reserveFor(f.redis, activityId, 'sku-1', users);
    const ids = await materialize(f.pool, f.redis, activityId, rids);
    rids.forEach((rid, i) => orders.push({ orderId: ids.get(rid)!, reservationId: rid, userId: users[i]! }));
    warmUp = uniqueId('warm');
    const now = Date.now();
    await loadActivity(f.redis, {
      id: warmUp,
      generation: 1,
      startAt: new Date(now + 3_600_000),
      endAt: new Date(now + 7_200_000),
      requireOrderCode: false,
      reopenOnRelease: false,
      items: [{ skuId: 'sku-1', name: 'warm-up item', price: '9.90', stock: 5, limitPerUser: 1 }],
    });
    await writeTrafficPolicy(f.redis, warmUp, {
      ...DEFAULT_TRAFFIC_POLICY,
      eligibility: { ...DEFAULT_TRAFFIC_POLICY.eligibility, preRegistration: true },
    });
    api = await startApi(f);
  });

  afterAll(async () => {
    await api?.close();
    await f?.close();
  });

  const paidOrder = async () => {
    const o = nextOrder();
    expect((await notify(api, { orderId: o.orderId, tradeNo: tradeNo(), amount: '19.90' })).status).toBe(200);
    return o;
  };
  const state = async (orderId: string) => ({
    status: (await f.pool.query<{ status: string }>('SELECT status FROM orders WHERE id = $1', [orderId]))
      .rows[0]?.status,
    payments: await countRows(f.pool, 'SELECT count(*) AS n FROM payments WHERE order_id = $1', [orderId]),
    refunds: await countRows(f.pool, 'SELECT count(*) AS n FROM refunds WHERE order_id = $1', [orderId]),
    journal: await countRows(f.pool, 'SELECT count(*) AS n FROM order_journal WHERE order_id = $1', [
      orderId,
    ]),
  });
  const refundPath = (o: { reservationId: string }) =>
    `/v1/activities/${activityId}/orders/${o.reservationId}/refund`;
  /** A refund request with this exact body text (JSON escapes stay escapes). */
  const refund = async (
    o: { reservationId: string; userId: string },
    bodyText: string,
    head: string[] = [],
  ) =>
    rawRequest(
      api,
      `POST ${refundPath(o)} HTTP/1.1`,
      [
        `authorization: Bearer ${await buyerToken(o.userId)}`,
        ...(head.some((h) => /^content-type:/i.test(h)) ? [] : ['content-type: application/json']),
        `content-length: ${Buffer.byteLength(bodyText)}`,
        ...head,
      ],
      bodyText,
    );

  test('a refund reason PostgreSQL cannot store is a 400 VALIDATION_ERROR and writes nothing', async () => {
    const o = await paidOrder();
    const before = await state(o.orderId);
    expect(before).toMatchObject({ status: 'PAID', payments: 1, refunds: 0 });
    for (const reason of ['\\ud800', 'a\\udc00b', '\\udbff\\ud800', '\\u0000', 'x\\u0000']) {
      const r = await refund(o, `{"reason":"${reason}"}`);
      expect({ reason, status: r.status, code: r.code }).toEqual({
        reason,
        status: 400,
        code: 'VALIDATION_ERROR',
      });
      expect(r.json.errors).toEqual(expect.arrayContaining([expect.objectContaining({ path: 'reason' })]));
    }
    expect(await state(o.orderId)).toEqual(before);
    // A well-formed surrogate pair (an emoji) is text like any other.
    const ok = await refund(o, '{"reason":"\\u6362\\u8d27 \\ud83d\\ude00"}');
    expect([ok.status, ok.json.outcome]).toEqual([202, 'requested']);
    const stored = await f.pool.query<{ reason: string }>('SELECT reason FROM refunds WHERE order_id = $1', [
      o.orderId,
    ]);
    expect(stored.rows.map((r) => r.reason)).toEqual(['换货 😀']);
  });

  test('a signed payment notification holding text PostgreSQL cannot store is a 400 and writes nothing', async () => {
    const o = nextOrder();
    const before = await state(o.orderId);
    const base = notificationBody({ orderId: o.orderId, tradeNo: tradeNo(), amount: '19.90' }).slice(0, -1);
    const extras = [
      '"memo":"\\u0000"',
      '"memo":"a\\ud800"',
      '"memo":"\\udc00"',
      '"meta":{"tags":["ok","\\udfff"]}',
      '"\\u0000":1',
      '"meta":{"a\\ud800":"x"}',
      // Nested too deep to store (JSON.stringify recurses): refused, not a 500 retried for ever.
      `"meta":${'['.repeat(20_000)}${']'.repeat(20_000)}`,
    ];
    for (const extra of extras) {
      const r = await notify(api, `${base},${extra}}`);
      expect({ extra, status: r.status, code: r.body.code }).toEqual({
        extra,
        status: 400,
        code: 'VALIDATION_ERROR',
      });
    }
    expect(await state(o.orderId)).toEqual(before);
    // A notification that reports no payment is acknowledged as before: nothing of it is stored.
    const waiting = notificationBody({
      orderId: o.orderId,
      tradeNo: tradeNo(),
      amount: '19.90',
      status: 'WAIT',
    });
    const ignored = await notify(api, `${waiting.slice(0, -1)},"memo":"\\u0000"}`);
    expect([ignored.status, ignored.body.outcome]).toEqual([200, 'IGNORED']);
    expect(await state(o.orderId)).toEqual(before);
    // The same payment with storable extra fields (an emoji included) is applied.
    const good = await notify(api, `${base},"memo":"\\ud83d\\ude00 \\u00e9"}`);
    expect([good.status, good.body.outcome]).toEqual([200, 'PAID']);
    const row = await f.pool.query<{ memo: string }>(
      `SELECT notification->>'memo' AS memo FROM payments WHERE order_id = $1`,
      [o.orderId],
    );
    expect(row.rows.map((r) => r.memo)).toEqual(['😀 é']);
  });

  test('a POST without a body (no Content-Length) or with an empty chunked one is no body', async () => {
    const auth = async (user: string) => `authorization: Bearer ${await buyerToken(user)}`;
    const registrations = `POST /v1/activities/${warmUp}/registrations HTTP/1.1`;
    // `curl -X POST`: neither Content-Length nor Transfer-Encoding nor Content-Type.
    const bare = await rawRequest(api, registrations, [await auth('reg-1')]);
    expect([bare.status, bare.json]).toEqual([201, { registered: true }]);
    const again = await rawRequest(api, registrations, [await auth('reg-1')]);
    expect([again.status, again.json]).toEqual([200, { registered: true }]);
    const chunked = await rawRequest(
      api,
      registrations,
      [await auth('reg-2'), 'transfer-encoding: chunked'],
      '0\r\n\r\n',
    );
    expect([chunked.status, chunked.json]).toEqual([201, { registered: true }]);
    const chunkedText = await rawRequest(
      api,
      registrations,
      [await auth('reg-2'), 'transfer-encoding: chunked', 'content-type: text/plain'],
      '0\r\n\r\n',
    );
    expect(chunkedText.status).toBe(200);
    // A body that is there must still be JSON.
    const text = await rawRequest(
      api,
      registrations,
      [await auth('reg-3'), 'transfer-encoding: chunked', 'content-type: text/plain'],
      '5\r\nhello\r\n0\r\n\r\n',
    );
    expect([text.status, text.code]).toEqual([415, 'UNSUPPORTED_MEDIA_TYPE']);
    const sized = await rawRequest(
      api,
      registrations,
      [await auth('reg-3'), 'content-type: text/plain', 'content-length: 5'],
      'hello',
    );
    expect([sized.status, sized.code]).toEqual([415, 'UNSUPPORTED_MEDIA_TYPE']);
    const untyped = await rawRequest(api, registrations, [await auth('reg-3'), 'content-length: 2'], '{}');
    expect([untyped.status, untyped.code]).toEqual([415, 'UNSUPPORTED_MEDIA_TYPE']);

    // The refund's optional body ("no body is {}").
    const a = await paidOrder();
    const noBody = await rawRequest(api, `POST ${refundPath(a)} HTTP/1.1`, [await auth(a.userId)]);
    expect([noBody.status, noBody.json.outcome]).toEqual([202, 'requested']);
    const b = await paidOrder();
    const emptyChunked = await rawRequest(
      api,
      `POST ${refundPath(b)} HTTP/1.1`,
      [await auth(b.userId), 'transfer-encoding: chunked'],
      '0\r\n\r\n',
    );
    expect([emptyChunked.status, emptyChunked.json.outcome]).toEqual([202, 'requested']);
    const c = await paidOrder();
    const before = await state(c.orderId);
    const textRefund = await rawRequest(
      api,
      `POST ${refundPath(c)} HTTP/1.1`,
      [await auth(c.userId), 'transfer-encoding: chunked', 'content-type: text/plain'],
      '3\r\nwhy\r\n0\r\n\r\n',
    );
    expect([textRefund.status, textRefund.code]).toEqual([415, 'UNSUPPORTED_MEDIA_TYPE']);
    expect(await state(c.orderId)).toEqual(before);

    // Routes that need a JSON body keep their answer.
    for (const path of [`/v1/activities/${activityId}/order-codes`, `/v1/activities/${activityId}/orders`]) {
      const r = await rawRequest(api, `POST ${path} HTTP/1.1`, [await auth('reg-4')]);
      expect({ path, status: r.status, code: r.code }).toEqual({
        path,
        status: 415,
        code: 'UNSUPPORTED_MEDIA_TYPE',
      });
    }
  });

  test("body-parser's 415s stay 415s; an undecodable path is a 400 that says so", async () => {
    const o = await paidOrder();
    const before = await state(o.orderId);
    for (const head of [
      ['content-type: application/json; charset=latin1'],
      ['content-type: application/json; charset=iso-8859-1'],
      ['content-encoding: compress'],
      ['content-encoding: x-unknown'],
    ]) {
      const r = await refund(o, '{}', head);
      expect({ head, status: r.status, code: r.code }).toEqual({
        head,
        status: 415,
        code: 'UNSUPPORTED_MEDIA_TYPE',
      });
    }
    // `application/json-…` types are not JSON to body-parser: refused, never taken as no body (a
    // refund requested on a body nobody read).
    const orders = `POST /v1/activities/${activityId}/orders HTTP/1.1`;
    const submission = JSON.stringify({ skuId: 'sku-1', quantity: 1, requestId: 'json-type' });
    for (const type of ['application/json-patch+json', 'application/json-seq']) {
      const r = await refund(o, '{"bogus":1}', [`content-type: ${type}`]);
      const s = await rawRequest(
        api,
        orders,
        [
          `authorization: Bearer ${await buyerToken('json-type')}`,
          `content-type: ${type}`,
          `content-length: ${Buffer.byteLength(submission)}`,
        ],
        submission,
      );
      expect({ type, refund: [r.status, r.code], submit: [s.status, s.code] }).toEqual({
        type,
        refund: [415, 'UNSUPPORTED_MEDIA_TYPE'],
        submit: [415, 'UNSUPPORTED_MEDIA_TYPE'],
      });
    }
    // The scheme is case-insensitive (RFC 9110 §11.1); the JSON type takes parameters.
    const lower = await rawRequest(
      api,
      orders,
      [
        `authorization: bearer ${await buyerToken('json-type')}`,
        'content-type: Application/JSON ; charset=utf-8',
        `content-length: ${Buffer.byteLength(submission)}`,
      ],
      submission,
    );
    expect(lower.status).toBe(202);
    const malformed = await refund(o, '{"reason":');
    expect([malformed.status, malformed.code, malformed.detail]).toEqual([
      400,
      'VALIDATION_ERROR',
      'malformed JSON body',
    ]);
    expect(await state(o.orderId)).toEqual(before);
    const token = await buyerToken(o.userId);
    for (const line of [
      `GET /v1/activities/${activityId}/orders/%E0%A4%A HTTP/1.1`,
      `GET /v1/activities/%ZZ/orders/${o.reservationId} HTTP/1.1`,
      `DELETE /v1/activities/${activityId}/orders/%C0 HTTP/1.1`,
    ]) {
      const r = await rawRequest(api, line, [`authorization: Bearer ${token}`]);
      expect({ line, status: r.status, code: r.code, detail: r.detail }).toEqual({
        line,
        status: 400,
        code: 'VALIDATION_ERROR',
        detail: 'malformed percent-encoding in the path',
      });
    }
    expect(await state(o.orderId)).toEqual(before);
  });
});
