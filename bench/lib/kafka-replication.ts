/**
 * `BENCH_ONLY=kafka-replication` (not in the default phases: it starts three more JVMs): Kafka
 * broker CPU per message at replication factor 3 (`min.insync.replicas` 2) against replication 1,
 * on one three-broker KRaft cluster on loopback (test/env/start-kafka-cluster.sh, in the
 * benchmark's state dir), summed over the three brokers' processes (/proc). For each factor, a
 * topic of 4 partitions; the relay's producer (core/kafka.ts idempotentProducer: idempotent,
 * acks=all, one partition per request) sends N order-sized messages from 4 loops in batches of
 * 100, then a consumer group reads them all; one unmeasured round of each factor first (the JVMs'
 * JIT). The brokers' idle CPU over the same time (measured before) is subtracted. Writes its block into docs/capacity.md (BENCH_CAPACITY_OUT).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Ctx } from './context.js';
import { log, machineLoad, mustRun, procCpuS, runCmd, sleep, waitFor } from './util.js';

export interface ReplicationFigures {
  messages: number;
  /** Broker CPU µs per message (all three brokers, idle subtracted). */
  rf1: { produceUs: number; consumeUs: number };
  rf3: { produceUs: number; consumeUs: number };
  /** Idle CPU of the three brokers, in % of one core. */
  idlePct: number;
  load: { before: number; after: number };
  date: string;
}

const BATCH = 100;
const LOOPS = 4;

function brokersCpuS(pids: number[]): number {
  return pids.reduce((s, p) => s + (procCpuS(p) ?? NaN), 0);
}

export async function kafkaReplication(ctx: Ctx): Promise<ReplicationFigures> {
  const state = join(ctx.cfg.stateDir, 'kafka-cluster');
  log('kafka-replication: starting three brokers (test/env/start-kafka-cluster.sh)');
  await mustRun('bash', [join(ctx.cfg.repo, 'test', 'env', 'start-kafka-cluster.sh'), state], {
    cwd: ctx.cfg.repo,
    timeoutMs: 300_000,
  });
  try {
    const env = readFileSync(join(state, 'kafka-cluster.env'), 'utf8');
    const brokers = (/^KAFKA_CLUSTER_BROKERS=(.*)$/m.exec(env)?.[1] ?? '').split(',').filter(Boolean);
    const pids = [1, 2, 3].map((i) =>
      Number(readFileSync(join(state, `kafka-cluster-${i}.pid`), 'utf8').trim()),
    );
    if (brokers.length !== 3 || pids.some((p) => !(p > 0))) throw new Error('no three-broker cluster');
    const n = Math.min(ctx.cfg.drainReservations, 20_000);
    const loadBefore = machineLoad().load1;
    const kafka = ctx.core.kafka.createKafka(brokers, `bench-rf-${ctx.runId}`);
    const admin = kafka.admin();
    await admin.connect();
    // Idle: the brokers' own work (controller quorum, replica fetch sessions) over a few seconds.
    await sleep(2_000);
    const i0 = brokersCpuS(pids);
    const t0 = performance.now();
    await sleep(5_000);
    const idleCoreS = (brokersCpuS(pids) - i0) / ((performance.now() - t0) / 1000);
    const value = (i: number): string =>
      JSON.stringify({
        reservationId: `r${i}`.padEnd(22, 'x'),
        activityId: `bench-rf-${ctx.runId}`,
        userId: `buyer-${i}`,
        skuId: 'hot',
        quantity: 1,
        slot: 1,
        unitPrice: '19.99',
        itemName: 'Bench hot item',
        reservedAt: Date.now(),
        traceId: '0123456789abcdef0123456789abcdef',
        requestId: `req-${i}`,
      });
    const measure = async (rf: number, round: string): Promise<{ produceUs: number; consumeUs: number }> => {
      const topics = ctx.core.kafka.topicsFor(`bench-rf${rf}${round}-${ctx.runId}`);
      await ctx.core.kafka.ensureTopics(admin, topics, 4, rf);
      const producer = ctx.core.kafka.idempotentProducer(kafka);
      await producer.connect();
      // Metadata and connections first, outside the measurement.
      await producer.send({ topic: topics.orders, messages: [{ key: 'warm', value: value(-1) }] });
      let next = 0;
      const p0 = brokersCpuS(pids);
      const pt = performance.now();
      await Promise.all(
        Array.from({ length: LOOPS }, async () => {
          for (let b = next; b < n; b = next) {
            next += BATCH;
            const messages = Array.from({ length: Math.min(BATCH, n - b) }, (_, j) => ({
              key: `buyer-${b + j}`,
              value: value(b + j),
              headers: { trace: '0123456789abcdef0123456789abcdef' },
            }));
            await producer.send({ topic: topics.orders, messages });
          }
        }),
      );
      const produceS = brokersCpuS(pids) - p0 - idleCoreS * ((performance.now() - pt) / 1000);
      await producer.disconnect();
      // From the group's join to the last message (the join is a few requests, not per message).
      const c0 = brokersCpuS(pids);
      const ct = performance.now();
      const consumer = kafka.consumer({ groupId: `bench-rf${rf}${round}-${ctx.runId}` });
      let seen = 0;
      let consumeS: number;
      try {
        await consumer.connect();
        await consumer.subscribe({ topic: topics.orders, fromBeginning: true });
        await consumer.run({
          eachBatch: async ({ batch }) => {
            seen += batch.messages.length;
          },
        });
        await waitFor(
          `rf ${rf}: ${n + 1} messages consumed`,
          300_000,
          async () => (seen >= n + 1 ? true : undefined),
          20,
        );
        consumeS = brokersCpuS(pids) - c0 - idleCoreS * ((performance.now() - ct) / 1000);
      } finally {
        await consumer.disconnect();
      }
      return { produceUs: (produceS / n) * 1e6, consumeUs: (consumeS / n) * 1e6 };
    };
    // Fresh JVMs compile as they go: one unmeasured round of each first.
    log(`kafka-replication: warm-up, then ${n} messages at replication 1, then 3`);
    // A new topic's partitions can still be unknown to one broker of a multi-broker KRaft cluster
    // (core/kafka.ts waitForLeaders): such a round is run again on fresh topics.
    const round = async (rf: number, name: string): Promise<{ produceUs: number; consumeUs: number }> => {
      for (let attempt = 0; ; attempt += 1) {
        try {
          return await measure(rf, `${name}${attempt}`);
        } catch (err) {
          if (attempt >= 2) throw err;
          log(`kafka-replication: replication ${rf} round ${name} again: ${(err as Error).message}`);
        }
      }
    };
    await round(1, 'w');
    await round(3, 'w');
    const rf1 = await round(1, 'm');
    const rf3 = await round(3, 'm');
    await admin.disconnect();
    return {
      messages: n,
      rf1,
      rf3,
      idlePct: idleCoreS * 100,
      load: { before: loadBefore, after: machineLoad().load1 },
      date: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
    };
  } finally {
    await runCmd('bash', [join(ctx.cfg.repo, 'test', 'env', 'env-down.sh'), state], {
      cwd: ctx.cfg.repo,
      timeoutMs: 120_000,
    });
  }
}

