// The TypeScript types of FlashSaleActivity and the CRD's OpenAPI schema cannot drift apart:
// operator/api/v1alpha1/schema-mirror.ts is checked against the types by the compiler (run here
// on that file) and against the CRD here, field by field, type by type, required or optional.
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { parse } from 'yaml';
import { specMirror, statusMirror } from '../../../operator/api/v1alpha1/schema-mirror.js';
import { API_VERSION, GROUP, KIND, PLURAL, Phase, VERSION } from '../../../operator/api/v1alpha1/types.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

interface Schema {
  type?: string;
  properties?: Record<string, Schema>;
  items?: Schema;
  required?: string[];
  default?: unknown;
  enum?: unknown[];
}

interface CrdVersion {
  name: string;
  subresources?: { status?: object };
  additionalPrinterColumns?: { name: string; jsonPath: string }[];
  schema: { openAPIV3Schema: Schema };
}

const crd = parse(readFileSync(join(ROOT, 'crds', 'flashsale.io_flashsaleactivities.yaml'), 'utf8')) as {
  metadata: { name: string };
  spec: {
    group: string;
    scope: string;
    names: { kind: string; plural: string; shortNames: string[] };
    versions: CrdVersion[];
  };
};
const version = crd.spec.versions.find((v) => v.name === VERSION);
const root = version?.schema.openAPIV3Schema;

/** The CRD schema in the mirror's shape: required = listed in `required` or defaulted. */
function node(s: Schema): unknown {
  if (s.type === 'object') {
    const properties: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(s.properties ?? {})) {
      properties[k] = {
        ...(node(v) as object),
        required: (s.required ?? []).includes(k) || v.default !== undefined,
      };
    }
    return { type: 'object', properties };
  }
  if (s.type === 'array') return { type: 'array', items: node(s.items ?? {}) };
  return { type: s.type };
}

function strip(mirror: unknown): unknown {
  return JSON.parse(JSON.stringify(mirror));
}

describe('FlashSaleActivity types vs CRD', () => {
  it('names the same group, version, kind and plural', () => {
    expect(crd.metadata.name).toBe(`${PLURAL}.${GROUP}`);
    expect(crd.spec).toMatchObject({
      group: GROUP,
      scope: 'Namespaced',
      names: { kind: KIND, plural: PLURAL, shortNames: ['fsa'] },
    });
    expect(API_VERSION).toBe(`${GROUP}/${VERSION}`);
    expect(version?.subresources?.status).toEqual({});
  });

  it('has the same spec fields, types and required-ness as FlashSaleActivitySpec', () => {
    const spec = root?.properties?.spec;
    expect(spec).toBeDefined();
    expect((node(spec ?? {}) as { properties: unknown }).properties).toEqual(strip(specMirror));
  });

  it('has the same status fields, types and required-ness as FlashSaleActivityStatus', () => {
    const status = root?.properties?.status;
    expect(status).toBeDefined();
    expect((node(status ?? {}) as { properties: unknown }).properties).toEqual(strip(statusMirror));
  });

  it('enumerates exactly the phases of the Phase constant', () => {
    expect(root?.properties?.status?.properties?.phase?.enum).toEqual(Object.values(Phase));
  });

  it('shows phase, start, end, remaining stock, order gap, age and the activity id', () => {
    const columns = Object.fromEntries(
      (version?.additionalPrinterColumns ?? []).map((c) => [c.name, c.jsonPath]),
    );
    expect(columns).toMatchObject({
      Phase: '.status.phase',
      Start: '.spec.schedule.startAt',
      End: '.spec.schedule.endAt',
      Remaining: '.status.stock.remaining',
      'Order-Gap': '.status.backlog.orderGap',
      Age: '.metadata.creationTimestamp',
      ID: '.status.activityId',
    });
  });

  it('compiles the mirror against the types, and the compiler catches a field missing from a mirror', () => {
    const dir = mkdtempSync(join(tmpdir(), 'fs-mirror-'));
    const bad = join(dir, 'bad-mirror.ts');
    const mirrorModule = join(ROOT, 'operator', 'api', 'v1alpha1', 'schema-mirror.js');
    writeFileSync(
      bad,
      `import type { Mirror } from ${JSON.stringify(mirrorModule)};\n` +
        `interface T { kept: string; forgotten?: number; }\n` +
        `export const m: Mirror<T> = { kept: { type: 'string', required: true } };\n`,
    );
    const good = join(ROOT, 'operator', 'api', 'v1alpha1', 'schema-mirror.ts');
    const program = ts.createProgram([good, bad], {
      strict: true,
      noEmit: true,
      skipLibCheck: true,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      target: ts.ScriptTarget.ES2022,
      types: [],
      lib: ['lib.es2023.d.ts'],
    });
    const messages = (file: string): string[] =>
      ts
        .getPreEmitDiagnostics(program, program.getSourceFile(file))
        .map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
    expect(messages(good)).toEqual([]);
    expect(messages(bad).join('\n')).toMatch(/forgotten/);
  });
});
