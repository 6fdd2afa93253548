/**
 * The capacity model of docs/capacity.md: from CPU microseconds per operation (measured by the
 * `capacity` bench phase, bench/lib/capacity.ts) to the Redis primaries, stock buckets, relay and
 * consumer processes, Kafka partitions and PostgreSQL cores a given peak of reservations per second
 * needs. Pure, so the page's worked examples are computed (and unit-tested) rather than typed in.
 */

/** CPU time per operation in microseconds, and what the run measured beside them. */
export interface CapacityFigures {
  /** When and where the figures were measured. */
  meta: {
    date: string;
    commit: string;
    machine: string;
    servers: string;
    /** Load average at the start and end of the phase, CPU pressure (PSI some) during it. */
    load: string;
  };
  /** Reservations (= messages = orders) each stage handled. */
  n: number;
  /** Redis CPU per reserve() call: 50 connections one call at a time each, and one connection with 50 in flight (as the api). */
  redisReserveUs: number;
  redisReservePipelinedUs: number;
  /** Redis CPU per order (half message) for the relay's stream reads, acks and deletes. */
  redisRelayUs: number;
  /** Redis CPU per order for the consumer's result writes and ledger confirmations. */
  redisConsumerUs: number;
  /** The relay process's CPU per order (read, produce in batch messages with acks=all, ack + delete). */
  relayUs: number;
  /** The consumer process's CPU per order (fetch, insert batch + journal + guard, results, commit). */
  consumerUs: number;
  /** PostgreSQL (postmaster and backends) CPU per order; undefined when its processes were not found. */
  postgresUs: number | undefined;
  /** Kafka broker CPU per order produced, and per order consumed, in the relay's batch messages (one broker, replication 1). */
  kafkaProduceUs: number | undefined;
  kafkaConsumeUs: number | undefined;
  /** Wall-clock rates of the single relay and the single consumer process (shared machine). */
  relayRate: number;
  consumerRate: number;
  /**
   * Redis memory (INFO used_memory) per reservation while its half message waits in the outbox and
   * its ledger entry is unconfirmed (the relay stopped, as during a Kafka outage), and once its
   * order is written (what stays until the activity's cleanup). Bytes; absent in older runs.
   */
  redisBytesWaiting?: number;
  redisBytesKept?: number;
}

/** Planning parameters (docs/capacity.md, "The model"). */
export interface PlanParams {
  /** Share of a core a process may use at the peak (headroom for bursts, GC, failover). */
  utilisation: number;
  /**
   * Stock buckets per Redis primary for a hot SKU that takes the whole peak (more than one evens
   * out slot placement); none when one primary is enough.
   */
  bucketsPerPrimary: number;
  /** Kafka partitions per consumer process (room to add consumers without repartitioning). */
  partitionsPerConsumer: number;
  /** Kafka replication factor (brokers = at least this). */
  replicationFactor: number;
}

export const DEFAULT_PLAN: PlanParams = {
  utilisation: 0.6,
  bucketsPerPrimary: 2,
  partitionsPerConsumer: 2,
  replicationFactor: 3,
};

export interface Plan {
  peak: number;
  /** Redis CPU per reservation on its bucket's primary: reserve + relay reads + consumer results. */
  redisUsPerReservation: number;
  redisPrimaries: number;
  /** One replica per primary (failover with RESERVE_ACK=replica). */
  redisReplicas: number;
  hotSkuBuckets: number;
  relayProcesses: number;
  consumerProcesses: number;
  kafkaPartitions: number;
  /** Broker cores for produce + consume at replication 1, times the replication factor (estimate). */
  kafkaCores: number | undefined;
  postgresCores: number | undefined;
  /** Redis memory that a minute of the peak's reservations holds while Kafka is away (all primaries). */
  redisBytesPerOutageMinute: number | undefined;
}

const ceil = (x: number): number => Math.max(1, Math.ceil(x - 1e-9));

/** Cores (at the planning utilisation) that `perSecond` operations of `us` microseconds need. */
function cores(perSecond: number, us: number, p: PlanParams): number {
  return (perSecond * us) / (1e6 * p.utilisation);
}

export function plan(f: CapacityFigures, peak: number, p: PlanParams = DEFAULT_PLAN): Plan {
  // The api's calls reach Redis from many connections, each with several in flight: between the
  // two measured reserve costs; the one-at-a-time one is the conservative choice.
  const redisUs = f.redisReserveUs + f.redisRelayUs + f.redisConsumerUs;
  // Redis runs scripts on one thread: one primary = one core.
  const primaries = ceil(cores(peak, redisUs, p));
  const consumers = ceil(cores(peak, f.consumerUs, p));
  const kafkaUs =
    f.kafkaProduceUs !== undefined && f.kafkaConsumeUs !== undefined
      ? (f.kafkaProduceUs + f.kafkaConsumeUs) * p.replicationFactor
      : undefined;
  return {
    peak,
    redisUsPerReservation: redisUs,
    redisPrimaries: primaries,
    redisReplicas: primaries,
    // One primary takes the whole peak: a hot SKU needs no buckets (one = unbucketed).
    hotSkuBuckets: primaries === 1 ? 1 : primaries * p.bucketsPerPrimary,
    relayProcesses: ceil(cores(peak, f.relayUs, p)),
    consumerProcesses: consumers,
    kafkaPartitions: consumers * p.partitionsPerConsumer,
    kafkaCores: kafkaUs === undefined ? undefined : cores(peak, kafkaUs, p),
    postgresCores: f.postgresUs === undefined ? undefined : cores(peak, f.postgresUs, p),
    redisBytesPerOutageMinute:
      f.redisBytesWaiting === undefined ? undefined : peak * 60 * f.redisBytesWaiting,
  };
}

