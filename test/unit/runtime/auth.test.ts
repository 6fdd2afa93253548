// The buyer token check (runtime/api/auth.ts): required claims, maximum age, issuer/audience, key
// sizes refused at start, and a key set whose kids let keys rotate. Pure crypto, no servers.
import { generateKeyPairSync } from 'node:crypto';
import { SignJWT, exportJWK } from 'jose';
import { AuthConfigError, createTokenVerifier } from '../../../runtime/api/auth.js';

const SECRET = 'unit-test-secret-unit-test-secret-0123';
const hsKey = new TextEncoder().encode(SECRET);
const now = (): number => Math.floor(Date.now() / 1000);

interface Claims {
  sub?: string;
  iat?: number;
  exp?: number;
  iss?: string;
  aud?: string;
}

function build(c: Claims): SignJWT {
  const t = new SignJWT({});
  if (c.sub !== undefined) t.setSubject(c.sub);
  if (c.iat !== undefined) t.setIssuedAt(c.iat);
  if (c.exp !== undefined) t.setExpirationTime(c.exp);
  if (c.iss !== undefined) t.setIssuer(c.iss);
  if (c.aud !== undefined) t.setAudience(c.aud);
  return t;
}

const hs = (c: Claims): Promise<string> => build(c).setProtectedHeader({ alg: 'HS256' }).sign(hsKey);
const fresh = (): Claims => ({ sub: 'alice', iat: now(), exp: now() + 600 });

function rsaPair(bits: number) {
  return generateKeyPairSync('rsa', { modulusLength: bits });
}

