import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import pino from 'pino';
import type { Logger } from '../../../core/logger.js';
import { SHUTDOWN_TIMEOUT_MS, STOP_GRACES, stopOperator } from '../../../operator/controller/shutdown.js';
import type { StopGraces } from '../../../operator/controller/shutdown.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const never = (): Promise<void> => new Promise<void>(() => undefined);
const GRACES: StopGraces = { passesMs: 40, releaseMs: 30, closeMs: 20 };

function recordingLogger(): { log: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(JSON.parse(chunk.toString('utf8')) as Record<string, unknown>);
      done();
    },
  });
  return { log: pino({ level: 'debug' }, sink) as unknown as Logger, lines };
}

describe('the operator stop', () => {
  test('runs passes, Lease, connections in that order when everything answers', async () => {
    const { log, lines } = recordingLogger();
    const order: string[] = [];
    const step = (name: string) => async (): Promise<void> => {
      await new Promise((resolve) => setImmediate(resolve));
      order.push(name);
    };
    await stopOperator({
      stopPasses: step('passes'),
      releaseLease: step('lease'),
      connections: [
        { name: 'kafka', close: step('kafka') },
        { name: 'redis', close: step('redis') },
      ],
      log,
      graces: GRACES,
    });
    expect(order.slice(0, 2)).toEqual(['passes', 'lease']);
    expect(order.slice(2).sort()).toEqual(['kafka', 'redis']);
    expect(lines.filter((l) => l.level === 40)).toEqual([]);
  });

  test('gives up on each wait after its grace, drops what did not close, and never rejects', async () => {
    const { log, lines } = recordingLogger();
    const abandoned: string[] = [];
    let leaseAsked = false;
    const started = Date.now();
    await stopOperator({
      stopPasses: never,
      releaseLease: async () => {
        leaseAsked = true;
        return never();
      },
      connections: [
        { name: 'redis', close: never, abandon: () => abandoned.push('redis') },
        { name: 'postgres', close: () => Promise.reject(new Error('already ended')) },
        { name: 'kafka', close: never },
      ],
      log,
      graces: GRACES,
    });
    const elapsed = Date.now() - started;
    // The Lease is still given away after passes that never finish; connections close side by side.
    expect(leaseAsked).toBe(true);
    expect(elapsed).toBeGreaterThanOrEqual(GRACES.passesMs + GRACES.releaseMs + GRACES.closeMs - 5);
    expect(abandoned).toEqual(['redis']);
    const warnings = lines.filter((l) => l.level === 40).map((l) => [l.msg, l.connection]);
    expect(warnings).toEqual([
      ['reconcile passes still running; giving the Lease away', undefined],
      ['the API server did not answer the Lease release; it expires', undefined],
      ['connection did not close in time; dropped', 'redis'],
      ['connection did not close in time; dropped', 'kafka'],
    ]);
  });

  test("the graces fit in the timeout that exits 1, and that in the chart's grace period", () => {
    const sum = STOP_GRACES.passesMs + STOP_GRACES.releaseMs + STOP_GRACES.closeMs;
    expect(sum).toBeLessThan(SHUTDOWN_TIMEOUT_MS);
    const values = parse(readFileSync(join(ROOT, 'charts/flashsale/values.yaml'), 'utf8')) as {
      operator: { terminationGracePeriodSeconds: number };
    };
    expect(SHUTDOWN_TIMEOUT_MS).toBeLessThan(values.operator.terminationGracePeriodSeconds * 1000);
  });
});
