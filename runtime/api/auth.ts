/**
 * Buyer identity from a signed bearer token (fast-jwt). The keys come from one of:
 * - JWT_HS256_SECRET: one HMAC secret (HS256);
 * - JWT_RS256_PUBLIC_KEY: one RSA public key (PEM, SPKI; RS256);
 * - JWT_JWKS: a JSON Web Key Set whose keys each carry a `kid` (RSA → RS256, oct → HS256), so keys
 *   can rotate: publish the new key beside the old, switch the issuer, drop the old one later.
 *
 * Every token must carry `sub`, `exp` and `iat`; it is refused once older than
 * JWT_MAX_TOKEN_AGE_SECONDS (counted from `iat`, whatever its `exp` says) or when its `iat` lies in
 * the future, and its `iss`/`aud` are checked when JWT_ISSUER/JWT_AUDIENCE are set (the chart
 * requires both by default). Weak keys are refused at start (RSA under 2048 bits, HMAC secrets
 * under 32 bytes) with a message, rather than accepted and then failing every request.
 *
 * Verification sits behind one small function, createTokenVerifier(): token in, subject out. It is
 * on every buyer request, so it runs synchronously with node:crypto (fast-jwt): jose verifies
 * through WebCrypto, one thread-pool job and promise per token, which cost the api more CPU than
 * everything else of a reservation together (docs/benchmarks.md, "Where the time goes"). RS256
 * results are cached per token (an RSA verification costs tens of microseconds; a buyer polling
 * an order sends the same token again); HS256 is not, its HMAC costs about what the cache's own
 * token hash would.
 */
import { createPublicKey } from 'node:crypto';
import type { JsonWebKey as NodeJwk, KeyObject } from 'node:crypto';
import type { RequestHandler } from 'express';
import { createVerifier, TokenError } from 'fast-jwt';
import { FlashSaleError } from '../../core/errors.js';

export interface AuthConfig {
  JWT_HS256_SECRET?: string | undefined;
  JWT_RS256_PUBLIC_KEY?: string | undefined;
  /** JSON Web Key Set (`{"keys":[…]}`), every key with a distinct `kid`. */
  JWT_JWKS?: string | undefined;
  JWT_ISSUER?: string | undefined;
  JWT_AUDIENCE?: string | undefined;
  /** Oldest accepted token, in seconds since its `iat` (default 3600). */
  JWT_MAX_TOKEN_AGE_SECONDS?: number | undefined;
  /** Clock skew allowed on `exp`, `nbf` and `iat` (default 30). */
  JWT_CLOCK_TOLERANCE_SECONDS?: number | undefined;
}

/** Verifies a bearer token and returns its subject (the buyer id); rejects on any defect. */
export type TokenVerifier = (token: string) => Promise<string>;

/** The same check, synchronous: returns the subject or throws (what the api's middleware calls). */
export type SyncTokenVerifier = (token: string) => string;

/** Buyer ids become part of Redis keys and rows: a bounded, printable alphabet. */
const USER_ID = /^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$/;

export const MIN_RSA_BITS = 2048;
export const MIN_HMAC_BYTES = 32;
export const DEFAULT_MAX_TOKEN_AGE_SECONDS = 3600;

type Alg = 'HS256' | 'RS256';
/** An HMAC secret, or an RSA public key as SPKI PEM (what fast-jwt takes). */
type VerifyKey = Buffer | string;

interface KeyEntry {
  kid: string | undefined;
  alg: Alg;
  key: VerifyKey;
}

/** A configuration error found at start: the message names the variable and what is wrong. */
export class AuthConfigError extends Error {
  constructor(message: string) {
    super(`invalid configuration:\n  ${message}`);
    this.name = 'AuthConfigError';
  }
}

function rsaBits(k: KeyObject): number {
  return k.asymmetricKeyDetails?.modulusLength ?? 0;
}

function checkRsa(k: KeyObject, where: string): void {
  if (k.asymmetricKeyType !== 'rsa') {
    throw new AuthConfigError(
      `${where}: an RSA public key is required (got ${k.asymmetricKeyType ?? 'none'})`,
    );
  }
  const bits = rsaBits(k);
  if (bits < MIN_RSA_BITS) {
    throw new AuthConfigError(
      `${where}: the RSA key has ${bits} bits; RS256 needs at least ${MIN_RSA_BITS} (every token would be refused)`,
    );
  }
}

function hmacKey(secret: Buffer, where: string): VerifyKey {
  if (secret.byteLength < MIN_HMAC_BYTES) {
    throw new AuthConfigError(
      `${where}: the HS256 secret has ${secret.byteLength} bytes; use at least ${MIN_HMAC_BYTES}`,
    );
  }
  return secret;
}