describe('buyer tokens', () => {
  test('a fresh token with sub, iat and exp passes and yields its subject', async () => {
    const verify = await createTokenVerifier({ JWT_HS256_SECRET: SECRET });
    await expect(verify(await hs(fresh()))).resolves.toBe('alice');
  });

  test('tokens without exp, iat or sub are refused', async () => {
    const verify = await createTokenVerifier({ JWT_HS256_SECRET: SECRET });
    const { exp: _e, ...noExp } = fresh();
    const { iat: _i, ...noIat } = fresh();
    const { sub: _s, ...noSub } = fresh();
    for (const c of [noExp, noIat, noSub]) await expect(verify(await hs(c))).rejects.toThrow();
  });

  test('a token older than the maximum age is refused even though it has not expired', async () => {
    const verify = await createTokenVerifier({ JWT_HS256_SECRET: SECRET, JWT_MAX_TOKEN_AGE_SECONDS: 600 });
    const old = await hs({ sub: 'alice', iat: now() - 3600, exp: now() + 86_400 });
    await expect(verify(old)).rejects.toThrow(/iat|age|past/);
    const future = await hs({ sub: 'alice', iat: now() + 3600, exp: now() + 7200 });
    await expect(verify(future)).rejects.toThrow();
  });

  test('issuer and audience are checked when configured', async () => {
    const verify = await createTokenVerifier({
      JWT_HS256_SECRET: SECRET,
      JWT_ISSUER: 'https://login.example/',
      JWT_AUDIENCE: 'flashsale',
    });
    const good = { ...fresh(), iss: 'https://login.example/', aud: 'flashsale' };
    await expect(verify(await hs(good))).resolves.toBe('alice');
    await expect(verify(await hs({ ...good, iss: 'https://evil.example/' }))).rejects.toThrow(/iss/);
    await expect(verify(await hs({ ...good, aud: 'other-service' }))).rejects.toThrow(/aud/);
    await expect(verify(await hs(fresh()))).rejects.toThrow();
  });

  test('an RS256 key under 2048 bits fails at start with a message naming the variable', async () => {
    const pem = rsaPair(1024).publicKey.export({ type: 'spki', format: 'pem' }).toString();
    const start = createTokenVerifier({ JWT_RS256_PUBLIC_KEY: pem });
    await expect(start).rejects.toBeInstanceOf(AuthConfigError);
    await expect(start).rejects.toThrow(
      /JWT_RS256_PUBLIC_KEY: the RSA key has 1024 bits; RS256 needs at least 2048/,
    );
  });

  test('an RS256 key of 2048 bits verifies RS256 tokens and refuses HS256 ones', async () => {
    const { publicKey, privateKey } = rsaPair(2048);
    const verify = await createTokenVerifier({
      JWT_RS256_PUBLIC_KEY: publicKey.export({ type: 'spki', format: 'pem' }).toString(),
    });
    const rs = await build(fresh()).setProtectedHeader({ alg: 'RS256' }).sign(privateKey);
    await expect(verify(rs)).resolves.toBe('alice');
    await expect(verify(await hs(fresh()))).rejects.toThrow();
  });

  test('a key set with two kids: tokens of either key pass, an unknown kid or a missing one is refused', async () => {
    const a = rsaPair(2048);
    const b = rsaPair(2048);
    const jwks = JSON.stringify({
      keys: [
        { ...(await exportJWK(a.publicKey)), kid: 'k-2026-01', alg: 'RS256', use: 'sig' },
        { ...(await exportJWK(b.publicKey)), kid: 'k-2026-02', alg: 'RS256', use: 'sig' },
      ],
    });
    const verify = await createTokenVerifier({ JWT_JWKS: jwks });
    const sign = (key: typeof a.privateKey, kid?: string) =>
      build(fresh())
        .setProtectedHeader(kid ? { alg: 'RS256', kid } : { alg: 'RS256' })
        .sign(key);
    await expect(verify(await sign(a.privateKey, 'k-2026-01'))).resolves.toBe('alice');
    await expect(verify(await sign(b.privateKey, 'k-2026-02'))).resolves.toBe('alice');
    // The right kid with the other key's signature, an unknown kid, no kid.
    await expect(verify(await sign(a.privateKey, 'k-2026-02'))).rejects.toThrow();
    await expect(verify(await sign(a.privateKey, 'k-gone'))).rejects.toThrow();
    await expect(verify(await sign(a.privateKey))).rejects.toThrow();
  });

  test('a key set of one key verifies a token that names no kid (as docs/install.md says); another kid is refused', async () => {
    const a = rsaPair(2048);
    const b = rsaPair(2048);
    const jwks = JSON.stringify({
      keys: [{ ...(await exportJWK(a.publicKey)), kid: 'k-2026-01', alg: 'RS256', use: 'sig' }],
    });
    const verify = await createTokenVerifier({ JWT_JWKS: jwks });
    const sign = (key: typeof a.privateKey, kid?: string) =>
      build(fresh())
        .setProtectedHeader(kid ? { alg: 'RS256', kid } : { alg: 'RS256' })
        .sign(key);
    await expect(verify(await sign(a.privateKey))).resolves.toBe('alice');
    await expect(verify(await sign(a.privateKey, 'k-2026-01'))).resolves.toBe('alice');
    await expect(verify(await sign(a.privateKey, 'k-other'))).rejects.toThrow(/kid/);
    await expect(verify(await sign(b.privateKey))).rejects.toThrow();
  });

  test('a key set is checked at start: kids required and distinct, key sizes, no private keys', async () => {
    const small = rsaPair(1024);
    const ok = rsaPair(2048);
    const pub = await exportJWK(ok.publicKey);
    const cases: [unknown, RegExp][] = [
      [{ keys: [{ ...pub }] }, /needs a "kid"/],
      [
        {
          keys: [
            { ...pub, kid: 'x' },
            { ...pub, kid: 'x' },
          ],
        },
        /duplicate kid "x"/,
      ],
      [{ keys: [{ ...(await exportJWK(small.publicKey)), kid: 's' }] }, /1024 bits/],
      [{ keys: [{ ...(await exportJWK(ok.privateKey)), kid: 'p' }] }, /private key/],
      [{ keys: [{ kty: 'oct', k: Buffer.from('short').toString('base64url'), kid: 'h' }] }, /at least 32/],
      [{ keys: [] }, /at least one key/],
    ];
    for (const [set, message] of cases) {
      await expect(createTokenVerifier({ JWT_JWKS: JSON.stringify(set) })).rejects.toThrow(message);
    }
    await expect(createTokenVerifier({ JWT_JWKS: '{nope' })).rejects.toThrow(/JWT_JWKS: not JSON/);
  });

  test('an HS256 key in a key set verifies tokens naming its kid', async () => {
    const jwks = JSON.stringify({
      keys: [{ kty: 'oct', kid: 'h1', k: Buffer.from(SECRET).toString('base64url') }],
    });
    const verify = await createTokenVerifier({ JWT_JWKS: jwks });
    const t = await build(fresh()).setProtectedHeader({ alg: 'HS256', kid: 'h1' }).sign(hsKey);
    await expect(verify(t)).resolves.toBe('alice');
  });

  test('exactly one key source', async () => {
    await expect(createTokenVerifier({})).rejects.toThrow(/set exactly one/);
    await expect(createTokenVerifier({ JWT_HS256_SECRET: SECRET, JWT_JWKS: '{"keys":[]}' })).rejects.toThrow(
      /set exactly one/,
    );
  });
});
