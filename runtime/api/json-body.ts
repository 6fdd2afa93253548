/**
 * The JSON body reader of the buyer routes: `express.json({ strict: true, limit })` with the same
 * answers, reading the stream itself in the common case. body-parser costs about as much per
 * request as express' routing (docs/benchmarks.md, "Floors"): type-is, content-type parsing,
 * iconv-lite and raw-body's bookkeeping for a body of a few dozen bytes.
 *
 * Read here: `content-type: application/json` (optionally `; charset=utf-8`) with no
 * content-encoding (or `identity`). Anything else (compressed bodies, other charsets, other types)
 * goes to express.json() itself, so its rules and errors stay the single reference. The errors
 * carry body-parser's `type` and `status` (entity.too.large 413, request.size.invalid 400,
 * entity.parse.failed 400, request.aborted 400), which runtime/api/problem.ts maps to stable codes.
 */
import express from 'express';
import type { Request, RequestHandler } from 'express';

const UNITS: Record<string, number> = { b: 1, kb: 2 ** 10, mb: 2 ** 20, gb: 2 ** 30 };

/** `8kb`, `1mb`, `512` (bytes) → bytes, the way body-parser reads its `limit` (1024 per kb). */
export function parseByteLimit(limit: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb)?\s*$/i.exec(limit);
  if (!m) throw new Error(`not a size: ${limit} (for example 8kb)`);
  return Math.floor(Number(m[1]) * UNITS[(m[2] ?? 'b').toLowerCase()]!);
}

const FAST_TYPE = /^application\/json\s*(?:;\s*charset\s*=\s*"?utf-8"?\s*)?$/i;

function httpError(status: number, type: string, message: string): Error {
  return Object.assign(new Error(message), { status, statusCode: status, type, expose: true });
}

/** body-parser's strict mode: only an object or an array at the top; an empty body is `{}`. */
function parseStrict(text: string): unknown {
  if (text.length === 0) return {};
  let i = 0;
  // JSON's whitespace: space, tab, line feed, carriage return.
  for (let c = text.charCodeAt(0); c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;) {
    i += 1;
    c = text.charCodeAt(i);
  }
  const first = text[i];
  if (first !== '{' && first !== '[') {
    throw httpError(400, 'entity.parse.failed', `Unexpected token in JSON at position 0`);
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw httpError(400, 'entity.parse.failed', (err as Error).message);
  }
}

export function jsonBody(limitText: string): RequestHandler {
  const limit = parseByteLimit(limitText);
  const reference = express.json({ limit: limitText, strict: true });
  return (req: Request, res, next) => {
    const h = req.headers;
    const declared = h['content-length'];
    // type-is' hasBody: no Transfer-Encoding and no (numeric) Content-Length means no body.
    if (h['transfer-encoding'] === undefined && (declared === undefined || Number.isNaN(Number(declared)))) {
      req.body = undefined;
      next();
      return;
    }
    const encoding = h['content-encoding'];
    if (
      !FAST_TYPE.test(h['content-type'] ?? '') ||
      (encoding !== undefined && encoding.toLowerCase() !== 'identity')
    ) {
      reference(req, res, next);
      return;
    }
    const length = declared === undefined ? undefined : Number(declared);
    let failed: Error | undefined;
    // Like body-parser: on an error the rest of the body is read off before answering.
    const fail = (err: Error): void => {
      if (failed) return;
      failed = err;
      chunks.length = 0;
      if (req.complete || req.readableEnded) next(err);
      else req.once('end', () => next(err));
    };
    const chunks: Buffer[] = [];
    let received = 0;
    if (length !== undefined && length > limit) {
      req.resume();
      fail(httpError(413, 'entity.too.large', 'request entity too large'));
      return;
    }
    req.on('data', (chunk: Buffer) => {
      if (failed) return;
      received += chunk.length;
      if (received > limit) fail(httpError(413, 'entity.too.large', 'request entity too large'));
      else chunks.push(chunk);
    });
    // A client that went away sends no 'end': answer (to nobody) at once, as body-parser does.
    const gone = (message: string): void => {
      if (failed) return;
      failed = httpError(400, 'request.aborted', message);
      next(failed);
    };
    req.once('aborted', () => gone('request aborted'));
    req.once('error', (err) => gone(err.message));
    req.once('end', () => {
      if (failed) return;
      if (length !== undefined && received !== length) {
        next(httpError(400, 'request.size.invalid', 'request size did not match content length'));
        return;
      }
      let text = chunks.length === 1 ? chunks[0]!.toString('utf8') : Buffer.concat(chunks).toString('utf8');
      // iconv-lite (body-parser) drops a byte order mark; so does this reader.
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
      try {
        req.body = parseStrict(text);
      } catch (err) {
        next(err);
        return;
      }
      next();
    });
  };
}
