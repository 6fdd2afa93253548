/** The part of autocannon's programmatic API the benchmark uses (autocannon ships no types). */
declare module 'autocannon' {
  namespace autocannon {
    interface RawRequest {
      method?: string;
      path?: string;
      headers?: Record<string, string>;
      body?: string | Buffer;
    }
    interface RequestSpec extends RawRequest {
      setupRequest?: (req: RawRequest, context: Record<string, unknown>) => RawRequest;
      onResponse?: (status: number, body: string, context: Record<string, unknown>) => void;
    }
    interface Options {
      url: string;
      connections?: number;
      pipelining?: number;
      duration?: number;
      amount?: number;
      timeout?: number;
      headers?: Record<string, string>;
      method?: string;
      body?: string;
      requests?: RequestSpec[];
      excludeErrorStats?: boolean;
    }
    interface Histogram {
      average: number;
      mean: number;
      stddev: number;
      min: number;
      max: number;
      total: number;
      p2_5: number;
      p50: number;
      p90: number;
      p97_5: number;
      p99: number;
    }
    interface Result {
      duration: number;
      start: Date;
      finish: Date;
      connections: number;
      pipelining: number;
      errors: number;
      timeouts: number;
      non2xx: number;
      '2xx': number;
      '4xx': number;
      '5xx': number;
      latency: Histogram;
      requests: Histogram & { sent: number };
      throughput: Histogram;
      statusCodeStats: Record<string, { count: number }>;
    }
  }
  function autocannon(opts: autocannon.Options): Promise<autocannon.Result>;
  export = autocannon;
}
