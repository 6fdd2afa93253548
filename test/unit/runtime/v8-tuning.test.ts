import { execFileSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadRuntimeConfig } from '../../../runtime/config.js';
import type { Role } from '../../../runtime/config.js';
import { v8FlagsFor } from '../../../runtime/v8-tuning.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/**
 * Runs applyV8Tuning for the role in a fresh process, then an allocation site whose objects all
 * survive (the pattern V8 pretenures), and returns V8's pretenuring decisions.
 */
function pretenuringDecisions(role: Role, env: Record<string, string> = {}): string[] {
  const script = `
    import { applyV8Tuning } from ${JSON.stringify(join(root, 'runtime', 'v8-tuning.ts'))};
    import { loadRuntimeConfig } from ${JSON.stringify(join(root, 'runtime', 'config.ts'))};
    applyV8Tuning(${JSON.stringify(role)}, loadRuntimeConfig(${JSON.stringify(role)}));
    const make = (i) => ({ a: i, b: [i, i + 1] });
    const keep = [];
    for (let i = 0; i < 2_000_000; i += 1) keep.push(make(i));
    process.stdout.write('kept ' + keep.length + '\\n');
  `;
  const out = execFileSync(
    process.execPath,
    ['--trace-pretenuring-statistics', '--import', 'tsx', '--input-type=module', '-e', script],
    {
      cwd: root,
      encoding: 'utf8',
      env: {
        PATH: process.env.PATH ?? '',
        REDIS_URL: 'redis://127.0.0.1:6379',
        DATABASE_URL: 'postgres://u@127.0.0.1:5432/db',
        KAFKA_BROKERS: '127.0.0.1:9092',
        ACTIVITY_ID: 'a1',
        JWT_HS256_SECRET: 's'.repeat(32),
        ...env,
      },
    },
  );
  expect(out).toContain('kept 2000000');
  return out.split('\n').filter((l) => /=> tenure/.test(l));
}

describe('V8 tuning per role', () => {
  test('the api turns allocation-site pretenuring off unless API_V8_PRETENURING is set', () => {
    const base = {
      REDIS_URL: 'redis://127.0.0.1:6379',
      DATABASE_URL: 'postgres://u@127.0.0.1:5432/db',
      JWT_HS256_SECRET: 's'.repeat(32),
    };
    expect(v8FlagsFor('api', loadRuntimeConfig('api', base))).toEqual(['--no-allocation-site-pretenuring']);
    expect(v8FlagsFor('api', loadRuntimeConfig('api', { ...base, API_V8_PRETENURING: 'true' }))).toEqual([]);
    expect(
      v8FlagsFor(
        'relay',
        loadRuntimeConfig('relay', { ...base, ACTIVITY_ID: 'a1', KAFKA_BROKERS: '127.0.0.1:9092' }),
      ),
    ).toEqual([]);
  });

  test('set at start-up, the flag stops V8 from pretenuring in the api process only', () => {
    // The relay keeps V8's default: the same allocations are pretenured there, which shows that
    // the pattern does trigger it and that the api's empty list is the flag's doing.
    expect(pretenuringDecisions('relay').length).toBeGreaterThan(0);
    expect(pretenuringDecisions('api', { API_V8_PRETENURING: 'true' }).length).toBeGreaterThan(0);
    expect(pretenuringDecisions('api')).toEqual([]);
  }, 60_000);
});
