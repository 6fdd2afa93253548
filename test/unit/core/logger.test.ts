// Connection URLs in logs: the password of the authority and credential-like query parameters
// are masked (core/logger.ts).
import { redactUrl } from '../../../core/logger.js';

describe('redactUrl', () => {
  test('masks the password of the authority', () => {
    expect(redactUrl('postgres://flashsale:s3cret@db:5432/flashsale')).toBe(
      'postgres://flashsale:***@db:5432/flashsale',
    );
  });

  test('masks passwords and keys passed as query parameters, keeps the rest', () => {
    const out = redactUrl(
      'postgres://db:5432/flashsale?user=fs&password=s3cret&sslmode=require&sslpassword=k3y&sslkey=/k.pem',
    );
    expect(out).not.toMatch(/s3cret|k3y|\/k\.pem/);
    expect(out).toBe(
      'postgres://db:5432/flashsale?user=fs&password=***&sslmode=require&sslpassword=***&sslkey=***',
    );
    expect(redactUrl('redis://cache:6379/0?auth_token=abc&db=1')).toBe(
      'redis://cache:6379/0?auth_token=***&db=1',
    );
    expect(redactUrl('rediss://:pw@cache:6380?Password=x')).toBe('rediss://:***@cache:6380?Password=***');
  });

  test('a repeated secret parameter collapses to one masked value; nothing leaks from bad input', () => {
    expect(redactUrl('postgres://db/x?password=a&password=b')).toBe('postgres://db/x?password=***');
    expect(redactUrl('not a url password=x')).toBe('[unparseable url]');
  });
});
