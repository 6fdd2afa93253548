// The mapping of KAFKA_TLS* / KAFKA_SASL_* variables to kafkajs options (core/kafka.ts).
import { kafkaSecurityFromEnv } from '../../../core/kafka.js';

describe('Kafka security configuration', () => {
  test('nothing set: plaintext without authentication', () => {
    expect(kafkaSecurityFromEnv({})).toEqual({});
  });

  test('TLS with a CA, a client certificate and a server name', () => {
    expect(
      kafkaSecurityFromEnv({
        KAFKA_TLS: 'true',
        KAFKA_TLS_CA: 'CA-PEM',
        KAFKA_TLS_CERT: 'CERT-PEM',
        KAFKA_TLS_KEY: 'KEY-PEM',
        KAFKA_TLS_SERVERNAME: 'kafka.internal',
      }),
    ).toEqual({
      ssl: {
        rejectUnauthorized: true,
        ca: ['CA-PEM'],
        cert: 'CERT-PEM',
        key: 'KEY-PEM',
        servername: 'kafka.internal',
      },
    });
    expect(kafkaSecurityFromEnv({ KAFKA_TLS: '1', KAFKA_TLS_REJECT_UNAUTHORIZED: 'false' })).toEqual({
      ssl: { rejectUnauthorized: false },
    });
  });

  test.each(['scram-sha-256', 'scram-sha-512', 'SCRAM-SHA-512'])('SASL %s', (mechanism) => {
    expect(
      kafkaSecurityFromEnv({
        KAFKA_SASL_MECHANISM: mechanism,
        KAFKA_SASL_USERNAME: 'flashsale',
        KAFKA_SASL_PASSWORD: 'pw',
      }),
    ).toEqual({ sasl: { mechanism: mechanism.toLowerCase(), username: 'flashsale', password: 'pw' } });
  });

  test('SASL PLAIN needs TLS unless the network is declared trusted', () => {
    const plain = { KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_USERNAME: 'u', KAFKA_SASL_PASSWORD: 'p' };
    expect(() => kafkaSecurityFromEnv(plain)).toThrow(/plain sends the password in clear/);
    expect(kafkaSecurityFromEnv({ ...plain, KAFKA_TLS: 'true' })).toEqual({
      ssl: { rejectUnauthorized: true },
      sasl: { mechanism: 'plain', username: 'u', password: 'p' },
    });
    expect(kafkaSecurityFromEnv({ ...plain, KAFKA_SASL_ALLOW_PLAINTEXT: 'true' }).sasl).toEqual({
      mechanism: 'plain',
      username: 'u',
      password: 'p',
    });
  });

  test('contradictory or incomplete settings name the variable', () => {
    expect(() =>
      kafkaSecurityFromEnv({
        KAFKA_SASL_MECHANISM: 'gssapi',
        KAFKA_SASL_USERNAME: 'u',
        KAFKA_SASL_PASSWORD: 'p',
      }),
    ).toThrow(/KAFKA_SASL_MECHANISM: one of plain, scram-sha-256, scram-sha-512/);
    expect(() =>
      kafkaSecurityFromEnv({ KAFKA_SASL_MECHANISM: 'scram-sha-256', KAFKA_SASL_USERNAME: 'u' }),
    ).toThrow(/KAFKA_SASL_PASSWORD: required/);
    expect(() => kafkaSecurityFromEnv({ KAFKA_SASL_USERNAME: 'u', KAFKA_SASL_PASSWORD: 'p' })).toThrow(
      /KAFKA_SASL_MECHANISM: required/,
    );
    expect(() => kafkaSecurityFromEnv({ KAFKA_TLS_CA: 'pem' })).toThrow(/KAFKA_TLS: set it to true/);
    expect(() => kafkaSecurityFromEnv({ KAFKA_TLS: 'yes' })).toThrow(/KAFKA_TLS: true or false/);
    expect(() => kafkaSecurityFromEnv({ KAFKA_TLS: 'true', KAFKA_TLS_CERT: 'c' })).toThrow(/set both/);
  });
});
