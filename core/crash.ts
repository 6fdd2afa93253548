/**
 * Fault injection for the crash-window tests: when FLASHSALE_CRASH_POINT names this point, the
 * process dies right here with SIGKILL (no cleanup, no flush), on the Nth time the line is reached
 * (FLASHSALE_CRASH_AFTER, default 1). Production never sets these variables.
 */
const point = process.env.FLASHSALE_CRASH_POINT ?? '';
const after = Math.max(1, Number(process.env.FLASHSALE_CRASH_AFTER ?? '1') || 1);
let hits = 0;

export type CrashPoint =
  | 'api-after-reserve'
  | 'relay-after-kafka-ack'
  | 'consumer-before-db-commit'
  | 'consumer-after-db-commit'
  | 'consumer-before-results'
  // Fault suite (docs/faults.md): relay read its batch, before producing it to Kafka.
  | 'relay-before-kafka-send'
  // Refund worker: the provider answered (the money moved), before the database records it.
  | 'refund-after-provider-answer'
  // Order-event relay: Kafka acknowledged the events, before they are marked published.
  | 'order-events-after-kafka-ack'
  // Operator: each right after a side effect and before the status records it, which is exactly
  // where a crash is hardest to recover from.
  | 'operator-after-finalizer'
  | 'operator-after-topics'
  // The bucket counts are recorded, nothing of the SKUs loaded yet.
  | 'operator-after-bucket-plan'
  | 'operator-after-load'
  | 'operator-after-open-gate'
  | 'operator-after-close-gate'
  | 'operator-after-drain'
  | 'operator-after-freeze'
  | 'operator-after-write-back'
  | 'operator-after-cleanup'
  | 'operator-after-restore-begin'
  | 'operator-after-restore-hold'
  | 'operator-after-restore-reload'
  | 'operator-after-restore-resume';

export function crashPoint(name: CrashPoint): void {
  if (point !== name) return;
  hits += 1;
  if (hits >= after) process.kill(process.pid, 'SIGKILL');
}
