// docs/capacity.md: the sizing model (bench/lib/capacity-model.ts) and the page's measured block,
// which `make bench` (phase capacity) writes. The block carries the figures it was rendered from:
// re-rendering them must give the page's block byte for byte, so neither the measured costs nor
// the worked examples can be edited by hand, and the command the page names must be a real phase.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  BLOCK_BEGIN,
  BLOCK_END,
  DEFAULT_PLAN,
  WORKED_PEAKS,
  figuresOfPage,
  plan,
  renderCapacityBlock,
  replaceCapacityBlock,
} from '../../../bench/lib/capacity-model.js';
import type { CapacityFigures } from '../../../bench/lib/capacity-model.js';
import { PHASES } from '../../../bench/lib/env.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

const figures: CapacityFigures = {
  meta: { date: '2026-12-01T00:00:00Z', commit: 'abc1234', machine: 'm', servers: 's', load: 'l' },
  n: 20_000,
  redisReserveUs: 100,
  redisReservePipelinedUs: 80,
  redisRelayUs: 20,
  redisConsumerUs: 10,
  relayUs: 150,
  consumerUs: 200,
  postgresUs: 90,
  kafkaProduceUs: 30,
  kafkaConsumeUs: 10,
  relayRate: 5000,
  consumerRate: 4000,
};

describe('capacity model', () => {
  it('sizes each unit of parallelism from the CPU cost per operation at the planning utilisation', () => {
    // Redis: (100 + 20 + 10) µs x 10,000/s = 1.3 core-seconds per second, / 0.6 = 2.17 -> 3 primaries.
    expect(plan(figures, 10_000)).toEqual({
      peak: 10_000,
      redisUsPerReservation: 130,
      redisPrimaries: 3,
      redisReplicas: 3,
      hotSkuBuckets: 6,
      relayProcesses: 3, // 150 µs x 10,000 / 0.6e6 = 2.5
      consumerProcesses: 4, // 200 µs x 10,000 / 0.6e6 = 3.33
      kafkaPartitions: 8,
      kafkaCores: ((30 + 10) * 3 * 10_000) / 0.6e6,
      postgresCores: (90 * 10_000) / 0.6e6,
    });
  });

  it('never plans fewer than one of anything, and scales linearly', () => {
    const small = plan(figures, 1);
    expect([small.redisPrimaries, small.relayProcesses, small.consumerProcesses]).toEqual([1, 1, 1]);
    expect(small.hotSkuBuckets).toBe(1); // one primary takes it all: no buckets
    const big = plan(figures, 500_000);
    expect(big.redisPrimaries).toBe(Math.ceil((500_000 * 130) / (1e6 * DEFAULT_PLAN.utilisation)));
    expect(big.kafkaPartitions).toBe(big.consumerProcesses * DEFAULT_PLAN.partitionsPerConsumer);
    expect(big.hotSkuBuckets).toBe(big.redisPrimaries * DEFAULT_PLAN.bucketsPerPrimary);
  });

  it('reports what was not measured as such', () => {
    const x = plan({ ...figures, postgresUs: undefined, kafkaProduceUs: undefined }, 10_000);
    expect(x.postgresCores).toBeUndefined();
    expect(x.kafkaCores).toBeUndefined();
    expect(renderCapacityBlock({ ...figures, postgresUs: undefined })).toContain(
      '| PostgreSQL | not measured |',
    );
  });

  it('sizes the Redis memory a Kafka outage holds from the bytes a waiting reservation takes', () => {
    const withMemory = { ...figures, redisBytesWaiting: 500, redisBytesKept: 200 };
    // 10,000 reservations/s for 60 s, each 500 bytes until its order is written.
    expect(plan(withMemory, 10_000).redisBytesPerOutageMinute).toBe(300_000_000);
    const block = renderCapacityBlock(withMemory);
    expect(block).toContain('500 bytes while its order is on its way');
    expect(block).toContain('200 bytes once the order is written');
    expect(block).toContain('| 286 MiB |');
    expect(plan(figures, 10_000).redisBytesPerOutageMinute).toBeUndefined();
    expect(renderCapacityBlock(figures)).toContain('Redis memory per reservation: not measured in this run.');
  });

  it('replaces only the generated block of a page', () => {
    const page = `# T\n\nbefore\n\n${BLOCK_BEGIN}\nold\n${BLOCK_END}\n\nafter\n`;
    const out = replaceCapacityBlock(page, renderCapacityBlock(figures));
    expect(out.startsWith('# T\n\nbefore\n\n')).toBe(true);
    expect(out.endsWith('\n\nafter\n')).toBe(true);
    expect(figuresOfPage(out)).toEqual(figures);
    expect(() => replaceCapacityBlock('# no markers', 'x')).toThrow(/markers/);
  });
});

describe('docs/capacity.md', () => {
  const page = readFileSync(join(ROOT, 'docs', 'capacity.md'), 'utf8');

  it('holds the block the bench wrote, unedited: the measured costs and the worked examples', () => {
    const f = figuresOfPage(page);
    expect(f).toBeDefined();
    const block = page.slice(page.indexOf(BLOCK_BEGIN), page.indexOf(BLOCK_END) + BLOCK_END.length);
    expect(block).toBe(renderCapacityBlock(f!));
    for (const peak of WORKED_PEAKS) expect(block).toContain(`| ${peak.toLocaleString('en-US')} |`);
  });

  it('names a bench command that exists', () => {
    expect(page).toContain('BENCH_ONLY=capacity');
    expect(PHASES).toContain('capacity');
    expect(readFileSync(join(ROOT, 'Makefile'), 'utf8')).toMatch(/^bench:/m);
  });
});
