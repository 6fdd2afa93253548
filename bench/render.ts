/**
 * Re-renders docs/benchmarks.md from a results file written by a run with BENCH_JSON set, e.g.
 * after editing bench/analysis.md:  node --import tsx bench/render.ts results.json [out.md]
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { renderReport } from './lib/report.js';
import type { Results } from './lib/report.js';

const [input, output] = process.argv.slice(2);
if (!input) throw new Error('usage: render.ts <results.json> [out.md]');
const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const results = JSON.parse(readFileSync(input, 'utf8')) as Results;
const analysisFile = join(repo, 'bench', 'analysis.md');
const analysis = existsSync(analysisFile) ? readFileSync(analysisFile, 'utf8') : '';
const out = resolve(output ?? join(repo, 'docs', 'benchmarks.md'));
writeFileSync(out, renderReport(results, analysis));
process.stderr.write(`wrote ${out}\n`);
