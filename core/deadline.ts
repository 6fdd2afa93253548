/**
 * Waiting on something that may never answer, for a bounded time: a stop that must not outlast
 * the role's SHUTDOWN_TIMEOUT_MS while Kafka is frozen (kafkajs retries an idempotent send, a
 * group leave or a commit for as long as it takes).
 */

/**
 * How long a stop waits for a Kafka client's disconnect: milliseconds when the broker answers; a
 * frozen broker would hold it for the request timeout (core/kafka.ts KAFKA_REQUEST_TIMEOUT_MS).
 */
export const KAFKA_DISCONNECT_GRACE_MS = 1_000;

/** True once `work` has settled (fulfilled or rejected), false if `ms` pass first. */
export async function settlesWithin(work: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      work.then(
        () => true,
        () => true,
      ),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** `work`'s outcome, or a rejection once `ms` pass first (`work` itself runs on). */
export async function within<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      work,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new DeadlineExceededError(`${what}: no answer in ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

export class DeadlineExceededError extends Error {
  override name = 'DeadlineExceededError';
}
