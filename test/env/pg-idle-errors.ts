/**
 * jest setup file (integration project). Each test file drops its database at the end with
 * `DROP DATABASE … WITH (FORCE)` (dev/servers.ts), which terminates every session still
 * connected to it. A pg.Pool reports the termination of an idle client as an 'error' event, and an
 * EventEmitter 'error' without a listener is thrown: jest then fails whichever test file the worker
 * runs next ("Test suite failed to run"), although nothing in it went wrong. Only that one case, an
 * idle session terminated by an administrator command (SQLSTATE 57P01) on a pool nobody listens
 * to, is absorbed here; every other pool error still surfaces.
 */
import pg from 'pg';

const ADMIN_SHUTDOWN = '57P01';
const proto = pg.Pool.prototype as unknown as {
  emit(event: string | symbol, ...args: unknown[]): boolean;
  listenerCount(event: string | symbol): number;
};
const emit = proto.emit;
proto.emit = function (this: typeof proto, event: string | symbol, ...args: unknown[]): boolean {
  const err = args[0] as { code?: unknown } | undefined;
  if (event === 'error' && this.listenerCount('error') === 0 && err?.code === ADMIN_SHUTDOWN) return false;
  return emit.call(this, event, ...args);
};
