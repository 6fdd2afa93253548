import { loadRuntimeConfig } from '../../../runtime/config.js';
import type { AllConfig, ApiConfig, RelayConfig } from '../../../runtime/config.js';

const base = {
  DATABASE_URL: 'postgres://u:secret@127.0.0.1:5432/db',
  REDIS_URL: 'redis://127.0.0.1:6379',
  KAFKA_BROKERS: '127.0.0.1:9092, 127.0.0.1:9093',
  JWT_HS256_SECRET: 's'.repeat(32),
};

describe('runtime configuration', () => {
  test('defaults are applied and lists are parsed', () => {
    const c = loadRuntimeConfig('relay', { ...base, ACTIVITY_ID: 'a1' });
    expect(c.KAFKA_BROKERS).toEqual(['127.0.0.1:9092', '127.0.0.1:9093']);
    expect(c.HTTP_PORT).toBe(8080);
    expect(c.HTTP_BACKLOG).toBe(4096);
    expect(c.PAYMENT_TIMEOUT_SECONDS).toBe(900);
    expect(c.JOBS_IN_CONSUMER).toBe(true);
    expect(c.KAFKA_REPLICATION_FACTOR).toBe(-1);
    expect(c.KAFKA_MIN_INSYNC_REPLICAS).toBeUndefined();
    expect(c.CONSUMER_FETCH_MAX_BYTES_PER_PARTITION).toBe(4 * 1024 * 1024);
  });

  test('a blank number is unset (its default), never 0: a blank would turn off the limits whose 0 means off', () => {
    const c = loadRuntimeConfig('api', {
      ...base,
      API_MAX_IN_FLIGHT: '',
      API_MAX_EVENT_LOOP_DELAY_MS: ' ',
      PAYMENT_SIGNATURE_TOLERANCE_SECONDS: '',
      HTTP_PORT: '',
    });
    expect([
      c.API_MAX_IN_FLIGHT,
      c.API_MAX_EVENT_LOOP_DELAY_MS,
      c.PAYMENT_SIGNATURE_TOLERANCE_SECONDS,
      c.HTTP_PORT,
    ]).toEqual([1000, loadRuntimeConfig('api', base).API_MAX_EVENT_LOOP_DELAY_MS, 300, 8080]);
    expect(c.API_MAX_EVENT_LOOP_DELAY_MS).toBeGreaterThan(0);
    const relay = loadRuntimeConfig('relay', {
      ...base,
      ACTIVITY_ID: 'a1',
      RELAY_ORDERS_PER_MESSAGE: '',
      KAFKA_MIN_INSYNC_REPLICAS: '',
      KAFKA_REPLICATION_FACTOR: '',
    });
    expect([
      relay.RELAY_ORDERS_PER_MESSAGE,
      relay.KAFKA_MIN_INSYNC_REPLICAS,
      relay.KAFKA_REPLICATION_FACTOR,
    ]).toEqual([500, undefined, -1]);
  });

  test('a bad value names the variable', () => {
    expect(() => loadRuntimeConfig('api', { ...base, HTTP_PORT: 'eighty' })).toThrow(/HTTP_PORT/);
    expect(() => loadRuntimeConfig('api', { ...base, DATABASE_URL: 'nope' })).toThrow(/DATABASE_URL/);
    expect(() => loadRuntimeConfig('api', { ...base, HTTP_BACKLOG: '0' })).toThrow(/HTTP_BACKLOG/);
    expect(() => loadRuntimeConfig('api', { ...base, HTTP_BACKLOG: 'lots' })).toThrow(/HTTP_BACKLOG/);
    expect(() => loadRuntimeConfig('api', { ...base, JWT_HS256_SECRET: 'short' })).toThrow(
      /JWT_HS256_SECRET/,
    );
    expect(() => loadRuntimeConfig('api', { ...base, JOBS_IN_CONSUMER: 'maybe' })).toThrow(
      /JOBS_IN_CONSUMER/,
    );
    expect(() => loadRuntimeConfig('api', { ...base, KAFKA_REPLICATION_FACTOR: '0' })).toThrow(
      /KAFKA_REPLICATION_FACTOR: at least 1, or -1/,
    );
    expect(() =>
      loadRuntimeConfig('jobs', {
        ...base,
        ACTIVITY_ID: 'a1',
        KAFKA_REPLICATION_FACTOR: '1',
        KAFKA_MIN_INSYNC_REPLICAS: '2',
      }),
    ).toThrow(
      /KAFKA_MIN_INSYNC_REPLICAS: KAFKA_MIN_INSYNC_REPLICAS must be at most KAFKA_REPLICATION_FACTOR/,
    );
    // With the brokers' default factor the setting is the brokers' to check.
    expect(
      loadRuntimeConfig('jobs', { ...base, ACTIVITY_ID: 'a1', KAFKA_MIN_INSYNC_REPLICAS: '2' })
        .KAFKA_MIN_INSYNC_REPLICAS,
    ).toBe(2);
    expect(() =>
      loadRuntimeConfig('consumer', {
        ...base,
        ACTIVITY_ID: 'a1',
        CONSUMER_FETCH_MAX_BYTES_PER_PARTITION: '512',
      }),
    ).toThrow(/CONSUMER_FETCH_MAX_BYTES_PER_PARTITION/);
  });

  test('a Redis command timeout shorter than a wait the roles ask Redis for is refused', () => {
    expect(loadRuntimeConfig('api', base).REDIS_COMMAND_TIMEOUT_MS).toBe(5000);
    expect(() => loadRuntimeConfig('api', { ...base, REDIS_COMMAND_TIMEOUT_MS: '1500' })).toThrow(
      /REDIS_COMMAND_TIMEOUT_MS: must be at least 1000 more than RESERVE_ACK_TIMEOUT_MS and than 1000/,
    );
    expect(() =>
      loadRuntimeConfig('api', { ...base, RESERVE_ACK_TIMEOUT_MS: '8000', REDIS_COMMAND_TIMEOUT_MS: '8500' }),
    ).toThrow(/REDIS_COMMAND_TIMEOUT_MS/);
    expect(
      loadRuntimeConfig('api', { ...base, RESERVE_ACK_TIMEOUT_MS: '8000', REDIS_COMMAND_TIMEOUT_MS: '9000' })
        .REDIS_COMMAND_TIMEOUT_MS,
    ).toBe(9000);
    expect(
      loadRuntimeConfig('api', { ...base, REDIS_COMMAND_TIMEOUT_MS: '2000' }).REDIS_COMMAND_TIMEOUT_MS,
    ).toBe(2000);
  });

  test('each role requires exactly the connections it uses (ROLE_NEEDS)', () => {
    const { DATABASE_URL: _d, ...noDatabase } = { ...base, ACTIVITY_ID: 'a1' };
    const { KAFKA_BROKERS: _b, ...noKafka } = { ...base, ACTIVITY_ID: 'a1' };
    // The relay never reads the database; the api never talks to Kafka.
    expect(loadRuntimeConfig('relay', noDatabase)).not.toHaveProperty('DATABASE_URL');
    expect(loadRuntimeConfig('api', noKafka)).not.toHaveProperty('KAFKA_BROKERS');
    for (const role of ['api', 'consumer', 'jobs', 'all'] as const)
      expect(() => loadRuntimeConfig(role, noDatabase)).toThrow(
        `DATABASE_URL: required for the ${role} role`,
      );
    expect(() => loadRuntimeConfig('after-sale', { ...noDatabase, ACTIVITY_ID: undefined })).toThrow(
      /DATABASE_URL: required for the after-sale role/,
    );
    for (const role of ['relay', 'consumer', 'jobs', 'all'] as const)
      expect(() => loadRuntimeConfig(role, noKafka)).toThrow(
        `KAFKA_BROKERS: at least one broker, for the ${role} role`,
      );
  });

  test("a role's configuration is its slice: what it does not need is not handed to it", () => {
    const env = { ...base, ACTIVITY_ID: 'a1' };
    // Set in the environment (a shared Secret, a developer's shell), still not in the slice.
    expect(loadRuntimeConfig('relay', env)).not.toHaveProperty('DATABASE_URL');
    expect(loadRuntimeConfig('api', env)).not.toHaveProperty('KAFKA_BROKERS');
    expect(loadRuntimeConfig('all', env)).toMatchObject({
      DATABASE_URL: base.DATABASE_URL,
      KAFKA_BROKERS: ['127.0.0.1:9092', '127.0.0.1:9093'],
      ACTIVITY_ID: 'a1',
    });
    // The types say the same (checked by tsc over the tests): no database URL in a relay's
    // configuration, no Kafka in the api's; `all` configures every role.
    const relay: RelayConfig = loadRuntimeConfig('relay', env);
    const api: ApiConfig = loadRuntimeConfig('api', env);
    // @ts-expect-error -- the relay's configuration has no DATABASE_URL
    expect(relay.DATABASE_URL).toBeUndefined();
    // @ts-expect-error -- the api's configuration has no KAFKA_BROKERS
    expect(api.KAFKA_BROKERS).toBeUndefined();
    const all: AllConfig = loadRuntimeConfig('all', env);
    const asRelay: RelayConfig = all;
    expect(asRelay.ACTIVITY_ID).toBe('a1');
  });

  test('roles that serve one activity require it; the api requires a token key', () => {
    expect(() => loadRuntimeConfig('relay', base)).toThrow(/ACTIVITY_ID: required for the relay role/);
    expect(() => loadRuntimeConfig('consumer', { ...base, ACTIVITY_ID: 'bad id' })).toThrow(/ACTIVITY_ID/);
    expect(loadRuntimeConfig('relay', { ...base, ACTIVITY_ID: 'a1' }).ACTIVITY_ID).toBe('a1');
    const { JWT_HS256_SECRET: _s, ...noKey } = base;
    expect(() => loadRuntimeConfig('api', noKey)).toThrow(/JWT_HS256_SECRET/);
    expect(() => loadRuntimeConfig('api', { ...base, JWT_RS256_PUBLIC_KEY: 'pem' })).toThrow(/not both/);
    expect(() => loadRuntimeConfig('api', { ...base, JWT_JWKS: '{"keys":[]}' })).toThrow(/not both/);
    const { JWT_HS256_SECRET: _k, ...jwksOnly } = { ...base, JWT_JWKS: '{"keys":[]}' };
    expect(loadRuntimeConfig('api', jwksOnly).JWT_JWKS).toBe('{"keys":[]}');
  });

  test('metrics have their own port, never the buyer port; Kafka security is checked at start', () => {
    expect(loadRuntimeConfig('api', base).METRICS_PORT).toBe(9090);
    expect(() => loadRuntimeConfig('api', { ...base, HTTP_PORT: '9090' })).toThrow(
      /METRICS_PORT: must differ/,
    );
    expect(() => loadRuntimeConfig('api', { ...base, KAFKA_SASL_MECHANISM: 'scram-sha-256' })).toThrow(
      /KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD: required/,
    );
  });

  test('the after-sale role serves every activity: no ACTIVITY_ID, a token key required', () => {
    expect(loadRuntimeConfig('after-sale', base)).not.toHaveProperty('ACTIVITY_ID');
    expect(() => loadRuntimeConfig('after-sale', { ...base, ACTIVITY_ID: 'a1' })).toThrow(
      /ACTIVITY_ID: the after-sale role serves every activity/,
    );
    const { JWT_HS256_SECRET: _s, ...noKey } = base;
    expect(() => loadRuntimeConfig('after-sale', noKey)).toThrow(/JWT_HS256_SECRET: .* after-sale role/);
  });
});