const BEGIN = '<!-- bench:kafka-replication:begin';
const END = '<!-- bench:kafka-replication:end -->';

export function renderReplicationBlock(f: ReplicationFigures): string {
  const x = (a: number, b: number): string => `${(b / a).toFixed(1)}×`;
  return [
    `${BEGIN} (written by \`BENCH_ONLY=kafka-replication\`; do not edit) -->`,
    '',
    `Measured on ${f.date}: three KRaft brokers on loopback (test/env/start-kafka-cluster.sh, ` +
      `log.flush.interval.messages=1 as in the test environment), ${f.messages} order-sized messages ` +
      `per factor, after an unmeasured round of each, through the relay's producer (idempotent, acks=all, one partition per request, ` +
      `4 loops of 100-message batches), 4 partitions; load average ${f.load.before.toFixed(1)} before, ` +
      `${f.load.after.toFixed(1)} after. CPU of the three broker processes, their idle ` +
      `${f.idlePct.toFixed(1)} % of a core subtracted.`,
    '',
    '| Broker CPU per message (all brokers) | replication 1 | replication 3, min.insync.replicas 2 | ratio |',
    '| --- | ---: | ---: | ---: |',
    `| produced | ${f.rf1.produceUs.toFixed(1)} µs | ${f.rf3.produceUs.toFixed(1)} µs | ${x(f.rf1.produceUs, f.rf3.produceUs)} |`,
    `| consumed | ${f.rf1.consumeUs.toFixed(1)} µs | ${f.rf3.consumeUs.toFixed(1)} µs | ${x(f.rf1.consumeUs, f.rf3.consumeUs)} |`,
    '',
    END,
  ].join('\n');
}

export function writeReplicationBlock(ctx: Ctx, f: ReplicationFigures): string {
  const file = process.env.BENCH_CAPACITY_OUT ?? join(ctx.cfg.repo, 'docs', 'capacity.md');
  const page = readFileSync(file, 'utf8');
  const a = page.indexOf(BEGIN);
  const b = page.indexOf(END);
  if (a < 0 || b < a) throw new Error(`${file} has no bench:kafka-replication block markers`);
  writeFileSync(file, page.slice(0, a) + renderReplicationBlock(f) + page.slice(b + END.length));
  log(`wrote the kafka-replication block of ${file}`);
  return file;
}