const spkiPem = (k: KeyObject): string => k.export({ type: 'spki', format: 'pem' }).toString();

interface Jwk {
  kty?: unknown;
  kid?: unknown;
  use?: unknown;
  alg?: unknown;
  d?: unknown;
  k?: unknown;
}

function keysFromJwks(text: string): KeyEntry[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new AuthConfigError(`JWT_JWKS: not JSON (${(err as Error).message})`);
  }
  const keys = (parsed as { keys?: unknown }).keys;
  if (!Array.isArray(keys) || keys.length === 0)
    throw new AuthConfigError('JWT_JWKS: needs {"keys": [ … ]} with at least one key');
  const out: KeyEntry[] = [];
  for (const [i, raw] of (keys as Jwk[]).entries()) {
    const where = `JWT_JWKS keys[${i}]`;
    if (typeof raw.kid !== 'string' || raw.kid === '')
      throw new AuthConfigError(`${where}: every key needs a "kid"`);
    if (out.some((e) => e.kid === raw.kid)) throw new AuthConfigError(`${where}: duplicate kid "${raw.kid}"`);
    if (raw.use !== undefined && raw.use !== 'sig')
      throw new AuthConfigError(`${where}: "use" must be "sig"`);
    if (raw.kty === 'RSA') {
      if (raw.alg !== undefined && raw.alg !== 'RS256')
        throw new AuthConfigError(`${where}: only RS256 is accepted for RSA keys`);
      if (raw.d !== undefined)
        throw new AuthConfigError(`${where}: a private key; publish only the public part`);
      let ko: KeyObject;
      try {
        ko = createPublicKey({ key: raw as NodeJwk, format: 'jwk' });
      } catch (err) {
        throw new AuthConfigError(`${where}: not a usable RSA key (${(err as Error).message})`);
      }
      checkRsa(ko, where);
      out.push({ kid: raw.kid, alg: 'RS256', key: spkiPem(ko) });
    } else if (raw.kty === 'oct') {
      if (raw.alg !== undefined && raw.alg !== 'HS256')
        throw new AuthConfigError(`${where}: only HS256 is accepted for oct keys`);
      if (typeof raw.k !== 'string') throw new AuthConfigError(`${where}: an oct key needs "k"`);
      out.push({ kid: raw.kid, alg: 'HS256', key: hmacKey(Buffer.from(raw.k, 'base64url'), where) });
    } else {
      throw new AuthConfigError(`${where}: kty "${String(raw.kty)}" is not supported (RSA or oct)`);
    }
  }
  return out;
}

function loadKeys(cfg: AuthConfig): KeyEntry[] {
  const set = [cfg.JWT_HS256_SECRET, cfg.JWT_RS256_PUBLIC_KEY, cfg.JWT_JWKS].filter(Boolean).length;
  if (set !== 1) {
    throw new AuthConfigError('JWT_HS256_SECRET, JWT_RS256_PUBLIC_KEY, JWT_JWKS: set exactly one of them');
  }
  if (cfg.JWT_JWKS) return keysFromJwks(cfg.JWT_JWKS);
  if (cfg.JWT_RS256_PUBLIC_KEY) {
    let ko: KeyObject;
    try {
      ko = createPublicKey(cfg.JWT_RS256_PUBLIC_KEY);
    } catch (err) {
      throw new AuthConfigError(`JWT_RS256_PUBLIC_KEY: not a PEM public key (${(err as Error).message})`);
    }
    checkRsa(ko, 'JWT_RS256_PUBLIC_KEY');
    return [{ kid: undefined, alg: 'RS256', key: spkiPem(ko) }];
  }
  return [
    {
      kid: undefined,
      alg: 'HS256',
      key: hmacKey(Buffer.from(cfg.JWT_HS256_SECRET ?? '', 'utf8'), 'JWT_HS256_SECRET'),
    },
  ];
}

/** fast-jwt's error, or ours, as a message that says which check failed (never the token). */
function reason(err: unknown, payload: () => { iat?: unknown }, maxAge: number, tolerance: number): string {
  if (err instanceof TokenError && err.code === TokenError.codes.expired) {
    const iat = payload().iat;
    if (typeof iat === 'number' && Date.now() / 1000 - iat > maxAge + tolerance)
      return `the token is older than ${maxAge} s ("iat" claim, maximum age)`;
  }
  return (err as Error).message;
}