const int = (x: number): string => Math.round(x).toLocaleString('en-US');
const one = (x: number | undefined): string => (x === undefined ? 'not measured' : x.toFixed(1));
const mb = (bytes: number | undefined): string =>
  bytes === undefined ? 'not measured' : `${int(bytes / 2 ** 20)} MiB`;
const perCore = (us: number | undefined): string =>
  us === undefined || us <= 0 ? 'not measured' : int(1e6 / us);

export const WORKED_PEAKS = [10_000, 100_000, 500_000] as const;

export const BLOCK_BEGIN =
  '<!-- bench:capacity:begin (written by `make bench`, phase capacity; do not edit) -->';
export const BLOCK_END = '<!-- bench:capacity:end -->';

/**
 * The generated part of docs/capacity.md: the measured costs and the worked examples computed from
 * them. The figures travel with the block as JSON, so a test can re-render it and prove the page
 * was written by the bench and not edited by hand.
 */
export function renderCapacityBlock(f: CapacityFigures, p: PlanParams = DEFAULT_PLAN): string {
  const l: string[] = [BLOCK_BEGIN, `<!-- capacity-figures ${JSON.stringify(f)} -->`, ''];
  l.push(
    `Measured on ${f.meta.date}, commit \`${f.meta.commit}\`: ${f.meta.machine}. ${f.meta.servers} ${f.meta.load}`,
    '',
    `Each stage handled ${int(f.n)} reservations (messages, orders) alone, the other roles stopped, so each process's CPU time belongs to that stage.`,
    '',
    '| Operation | Where | CPU µs per operation | per core-second |',
    '| --- | --- | ---: | ---: |',
    `| reserve script, 50 connections, one call at a time each | Redis | ${one(f.redisReserveUs)} | ${perCore(f.redisReserveUs)} |`,
    `| reserve script, one connection, 50 in flight (as the api) | Redis | ${one(f.redisReservePipelinedUs)} | ${perCore(f.redisReservePipelinedUs)} |`,
    `| relay: stream read, ack, delete | Redis | ${one(f.redisRelayUs)} | ${perCore(f.redisRelayUs)} |`,
    `| consumer: results and ledger | Redis | ${one(f.redisConsumerUs)} | ${perCore(f.redisConsumerUs)} |`,
    `| relay: one order to Kafka (in batch messages, acks=all, idempotent) | relay process | ${one(f.relayUs)} | ${perCore(f.relayUs)} |`,
    `| consumer: one order into PostgreSQL | consumer process | ${one(f.consumerUs)} | ${perCore(f.consumerUs)} |`,
    `| one order (batch insert, journal, guard, events outbox) | PostgreSQL | ${one(f.postgresUs)} | ${perCore(f.postgresUs)} |`,
    `| one order produced, in batch messages (replication 1) | Kafka broker | ${one(f.kafkaProduceUs)} | ${perCore(f.kafkaProduceUs)} |`,
    `| one order consumed, in batch messages (replication 1) | Kafka broker | ${one(f.kafkaConsumeUs)} | ${perCore(f.kafkaConsumeUs)} |`,
    '',
    `Wall-clock rates of one process each on this shared machine: relay ${int(f.relayRate)} orders/s, consumer ${int(f.consumerRate)} orders/s.`,
    '',
    f.redisBytesWaiting === undefined || f.redisBytesKept === undefined
      ? 'Redis memory per reservation: not measured in this run.'
      : `Redis memory per reservation (INFO used_memory): ${int(f.redisBytesWaiting)} bytes while its order is on its way (the outbox entry and the unconfirmed ledger entry with the rest; the relay stopped, as during a Kafka outage), ${int(f.redisBytesKept)} bytes once the order is written (stock, the buyer's keys and the result, until the activity's cleanup).`,
    '',
    `Worked examples (utilisation ${p.utilisation}, ${p.bucketsPerPrimary} buckets per primary, ${p.partitionsPerConsumer} partitions per consumer, Kafka replication ${p.replicationFactor}):`,
    '',
    '| Peak reservations/s | Redis µs per reservation | Redis primaries (+ replicas) | hot-SKU buckets | relay processes | consumer processes | Kafka partitions | Kafka broker cores (est.) | PostgreSQL cores | Redis memory a minute at the peak takes with Kafka away |',
    '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
  );
  for (const peak of WORKED_PEAKS) {
    const x = plan(f, peak, p);
    l.push(
      `| ${int(peak)} | ${one(x.redisUsPerReservation)} | ${x.redisPrimaries} (+${x.redisReplicas}) | ${x.hotSkuBuckets} | ${x.relayProcesses} | ${x.consumerProcesses} | ${x.kafkaPartitions} | ${one(x.kafkaCores)} | ${one(x.postgresCores)} | ${mb(x.redisBytesPerOutageMinute)} |`,
    );
  }
  l.push('', BLOCK_END);
  return l.join('\n');
}

/** Replaces the generated block of the page (which must have both markers) with `block`. */
export function replaceCapacityBlock(page: string, block: string): string {
  const a = page.indexOf(BLOCK_BEGIN);
  const b = page.indexOf(BLOCK_END);
  if (a < 0 || b < a) throw new Error('docs/capacity.md has no bench:capacity block markers');
  return page.slice(0, a) + block + page.slice(b + BLOCK_END.length);
}

/** The figures embedded in a page's generated block, or undefined. */
export function figuresOfPage(page: string): CapacityFigures | undefined {
  const m = /<!-- capacity-figures (\{.*\}) -->/.exec(page);
  return m ? (JSON.parse(m[1]!) as CapacityFigures) : undefined;
}
