// runtime/api/openapi.yaml against the code: the documented problem codes are real ones and
// include every code the buyer and payment routes throw (their own and the ones of core that
// reach them), and the statuses routes can answer are documented.
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { ErrorCodes } from '../../../core/errors.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

interface Operation {
  responses: Record<string, unknown>;
}
interface OpenApi {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: { Problem: { properties: { code: { enum: string[] } } } } };
}

const doc = parse(readFileSync(join(ROOT, 'runtime', 'api', 'openapi.yaml'), 'utf8')) as OpenApi;
const documented = doc.components.schemas.Problem.properties.code.enum;

/** Codes thrown as `new FlashSaleError('CODE'` or sent with `sendProblem(res, 'CODE'` in a folder. */
function codesIn(folder: string): string[] {
  const codes = new Set<string>();
  for (const name of readdirSync(join(ROOT, folder))) {
    if (!name.endsWith('.ts')) continue;
    const text = readFileSync(join(ROOT, folder, name), 'utf8');
    for (const m of text.matchAll(/(?:FlashSaleError\(|sendProblem\(\s*res,\s*)\s*'([A-Z_]+)'/g))
      codes.add(m[1]!);
  }
  return [...codes].sort();
}

describe('openapi.yaml', () => {
  test('every documented problem code exists', () => {
    expect(documented.filter((c) => !(c in ErrorCodes))).toEqual([]);
  });

  test('documents the codes the buyer and payment routes answer', () => {
    const answered = [
      ...codesIn('runtime/api'),
      ...codesIn('runtime/payments'),
      // From core, through these routes: a payment notification for an order the timeout closed
      // while the stock is written back (core/order-lifecycle.ts), a submission still meeting a
      // bucketed SKU after its retries (core/reservations.ts).
      'NOT_WRITTEN_BACK',
      'BUCKETED',
    ];
    expect(answered.filter((c) => !documented.includes(c))).toEqual([]);
  });

  test.each([
    ['/v1/activities/{activityId}/orders/{reservationId}', 'get', '400'],
    ['/v1/activities/{activityId}/orders/{reservationId}', 'delete', '400'],
    ['/v1/activities/{activityId}/order-codes', 'post', '415'],
    ['/v1/activities/{activityId}/registrations', 'post', '400'],
    ['/v1/activities/{activityId}/registrations', 'post', '415'],
    ['/v1/activities/{activityId}/orders/{reservationId}/refund', 'post', '415'],
    ['/v1/payments/{provider}/notifications', 'post', '400'],
    ['/v1/payments/{provider}/notifications', 'post', '415'],
    ['/v1/payments/{provider}/notifications', 'post', '503'],
  ])('%s %s can answer %s', (path, method, status) => {
    expect(Object.keys(doc.paths[path]?.[method]?.responses ?? {})).toContain(status);
  });
});
