/** Buyer identity from a signed bearer token (jose): HS256 shared secret or RS256 public key. */
import type { RequestHandler } from 'express';
import { importSPKI, jwtVerify } from 'jose';
import type { JWTVerifyOptions } from 'jose';
import { FlashSaleError } from '../../core/errors.js';

export interface AuthConfig {
  JWT_HS256_SECRET?: string | undefined;
  JWT_RS256_PUBLIC_KEY?: string | undefined;
  JWT_ISSUER?: string | undefined;
  JWT_AUDIENCE?: string | undefined;
}

/** Buyer ids become part of Redis keys and rows: a bounded, printable alphabet. */
const USER_ID = /^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$/;

export async function bearerAuth(cfg: AuthConfig): Promise<RequestHandler> {
  // The key is imported once: given raw bytes, jose would import a CryptoKey on every request
  // (measured: about half of the verification's cost).
  const key = cfg.JWT_RS256_PUBLIC_KEY
    ? await importSPKI(cfg.JWT_RS256_PUBLIC_KEY, 'RS256')
    : await crypto.subtle.importKey(
        'raw',
        new TextEncoder().encode(cfg.JWT_HS256_SECRET ?? ''),
        { name: 'HMAC', hash: 'SHA-256' },
        false,
        ['verify'],
      );
  const options: JWTVerifyOptions = { algorithms: [cfg.JWT_RS256_PUBLIC_KEY ? 'RS256' : 'HS256'] };
  if (cfg.JWT_ISSUER) options.issuer = cfg.JWT_ISSUER;
  if (cfg.JWT_AUDIENCE) options.audience = cfg.JWT_AUDIENCE;
  return (req, res, next) => {
    const header = req.headers.authorization ?? '';
    const m = /^Bearer ([A-Za-z0-9._-]+)$/.exec(header);
    if (!m) {
      next(new FlashSaleError('UNAUTHORIZED', 'missing bearer token'));
      return;
    }
    jwtVerify(m[1]!, key, options).then(
      ({ payload }) => {
        if (typeof payload.sub !== 'string' || !USER_ID.test(payload.sub)) {
          next(new FlashSaleError('UNAUTHORIZED', 'the token has no usable subject'));
          return;
        }
        res.locals.userId = payload.sub;
        next();
      },
      () => next(new FlashSaleError('UNAUTHORIZED', 'invalid or expired token')),
    );
  };
}
