// The arguments of a throwaway redis-server on loopback, shared by the tests' private servers and
// the benchmarks' replica: nothing persisted (no RDB snapshots, no AOF), its files (a replica's
// full-sync RDB) in a directory of its own rather than the working tree.
export function ephemeralRedisArgs(port: number, dir: string, replicaOfPort?: number | string): string[] {
  const args = [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--dir',
    dir,
    '--save',
    '',
    '--appendonly',
    'no',
  ];
  if (replicaOfPort !== undefined) args.push('--replicaof', '127.0.0.1', String(replicaOfPort));
  return args;
}