const decodePart = (part: string | undefined): Record<string, unknown> => {
  try {
    const v: unknown = JSON.parse(Buffer.from(part ?? '', 'base64url').toString('utf8'));
    return v !== null && typeof v === 'object' ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
};

/**
 * Builds the one token check of the api, synchronous. Throws AuthConfigError at start for
 * unusable keys or settings; the returned function throws on any bad token.
 */
export function createSyncTokenVerifier(cfg: AuthConfig): SyncTokenVerifier {
  const keys = loadKeys(cfg);
  const maxAge = cfg.JWT_MAX_TOKEN_AGE_SECONDS ?? DEFAULT_MAX_TOKEN_AGE_SECONDS;
  if (!Number.isInteger(maxAge) || maxAge < 1) {
    throw new AuthConfigError('JWT_MAX_TOKEN_AGE_SECONDS: a whole number of seconds >= 1');
  }
  const tolerance = cfg.JWT_CLOCK_TOLERANCE_SECONDS ?? 30;
  const required = ['sub', 'exp', 'iat'];
  // A configured issuer or audience is required, not only checked when present.
  if (cfg.JWT_ISSUER) required.push('iss');
  if (cfg.JWT_AUDIENCE) required.push('aud');
  const verifierFor = (k: KeyEntry): ((token: string) => Record<string, unknown>) =>
    createVerifier({
      key: k.key,
      // One algorithm per key: a token cannot pick HS256 against an RSA key or the reverse.
      algorithms: [k.alg],
      requiredClaims: required,
      // fast-jwt counts the maximum age without the clock tolerance; the tolerance is added so the
      // boundary is where it always was (now - iat > maximum age + tolerance is refused).
      maxAge: (maxAge + tolerance) * 1000,
      clockTolerance: tolerance * 1000,
      ...(cfg.JWT_ISSUER ? { allowedIss: cfg.JWT_ISSUER } : {}),
      ...(cfg.JWT_AUDIENCE ? { allowedAud: cfg.JWT_AUDIENCE } : {}),
      ...(k.alg === 'RS256' ? { cache: 10_000 } : {}),
    }) as (token: string) => Record<string, unknown>;
  const entries = keys.map((k) => ({ ...k, verify: verifierFor(k) }));
  const byKid = new Map(entries.filter((k) => k.kid !== undefined).map((k) => [k.kid!, k]));
  const only = entries.length === 1 ? entries[0]! : undefined;
  // A single configured key (not a key set) accepts any kid: the header need not be read. A key
  // set of one key takes a token that names no kid (docs/install.md: a kid is needed only with
  // several keys), and refuses one naming another key.
  const fixed = only?.kid === undefined ? only : undefined;
  return (token) => {
    const kid = fixed ? undefined : decodePart(token.split('.', 1)[0]).kid;
    const entry = fixed ?? (kid === undefined ? only : byKid.get(kid as string));
    if (!entry) throw new Error('no key for this token ("kid")');
    let payload: Record<string, unknown>;
    try {
      payload = entry.verify(token);
    } catch (err) {
      throw new Error(reason(err, () => decodePart(token.split('.')[1]), maxAge, tolerance));
    }
    // fast-jwt checks iat only for the maximum age; a token issued in the future is refused too.
    if ((payload.iat as number) > Date.now() / 1000 + tolerance)
      throw new Error('the "iat" claim lies in the future (it should be in the past)');
    const sub = payload.sub;
    if (typeof sub !== 'string' || !USER_ID.test(sub)) throw new Error('unusable subject');
    return sub;
  };
}

/** The same check behind a promise (the interface other callers and the tests use). */
export async function createTokenVerifier(cfg: AuthConfig): Promise<TokenVerifier> {
  const verify = createSyncTokenVerifier(cfg);
  return async (token) => verify(token);
}

/** RFC 9110 §11.1: the scheme is case-insensitive, one or more spaces before the token. */
export const BEARER = /^Bearer +([A-Za-z0-9._-]+)$/i;

export async function bearerAuth(cfg: AuthConfig): Promise<RequestHandler> {
  const verify = createSyncTokenVerifier(cfg);
  return (req, res, next) => {
    const m = BEARER.exec(req.headers.authorization ?? '');
    if (!m) {
      next(new FlashSaleError('UNAUTHORIZED', 'missing bearer token'));
      return;
    }
    let sub: string;
    try {
      sub = verify(m[1]!);
    } catch {
      next(new FlashSaleError('UNAUTHORIZED', 'invalid, expired or too old token'));
      return;
    }
    res.locals.userId = sub;
    next();
  };
}
