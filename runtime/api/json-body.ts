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
import type { NextFunction, Request, RequestHandler } from 'express';

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

/**
 * One request's body being read. The stream's listeners are functions shared by every request
 * (the stream calls them with `this` the request), so a request allocates this object and its
 * chunk list, not a closure per listener.
 */
interface BodyRead {
  next: NextFunction;
  limit: number;
  /** The declared Content-Length, if any. */
  length: number | undefined;
  chunks: Buffer[];
  received: number;
  /** The error answered; once set, the rest of the body is read off and ignored. */
  failed: Error | undefined;
  ended: boolean;
}

const BODY = Symbol('jsonBody');
type ReadingRequest = Request & { [BODY]?: BodyRead };

// Like body-parser: on an error the rest of the body is read off before answering.
function failRead(req: ReadingRequest, read: BodyRead, err: Error): void {
  if (read.failed || read.ended) return;
  read.failed = err;
  read.chunks.length = 0;
  if (req.complete || req.readableEnded) read.next(err);
  else req.once('end', () => read.next(err));
}

function onBodyData(this: ReadingRequest, chunk: Buffer): void {
  const read = this[BODY]!;
  if (read.failed) return;
  read.received += chunk.length;
  if (read.received > read.limit)
    failRead(this, read, httpError(413, 'entity.too.large', 'request entity too large'));
  else read.chunks.push(chunk);
}

// A client that went away sends no 'end': answer (to nobody) at once, as body-parser does.
function onBodyGone(read: BodyRead, message: string): void {
  if (read.failed || read.ended) return;
  read.failed = httpError(400, 'request.aborted', message);
  read.next(read.failed);
}

function onBodyAborted(this: ReadingRequest): void {
  onBodyGone(this[BODY]!, 'request aborted');
}

function onBodyError(this: ReadingRequest, err: Error): void {
  onBodyGone(this[BODY]!, err.message);
}

function onBodyEnd(this: ReadingRequest): void {
  const read = this[BODY]!;
  if (read.failed || read.ended) return;
  read.ended = true;
  if (read.length !== undefined && read.received !== read.length) {
    read.next(httpError(400, 'request.size.invalid', 'request size did not match content length'));
    return;
  }
  const { chunks } = read;
  let text = chunks.length === 1 ? chunks[0]!.toString('utf8') : Buffer.concat(chunks).toString('utf8');
  // iconv-lite (body-parser) drops a byte order mark; so does this reader.
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  try {
    this.body = parseStrict(text);
  } catch (err) {
    read.next(err);
    return;
  }
  read.next();
}

export function jsonBody(limitText: string): RequestHandler {
  const limit = parseByteLimit(limitText);
  const reference = express.json({ limit: limitText, strict: true });
  return (req: ReadingRequest, res, next) => {
    const h = req.headers;
    const declared = h['content-length'];
    const length = declared === undefined ? undefined : Number(declared);
    // type-is' hasBody: no Transfer-Encoding and no (numeric) Content-Length means no body.
    if (h['transfer-encoding'] === undefined && (length === undefined || Number.isNaN(length))) {
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
    const read: BodyRead = {
      next,
      limit,
      length,
      chunks: [],
      received: 0,
      failed: undefined,
      ended: false,
    };
    req[BODY] = read;
    if (read.length !== undefined && read.length > limit) {
      req.resume();
      failRead(req, read, httpError(413, 'entity.too.large', 'request entity too large'));
      return;
    }
    // 'end', 'aborted' and 'error' come at most once each; the state's flags answer only the first.
    req.on('data', onBodyData);
    req.on('aborted', onBodyAborted);
    req.on('error', onBodyError);
    req.on('end', onBodyEnd);
  };
}
