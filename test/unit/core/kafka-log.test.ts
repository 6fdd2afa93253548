import { Writable } from 'node:stream';
import { logLevel } from 'kafkajs';
import { pino } from 'pino';
import { kafkajsLogCreator } from '../../../core/kafka-log.js';
import type { Logger } from '../../../core/logger.js';

function capture(): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString().split('\n').filter(Boolean))
        lines.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
  const logger: Logger = pino({ base: { component: 'runtime-relay' } }, stream);
  return { logger, lines };
}

const refused = (correlationId: number) => ({
  namespace: 'Connection',
  level: logLevel.ERROR,
  label: 'ERROR',
  log: {
    timestamp: new Date().toISOString(),
    logger: 'kafkajs',
    message: 'Connection error: connect ECONNREFUSED 127.0.0.1:9092',
    broker: '127.0.0.1:9092',
    clientId: 'flashsale-relay-1',
    correlationId,
    retryCount: correlationId,
  },
});

const flush = () => new Promise((r) => setImmediate(r));

describe('kafkajsLogCreator', () => {
  it('writes kafkajs lines as pino lines at their level, with kafkajs fields and without its own timestamp', async () => {
    const { logger, lines } = capture();
    const write = kafkajsLogCreator(logger)(logLevel.WARN);
    write(refused(1));
    write({
      namespace: 'Producer',
      level: logLevel.WARN,
      label: 'WARN',
      log: { timestamp: 't', logger: 'kafkajs', message: 'Failed to send', topic: 'a.orders' },
    });
    await flush();
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatchObject({
      // kafkajs' ERROR is a failed attempt it retries: a warning here.
      level: 40,
      kafkajsLevel: 'ERROR',
      lib: 'kafkajs',
      component: 'runtime-relay',
      namespace: 'Connection',
      broker: '127.0.0.1:9092',
      clientId: 'flashsale-relay-1',
      msg: 'Connection error: connect ECONNREFUSED 127.0.0.1:9092',
    });
    expect(lines[0]).not.toHaveProperty('logger');
    expect(lines[0]?.time).toEqual(expect.any(Number));
    expect(lines[1]).toMatchObject({
      level: 40,
      namespace: 'Producer',
      topic: 'a.orders',
      msg: 'Failed to send',
    });
  });

  it('holds back repeats within the window and writes the next one after it with their count', async () => {
    const { logger, lines } = capture();
    let t = 0;
    const write = kafkajsLogCreator(logger, { repeatWindowMs: 60_000, now: () => t })(logLevel.WARN);
    for (let i = 0; i < 12; i += 1) {
      write(refused(i)); // every 5 s for a minute: same event, only the correlation id moves
      t += 5_000;
    }
    await flush();
    expect(lines.map((l) => [l.correlationId, l.repeated])).toEqual([[0, undefined]]);
    write(refused(12)); // t = 60 s: the window has passed; 11 were held back
    await flush();
    expect(lines.map((l) => [l.correlationId, l.repeated])).toEqual([
      [0, undefined],
      [12, 11],
    ]);
    // Another broker's failure is another kind of line: written at once.
    write({ ...refused(13), log: { ...refused(13).log, broker: '127.0.0.2:9092' } });
    // As is the same broker's failure at another level.
    write({ ...refused(14), level: logLevel.WARN, label: 'WARN' });
    await flush();
    expect(lines.map((l) => [l.broker, l.kafkajsLevel])).toEqual([
      ['127.0.0.1:9092', 'ERROR'],
      ['127.0.0.1:9092', 'ERROR'],
      ['127.0.0.2:9092', 'ERROR'],
      ['127.0.0.1:9092', 'WARN'],
    ]);
  });

  it('writes a line again after a quiet window without a repeated count', async () => {
    const { logger, lines } = capture();
    let t = 0;
    const write = kafkajsLogCreator(logger, { repeatWindowMs: 1_000, now: () => t })(logLevel.WARN);
    write(refused(1));
    t = 5_000;
    write(refused(2));
    await flush();
    expect(lines.map((l) => [l.correlationId, l.repeated])).toEqual([
      [1, undefined],
      [2, undefined],
    ]);
  });

  it('never throws into kafkajs: an Error as the message, circular and BigInt fields', async () => {
    const { logger, lines } = capture();
    const write = kafkajsLogCreator(logger)(logLevel.WARN);
    const circular: Record<string, unknown> = { name: 'loop' };
    circular.self = circular;
    const odd = {
      namespace: 'BrokerPool',
      level: logLevel.ERROR,
      label: 'ERROR',
      // kafkajs' cluster/brokerPool.js logs an Error object as the message.
      log: { timestamp: 't', logger: 'kafkajs', message: new TypeError('no leader') as unknown as string },
    };
    expect(() => write(odd)).not.toThrow();
    expect(() =>
      write({ ...refused(1), log: { ...refused(1).log, detail: circular, offset: 12n } }),
    ).not.toThrow();
    await flush();
    expect(lines.map((l) => l.msg)).toEqual([
      'TypeError: no leader',
      'Connection error: connect ECONNREFUSED 127.0.0.1:9092',
    ]);
  });
});
