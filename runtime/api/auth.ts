/**
 * Buyer identity from a signed bearer token (jose). The keys come from one of:
 * - JWT_HS256_SECRET: one HMAC secret (HS256);
 * - JWT_RS256_PUBLIC_KEY: one RSA public key (PEM, SPKI; RS256);
 * - JWT_JWKS: a JSON Web Key Set whose keys each carry a `kid` (RSA → RS256, oct → HS256), so keys
 *   can rotate: publish the new key beside the old, switch the issuer, drop the old one later.
 *
 * Every token must carry `sub`, `exp` and `iat`; it is refused once older than
 * JWT_MAX_TOKEN_AGE_SECONDS (counted from `iat`, whatever its `exp` says), and its `iss`/`aud` are
 * checked when JWT_ISSUER/JWT_AUDIENCE are set (the chart requires both by default). Weak keys are
 * refused at start (RSA under 2048 bits, HMAC secrets under 32 bytes) with a message, rather than
 * accepted and then failing every request.
 *
 * Verification sits behind one small function, createTokenVerifier(): token in, subject out. It is
 * on every buyer request, so it is kept cheap (keys imported once, no per-request allocation
 * beyond jose's) and replaceable by another JWT library without touching the middleware.
 */
import { createPublicKey } from 'node:crypto';
import type { JsonWebKey as NodeJwk, KeyObject } from 'node:crypto';
import type { RequestHandler } from 'express';
import { importJWK, importSPKI, jwtVerify } from 'jose';
import type { JWK, JWTVerifyOptions, JWSHeaderParameters } from 'jose';
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

/** Verifies a bearer token and returns its subject (the buyer id); throws on any defect. */
export type TokenVerifier = (token: string) => Promise<string>;

/** Buyer ids become part of Redis keys and rows: a bounded, printable alphabet. */
const USER_ID = /^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$/;

export const MIN_RSA_BITS = 2048;
export const MIN_HMAC_BYTES = 32;
export const DEFAULT_MAX_TOKEN_AGE_SECONDS = 3600;

type Alg = 'HS256' | 'RS256';
type VerifyKey = Awaited<ReturnType<typeof importSPKI>> | Uint8Array;

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

async function hmacKey(secret: Uint8Array, where: string): Promise<VerifyKey> {
  if (secret.byteLength < MIN_HMAC_BYTES) {
    throw new AuthConfigError(
      `${where}: the HS256 secret has ${secret.byteLength} bytes; use at least ${MIN_HMAC_BYTES}`,
    );
  }
  // Imported once: given raw bytes, jose would import a CryptoKey on every request (measured:
  // about half of the verification's cost).
  return crypto.subtle.importKey('raw', secret, { name: 'HMAC', hash: 'SHA-256' }, false, ['verify']);
}

async function keysFromJwks(text: string): Promise<KeyEntry[]> {
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
  for (const [i, raw] of (keys as JWK[]).entries()) {
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
      out.push({
        kid: raw.kid,
        alg: 'RS256',
        key: (await importJWK({ ...raw, alg: 'RS256' }, 'RS256')) as VerifyKey,
      });
    } else if (raw.kty === 'oct') {
      if (raw.alg !== undefined && raw.alg !== 'HS256')
        throw new AuthConfigError(`${where}: only HS256 is accepted for oct keys`);
      if (typeof raw.k !== 'string') throw new AuthConfigError(`${where}: an oct key needs "k"`);
      out.push({ kid: raw.kid, alg: 'HS256', key: await hmacKey(Buffer.from(raw.k, 'base64url'), where) });
    } else {
      throw new AuthConfigError(`${where}: kty "${String(raw.kty)}" is not supported (RSA or oct)`);
    }
  }
  return out;
}

async function loadKeys(cfg: AuthConfig): Promise<KeyEntry[]> {
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
    return [{ kid: undefined, alg: 'RS256', key: await importSPKI(cfg.JWT_RS256_PUBLIC_KEY, 'RS256') }];
  }
  return [
    {
      kid: undefined,
      alg: 'HS256',
      key: await hmacKey(new TextEncoder().encode(cfg.JWT_HS256_SECRET ?? ''), 'JWT_HS256_SECRET'),
    },
  ];
}

/**
 * Builds the one token check of the api. Throws AuthConfigError at start for unusable keys or
 * settings; the returned function throws on any bad token.
 */
export async function createTokenVerifier(cfg: AuthConfig): Promise<TokenVerifier> {
  const keys = await loadKeys(cfg);
  const maxAge = cfg.JWT_MAX_TOKEN_AGE_SECONDS ?? DEFAULT_MAX_TOKEN_AGE_SECONDS;
  if (!Number.isInteger(maxAge) || maxAge < 1) {
    throw new AuthConfigError('JWT_MAX_TOKEN_AGE_SECONDS: a whole number of seconds >= 1');
  }
  const options: JWTVerifyOptions = {
    algorithms: [...new Set(keys.map((k) => k.alg))],
    requiredClaims: ['sub', 'exp', 'iat'],
    // Requires `iat` and refuses tokens older than this, whatever their `exp` says.
    maxTokenAge: maxAge,
    clockTolerance: cfg.JWT_CLOCK_TOLERANCE_SECONDS ?? 30,
  };
  if (cfg.JWT_ISSUER) options.issuer = cfg.JWT_ISSUER;
  if (cfg.JWT_AUDIENCE) options.audience = cfg.JWT_AUDIENCE;
  const byKid = new Map(keys.filter((k) => k.kid !== undefined).map((k) => [k.kid!, k]));
  const only = keys.length === 1 ? keys[0]! : undefined;
  const keyFor = (header: JWSHeaderParameters): VerifyKey => {
    // With a key set the token names its key; a single configured key accepts any kid.
    const entry =
      header.kid !== undefined
        ? (byKid.get(header.kid) ?? (only?.kid === undefined ? only : undefined))
        : only;
    if (!entry || entry.alg !== header.alg) throw new Error('no key for this token');
    return entry.key;
  };
  return async (token) => {
    const { payload } = await jwtVerify(token, keyFor, options);
    if (typeof payload.sub !== 'string' || !USER_ID.test(payload.sub)) throw new Error('unusable subject');
    return payload.sub;
  };
}

export async function bearerAuth(cfg: AuthConfig): Promise<RequestHandler> {
  const verify = await createTokenVerifier(cfg);
  return (req, res, next) => {
    const header = req.headers.authorization ?? '';
    const m = /^Bearer ([A-Za-z0-9._-]+)$/.exec(header);
    if (!m) {
      next(new FlashSaleError('UNAUTHORIZED', 'missing bearer token'));
      return;
    }
    verify(m[1]!).then(
      (sub) => {
        res.locals.userId = sub;
        next();
      },
      () => next(new FlashSaleError('UNAUTHORIZED', 'invalid, expired or too old token')),
    );
  };
}
