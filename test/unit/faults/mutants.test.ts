// The broken builds of test/faults/mutants/ stay usable while the code moves: every mutant parses,
// names an invariant and existing test files, and each of its snippets occurs exactly once in
// today's tree. `make mutants` then proves they are caught; this only fails fast (in `make test`)
// when an edit elsewhere made a mutant stale, with the runner's own message.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadMutants, mutatedFiles, MutantError, parseMutant, ROOT } from '../../faults/mutants.js';

describe('mutants (test/faults/mutants/*.mutant)', () => {
  const mutants = loadMutants();

  test('at least one per invariant: 15 or more, each naming its invariant and tests that exist', () => {
    expect(mutants.length).toBeGreaterThanOrEqual(15);
    for (const m of mutants) {
      expect(m.invariant.length).toBeGreaterThan(10);
      for (const e of m.mustFail)
        expect([m.name, e.path, existsSync(join(ROOT, e.path))]).toEqual([m.name, e.path, true]);
    }
  });

  test.each(mutants.map((m) => [m.name, m] as const))(
    '%s applies to this tree and changes it',
    (_name, m) => {
      const files = mutatedFiles(m, ROOT);
      for (const [file, text] of files) expect(text).not.toBe(readFileSync(join(ROOT, file), 'utf8'));
    },
  );

  test('a snippet that is gone, or not unique, stops the mutant with a clear message', () => {
    const text = [
      '# mutant: demo',
      '# invariant: the demo invariant holds',
      '# must-fail: test/unit/faults/mutants.test.ts',
      '@@ lua/reserve-9.lua',
      '-this line is in no script',
      '+anything',
    ].join('\n');
    const gone = parseMutant('demo.mutant', text);
    expect(() => mutatedFiles(gone, ROOT)).toThrow(
      new MutantError(
        'mutant demo no longer applies: snippet not found in lua/reserve-9.lua:\nthis line is in no script',
      ),
    );
    const twice = parseMutant(
      'demo.mutant',
      text.replace('-this line is in no script', "-redis.call('HINCRBY'"),
    );
    expect(() => mutatedFiles(twice, ROOT)).toThrow(
      /mutant demo no longer applies: snippet found \d+ times in lua\/reserve-9.lua/,
    );
    expect(() => parseMutant('other.mutant', text)).toThrow(/must equal the file name/);
    expect(() => parseMutant('demo.mutant', text.replace(/# must-fail.*\n/, ''))).toThrow(
      /no "# must-fail:" line/,
    );
  });
});
