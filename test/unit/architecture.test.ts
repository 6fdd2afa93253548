// The structural invariants of ARCHITECTURE.md, checked on the source: who may import whom, and
// which module alone composes Redis keys, maps script return codes and holds a table's SQL.
// Pure file reading (no servers). Named by mutants in test/faults/mutants/.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

function tsFiles(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(join(ROOT, dir))) {
    const rel = join(dir, name);
    if (statSync(join(ROOT, rel)).isDirectory()) out.push(...tsFiles(rel));
    else if (name.endsWith('.ts')) out.push(rel);
  }
  return out.sort();
}

const source = (file: string): string => readFileSync(join(ROOT, file), 'utf8');

/** The source without comments (so prose about `UPDATE`s or keys does not count). */
function code(file: string): string {
  return source(file)
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .split('\n')
    .map((l) => l.replace(/(^|[^:'"`\\])\/\/.*$/, '$1'))
    .join('\n');
}

/** Module specifiers of every import / export-from / dynamic import, resolved to repo paths when relative. */
function imports(file: string): string[] {
  const specs = [
    ...code(file).matchAll(
      /(?:import|export)\s[^'"`;]*?from\s*['"]([^'"]+)['"]|import\s*\(?\s*['"]([^'"]+)['"]/g,
    ),
  ].map((m) => (m[1] ?? m[2])!);
  return specs.map((s) =>
    s.startsWith('.') ? relative(ROOT, join(ROOT, dirname(file), s)).replace(/\.js$/, '.ts') : s,
  );
}

const PRODUCTION = [...tsFiles('core'), ...tsFiles('runtime'), ...tsFiles('operator')];
const ROLES = ['api', 'relay', 'consumer', 'jobs', 'payments'] as const;

describe('architecture invariants (ARCHITECTURE.md)', () => {
  test('the source tree is where these rules look for it', () => {
    expect(PRODUCTION).toEqual(
      expect.arrayContaining(['core/keys.ts', 'runtime/api/app.ts', 'operator/main.ts']),
    );
    expect(imports('runtime/consumer/consumer.ts')).toEqual(
      expect.arrayContaining(['core/activity-cache.ts', 'kafkajs']),
    );
  });

  test('core imports neither express nor @kubernetes/client-node (nor the runtime or the operator)', () => {
    const bad = tsFiles('core').flatMap((f) =>
      imports(f)
        .filter((s) => /^(express|@kubernetes\/client-node)(\/|$)|^(runtime|operator)\//.test(s))
        .map((s) => `${f} imports ${s}`),
    );
    expect(bad).toEqual([]);
  });

  test('a runtime role never imports another role', () => {
    const bad: string[] = [];
    for (const role of ROLES) {
      for (const f of tsFiles(`runtime/${role}`)) {
        for (const s of imports(f)) {
          const other = ROLES.find((r) => r !== role && s.startsWith(`runtime/${r}/`));
          if (other) bad.push(`${f} (${role}) imports ${s} (${other})`);
        }
      }
    }
    expect(bad).toEqual([]);
  });

  test('roles are started only by the composition root (runtime/main.ts and runtime/roles/)', () => {
    // Each start function wires the code of its own role only (plus payments where it serves or
    // refunds them); roles/index.ts composes them, roles/process.ts is what every role shares.
    const wires: Record<string, readonly string[]> = {
      'runtime/roles/api.ts': ['api', 'payments'],
      'runtime/roles/relay.ts': ['relay'],
      'runtime/roles/consumer.ts': ['consumer'],
      'runtime/roles/jobs.ts': ['jobs', 'payments'],
      'runtime/roles/after-sale.ts': ['jobs', 'payments'],
      'runtime/roles/process.ts': [],
      'runtime/roles/index.ts': [],
    };
    expect(tsFiles('runtime/roles')).toEqual(Object.keys(wires).sort());
    const bad: string[] = [];
    for (const [f, own] of Object.entries(wires)) {
      for (const s of imports(f)) {
        const role = ROLES.find((r) => s.startsWith(`runtime/${r}/`));
        if (role && !own.includes(role)) bad.push(`${f} imports ${s} (${role})`);
      }
    }
    for (const role of ROLES) {
      for (const f of tsFiles(`runtime/${role}`)) {
        for (const s of imports(f))
          if (s.startsWith('runtime/roles/') || s === 'runtime/main.ts') bad.push(`${f} imports ${s}`);
      }
    }
    expect(bad).toEqual([]);
  });

  test('the order message is defined once (core/order-message.ts)', () => {
    // Its type, its schema's rules and the names of the fields reserve-9.lua writes are stated
    // there only; everything else derives from it (ARCHITECTURE.md, core/).
    const restated = [
      /\binterface\s+(OrderMessage|ReservationRecord)\b/,
      /z\s*\.\s*object\(\{[^}]*\breservationId\s*:/,
      // The price rule of the schema, as a hand-written check would copy it.
      /\\d\{1,12\}\(\\\.\\d\{1,2\}\)\?/,
      // Reservation hash and outbox entry fields read by name.
      /['"](qty|req|rid)['"]|\.(qty|req)\b/,
    ];
    const bad = PRODUCTION.filter((f) => f !== 'core/order-message.ts').flatMap((f) =>
      restated.filter((re) => re.test(code(f))).map((re) => `${f} matches ${re}`),
    );
    expect(bad).toEqual([]);
    expect(restated.every((re) => re.test(source('core/order-message.ts')) || re === restated[0])).toBe(true);
  });

  test('production code (and what the image runs) never imports dev/ or test/', () => {
    // dev/ holds what the tests and the demo share (servers, processes, a fake provider); the
    // build (tsconfig.build.json) leaves it out, so an import from production would break the image.
    const bad = [...PRODUCTION, 'scripts/migrate.ts'].flatMap((f) =>
      imports(f)
        .filter((s) => /^(dev|test|bench)\//.test(s))
        .map((s) => `${f} imports ${s}`),
    );
    expect(bad).toEqual([]);
  });

  test('a long-lived Kafka producer is made afresh after a failed send (a broker may forget its producer id)', () => {
    // kafkajs does not retry UNKNOWN_PRODUCER_ID / OUT_OF_ORDER_SEQUENCE_NUMBER: a role that keeps
    // one producer fails its every later send. A role's producer comes from a factory (the relay's
    // createProducer) or a RenewingProducer; the dlq command's lives for one command.
    const oneShot = new Set(['runtime/dlq.ts']);
    const bad = tsFiles('runtime')
      .filter((f) => !oneShot.has(f))
      .flatMap((f) =>
        [...code(f).matchAll(/(.{0,40})\bidempotentProducer\(/g)]
          .filter((m) => !/\(\)\s*=>\s*$/.test(m[1]!))
          .map((m) => `${f}: ${m[0].trim()}`),
      );
    expect(bad).toEqual([]);
  });

  test('the operator never imports runtime/', () => {
    const bad = tsFiles('operator').flatMap((f) =>
      imports(f)
        .filter((s) => s.startsWith('runtime/'))
        .map((s) => `${f} imports ${s}`),
    );
    expect(bad).toEqual([]);
  });

  test('only core/keys.ts composes Redis keys (no other file writes an "fs:" key literal)', () => {
    const bad = PRODUCTION.filter((f) => f !== 'core/keys.ts').filter((f) => /['"`]fs:/.test(code(f)));
    expect(bad).toEqual([]);
  });

  test('only core/errors.ts maps script return codes; only core/scripts.ts reads lua/', () => {
    const mapping = PRODUCTION.filter((f) => f !== 'core/errors.ts').filter((f) =>
      /ScriptErrorCodes\s*[:=]|\[-\d+\]\s*:\s*'[A-Z_]+'/.test(code(f)),
    );
    expect(mapping).toEqual([]);
    const lua = PRODUCTION.filter((f) => f !== 'core/scripts.ts').filter(
      (f) => /readFileSync|readdirSync/.test(code(f)) && /\.lua|['"`]lua['"`/]/.test(code(f)),
    );
    expect(lua).toEqual([]);
  });

  test('a script only touches the keys it is given: every redis.call names one of its KEYS', () => {
    const bad: string[] = [];
    let checked = 0;
    const dir = join(ROOT, 'lua');
    const files = [
      ...readdirSync(dir).filter((f) => f.endsWith('.lua')),
      ...readdirSync(join(dir, 'includes')).map((f) => `includes/${f}`),
    ];
    expect(files).toEqual(expect.arrayContaining(['reserve-9.lua', 'release-6.lua']));
    for (const f of files) {
      const lua = readFileSync(join(dir, f), 'utf8').replace(/--\[\[[\s\S]*?\]\]/g, '');
      const aliases = new Set([...lua.matchAll(/local\s+(\w+)\s*=\s*KEYS\[/g)].map((m) => m[1]!));
      for (const m of lua.matchAll(/redis\.call\(\s*'(\w+)'\s*(?:,\s*([^,)]+))?/g)) {
        const [, cmd, key] = m;
        if (cmd === 'TIME' || cmd === 'PUBLISH') continue;
        const k = (key ?? '').trim();
        checked += 1;
        // `unpack(KEYS, i)` passes the script's own keys from the i-th on.
        if (!/^KEYS\[[^\]]+\]$/.test(k) && k !== 'unpack(KEYS' && !aliases.has(k))
          bad.push(`${f}: redis.call('${cmd}', ${k})`);
      }
    }
    expect(bad).toEqual([]);
    expect(checked).toBeGreaterThan(30);
  });

  test("each table's SQL lives in that table's store: no SQL outside core/db/, and only the store writes its table", () => {
    const STORE: Record<string, string> = {
      orders: 'core/db/orders-store.ts',
      order_journal: 'core/db/journal-store.ts',
      activity_stock: 'core/db/stock-store.ts',
      activity_writebacks: 'core/db/stock-store.ts',
      catalog_items: 'core/db/catalog-store.ts',
      payments: 'core/db/payments-store.ts',
      reconciliation_reports: 'core/db/reconciliation-store.ts',
      order_gap_repairs: 'core/db/gap-repairs-store.ts',
      activity_registry: 'core/db/activity-registry-store.ts',
      refunds: 'core/db/refunds-store.ts',
      order_events: 'core/db/order-events-store.ts',
      activity_claims: 'core/db/claims-store.ts',
      activity_items: 'core/db/activity-items-store.ts',
      activity_skus: 'core/db/activity-skus-store.ts',
      cache_restores: 'core/db/cache-restores-store.ts',
      activity_registrations: 'core/db/registrations-store.ts',
    };
    // Every table the migrations create has a store (a new table needs its line above).
    const tables = [...source('core/db/migrations.ts').matchAll(/CREATE TABLE (\w+)/g)].map((m) => m[1]!);
    expect(tables.filter((t) => !STORE[t])).toEqual([]);
    const sql = /\b(SELECT\s[\s\S]*?\sFROM\s+\w+|INSERT\s+INTO\s+\w+|UPDATE\s+\w+\s+SET|DELETE\s+FROM\s+\w+)/;
    const outside = PRODUCTION.filter((f) => !f.startsWith('core/db/')).filter((f) => sql.test(code(f)));
    expect(outside).toEqual([]);
    const bad: string[] = [];
    for (const f of tsFiles('core/db').filter((x) => x !== 'core/db/migrations.ts')) {
      for (const m of code(f).matchAll(/\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)/g)) {
        const owner = STORE[m[1]!];
        if (owner && owner !== f) bad.push(`${f} writes ${m[1]} (owned by ${owner})`);
      }
    }
    expect(bad).toEqual([]);
  });
});
