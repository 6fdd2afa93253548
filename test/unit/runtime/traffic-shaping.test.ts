// API_TRUST_PROXY as express' `trust proxy`, and the Retry-After of a rate-limit refusal.
import { RateLimiterRes } from 'rate-limiter-flexible';
import { loadRuntimeConfig, trustProxySetting } from '../../../runtime/config.js';
import { claimedBuyer, retryAfterSeconds } from '../../../runtime/api/rate-limit.js';

describe('API_TRUST_PROXY', () => {
  test.each([
    ['', false],
    ['0', false],
    ['false', false],
    ['1', 1],
    ['2', 2],
    ['loopback', ['loopback']],
    [' loopback, 10.0.0.0/8 ,', ['loopback', '10.0.0.0/8']],
  ])('%j -> %j', (value, expected) => {
    expect(trustProxySetting(value)).toEqual(expected);
  });

  test('admission defaults leave room for an honest crowd; negative figures are refused', () => {
    const env = {
      DATABASE_URL: 'postgres://u@127.0.0.1/db',
      REDIS_URL: 'redis://127.0.0.1:6379',
      KAFKA_BROKERS: '127.0.0.1:9092',
      JWT_HS256_SECRET: 's'.repeat(32),
    };
    const c = loadRuntimeConfig('api', env);
    expect([c.API_TRUST_PROXY, c.API_MAX_IN_FLIGHT, c.API_MAX_EVENT_LOOP_DELAY_MS]).toEqual(['', 1000, 1000]);
    expect(() => loadRuntimeConfig('api', { ...env, API_MAX_IN_FLIGHT: '-1' })).toThrow(/API_MAX_IN_FLIGHT/);
  });
});

describe('Retry-After of a refusal', () => {
  test.each([
    [0, 1],
    [1, 1],
    [999, 1],
    [1000, 1],
    [1001, 2],
    [9_500, 10],
  ])('%d ms before the window ends -> %d s', (ms, s) => {
    expect(retryAfterSeconds(new RateLimiterRes(0, ms, 21, false))).toBe(s);
  });
});

describe('the claimed buyer of a token (read without verifying, only to refuse known-blocked buyers)', () => {
  const token = (payload: unknown): string =>
    `Bearer e30.${Buffer.from(JSON.stringify(payload)).toString('base64url')}.sig`;
  test.each([
    [token({ sub: 'b-1' }), 'b-1'],
    [token({ sub: '用户' }), '用户'],
    [token({ sub: 7 }), undefined],
    [token({}), undefined],
    ['Bearer not-a-jwt', undefined],
    ['Bearer a.%%%.c', undefined],
    ['Basic abc', undefined],
    [undefined, undefined],
    [`Bearer a.${'x'.repeat(5000)}.c`, undefined],
  ])('%s -> %s', (header, expected) => {
    expect(claimedBuyer(header)).toBe(expected);
  });
});
