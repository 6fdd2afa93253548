/**
 * The operator's stop on SIGTERM: the reconcile passes in flight, then the Lease, then the
 * connections, each waited for a bounded time. A server that does not answer (a partition, a
 * stalled host) never answers a QUIT, a pool's end or a Kafka disconnect either; waiting for them
 * kept the process alive until the kubelet's SIGKILL at terminationGracePeriodSeconds (30 s by
 * default) on every rollout during an outage (test/e2e/operator/stop-while-frozen.test.ts).
 */
import { settlesWithin } from '../../core/deadline.js';
import type { Logger } from '../../core/logger.js';

export interface StopGraces {
  /**
   * The passes in flight may be between two writes: waiting for them (rather than giving the Lease
   * away at once) keeps the next leader from starting beside a pass of this one.
   */
  passesMs: number;
  /** Giving the Lease away is one read and one write to the API server. */
  releaseMs: number;
  /** Each connection's close: milliseconds when its server answers. */
  closeMs: number;
}

export const STOP_GRACES: StopGraces = { passesMs: 15_000, releaseMs: 5_000, closeMs: 2_000 };

/**
 * Past this the stop gives up with exit 1 ("shutdown timed out"). Above the graces' sum (22 s),
 * below the chart's terminationGracePeriodSeconds (30 s): it only fires on a wait no grace covers.
 */
export const SHUTDOWN_TIMEOUT_MS = 25_000;

export interface ConnectionCloser {
  name: string;
  close: () => Promise<unknown>;
  /** Drops what `close` could not end in time (a socket destroyed rather than left open). */
  abandon?: () => void;
}

export interface OperatorStop {
  /** Stops the workers and informers; resolves when the passes in flight have finished. */
  stopPasses: () => Promise<void>;
  /** Gives the Lease away (no-op without leader election or when not leading). */
  releaseLease: () => Promise<void>;
  connections: ConnectionCloser[];
  log: Logger;
  graces?: StopGraces;
}

/** Resolves within the graces' sum whatever the servers do; never rejects. */
export async function stopOperator(s: OperatorStop): Promise<void> {
  const g = s.graces ?? STOP_GRACES;
  if (!(await settlesWithin(s.stopPasses(), g.passesMs))) {
    s.log.warn({ waitedMs: g.passesMs }, 'reconcile passes still running; giving the Lease away');
  }
  if (!(await settlesWithin(s.releaseLease(), g.releaseMs))) {
    s.log.warn({ waitedMs: g.releaseMs }, 'the API server did not answer the Lease release; it expires');
  }
  await Promise.all(
    s.connections.map(async (c) => {
      if (await settlesWithin(c.close(), g.closeMs)) return;
      c.abandon?.();
      s.log.warn({ connection: c.name, waitedMs: g.closeMs }, 'connection did not close in time; dropped');
    }),
  );
}
