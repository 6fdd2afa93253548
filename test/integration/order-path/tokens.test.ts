// Buyer tokens on the real api process (runtime/api/auth.ts): tokens without exp, too old, or for
// another issuer/audience get 401 problem+json UNAUTHORIZED; keys rotate through a key set with
// kids; an RS256 key under 2048 bits stops the start with a message. Also: /metrics is served on
// its own port only, never on the buyer port.
import { generateKeyPairSync } from 'node:crypto';
import type { KeyObject } from 'node:crypto';
import { SignJWT, exportJWK } from 'jose';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { JWT_SECRET, httpClient, startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

const ISSUER = 'https://login.shop.example/';
const AUDIENCE = 'flashsale-buyers';
const now = (): number => Math.floor(Date.now() / 1000);

interface Claims {
  sub?: string;
  iat?: number;
  exp?: number;
  iss?: string;
  aud?: string;
}

function claims(c: Claims): SignJWT {
  const t = new SignJWT({});
  if (c.sub !== undefined) t.setSubject(c.sub);
  if (c.iat !== undefined) t.setIssuedAt(c.iat);
  if (c.exp !== undefined) t.setExpirationTime(c.exp);
  if (c.iss !== undefined) t.setIssuer(c.iss);
  if (c.aud !== undefined) t.setAudience(c.aud);
  return t;
}

const good = (): Claims => ({ sub: 'alice', iat: now(), exp: now() + 600, iss: ISSUER, aud: AUDIENCE });
const hs256 = (c: Claims): Promise<string> =>
  claims(c).setProtectedHeader({ alg: 'HS256' }).sign(new TextEncoder().encode(JWT_SECRET));

describe('buyer tokens on the api', () => {
  let db: FreshDatabase;
  const http = httpClient(4);
  const procs: RoleProcess[] = [];
  const activityId = uniqueId('tok');

  beforeAll(async () => {
    db = await freshDatabase();
  });

  afterAll(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await http.close();
    await db.drop();
  });

  const start = async (env: Record<string, string | undefined>): Promise<RoleProcess> => {
    const p = await startRole('api', { databaseUrl: db.url, env });
    procs.push(p);
    return p;
  };
  /** A buyer route that needs nothing loaded: an unknown reservation is 404 once authenticated. */
  const call = (api: RoleProcess, token: string) =>
    http.get(`${api.url}/v1/activities/${activityId}/orders/no-such-reservation`, token);
  const expectUnauthorized = async (api: RoleProcess, token: string): Promise<void> => {
    const r = await http.raw(`${api.url}/v1/activities/${activityId}/orders/no-such-reservation`, {
      method: 'GET',
      headers: { authorization: `Bearer ${token}` },
    });
    expect([r.status, r.contentType.split(';')[0], r.json.code]).toEqual([
      401,
      'application/problem+json',
      'UNAUTHORIZED',
    ]);
  };

  test('without exp, too old, or for another issuer or audience: 401 UNAUTHORIZED', async () => {
    const api = await start({
      JWT_ISSUER: ISSUER,
      JWT_AUDIENCE: AUDIENCE,
      JWT_MAX_TOKEN_AGE_SECONDS: '600',
    });
    expect((await call(api, await hs256(good()))).status).toBe(404);
    const { exp: _e, ...noExp } = good();
    const { iat: _i, ...noIat } = good();
    await expectUnauthorized(api, await hs256(noExp));
    await expectUnauthorized(api, await hs256(noIat));
    await expectUnauthorized(api, await hs256({ ...good(), iat: now() - 3600, exp: now() + 86_400 }));
    await expectUnauthorized(api, await hs256({ ...good(), iss: 'https://other-issuer.example/' }));
    await expectUnauthorized(api, await hs256({ ...good(), aud: 'another-service' }));
    const { iss: _s, aud: _a, ...noIssAud } = good();
    await expectUnauthorized(api, await hs256(noIssAud));

    // /metrics is on the metrics port only; probes answer on both.
    expect((await http.get(`${api.url}/metrics`)).status).toBe(404);
    const metrics = await http.raw(`${api.metricsUrl}/metrics`, { method: 'GET' });
    expect(metrics.status).toBe(200);
    expect(String(metrics.json.raw)).toContain('flashsale_http_request_duration_seconds');
    for (const base of [api.url, api.metricsUrl]) {
      expect((await http.get(`${base}/healthz`)).status).toBe(200);
      expect((await http.get(`${base}/readyz`)).status).toBe(200);
    }
  });

  test('a key set with two kids: both keys work during a rotation; an unknown kid does not', async () => {
    const pair = (): { publicKey: KeyObject; privateKey: KeyObject } =>
      generateKeyPairSync('rsa', { modulusLength: 2048 });
    const [oldKey, newKey, strayKey] = [pair(), pair(), pair()];
    const jwks = JSON.stringify({
      keys: [
        { ...(await exportJWK(oldKey.publicKey)), kid: 'old', alg: 'RS256', use: 'sig' },
        { ...(await exportJWK(newKey.publicKey)), kid: 'new', alg: 'RS256', use: 'sig' },
      ],
    });
    const api = await start({ JWT_HS256_SECRET: undefined, JWT_JWKS: jwks });
    const { iss: _s, aud: _a, ...c } = good();
    const rs256 = (key: KeyObject, kid: string) =>
      claims(c).setProtectedHeader({ alg: 'RS256', kid }).sign(key);
    expect((await call(api, await rs256(oldKey.privateKey, 'old'))).status).toBe(404);
    expect((await call(api, await rs256(newKey.privateKey, 'new'))).status).toBe(404);
    await expectUnauthorized(api, await rs256(strayKey.privateKey, 'stray'));
    await expectUnauthorized(api, await rs256(strayKey.privateKey, 'new'));
    await expectUnauthorized(api, await hs256(c));
  });

  test('an RS256 key under 2048 bits stops the start with a message', async () => {
    const { publicKey } = generateKeyPairSync('rsa', { modulusLength: 1024 });
    const api = await startRole('api', {
      databaseUrl: db.url,
      waitReady: false,
      env: {
        JWT_HS256_SECRET: undefined,
        JWT_RS256_PUBLIC_KEY: publicKey.export({ type: 'spki', format: 'pem' }).toString(),
      },
    });
    expect(await api.exited).toBe(1);
    // 'exit' can come before the last output: wait (bounded) for the message itself.
    await waitFor(
      'the start error message',
      async () =>
        /JWT_RS256_PUBLIC_KEY: the RSA key has 1024 bits; RS256 needs at least 2048/.test(api.output()),
      10_000,
    );
  });
});
