import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ScriptErrorCodes, scriptError } from '../../../core/errors.js';
import { loadScripts, luaDirectory } from '../../../core/scripts.js';

describe('script registry', () => {
  test('loads every script with the key count its file name carries, includes spliced in', () => {
    const scripts = loadScripts();
    expect([...scripts.keys()]).toEqual(
      expect.arrayContaining([
        'cancelBeforeReserve',
        'confirmPaid',
        'loadItems',
        'release',
        'reserve',
        'setGate',
      ]),
    );
    expect(scripts.get('reserve')?.numberOfKeys).toBe(9);
    expect(scripts.get('soldOutChecks')?.numberOfKeys).toBeUndefined();
    expect(scripts.get('countWindow')?.numberOfKeys).toBe(1);
    expect(scripts.get('release')?.numberOfKeys).toBe(6);
    expect(scripts.get('cancelBeforeReserve')?.numberOfKeys).toBe(3);
    expect(scripts.get('loadItems')?.numberOfKeys).toBeUndefined();
    const reserve = scripts.get('reserve')!.lua;
    expect(reserve).toContain('local function nowMs()');
    expect(reserve).not.toContain('@include');
    // The batch runs reserve-9.lua's own text for each reservation of the call.
    const many = scripts.get('reserveMany');
    expect(many?.numberOfKeys).toBeUndefined();
    expect(many?.lua).toContain(reserve.slice(reserve.indexOf('local rid, user, sku, qty')));
    expect(many?.lua).not.toContain('@include');
  });

  test('an include named again by another include is spliced once', () => {
    const dir = mkdtempSync(join(tmpdir(), 'lua-'));
    writeFileSync(join(dir, 'helper.lua'), 'local function helper() return 1 end\n');
    writeFileSync(
      join(dir, 'user.lua'),
      '--- @include "helper"\nlocal function user() return helper() end\n',
    );
    writeFileSync(join(dir, 'both-1.lua'), '--- @include "helper"\n--- @include "user"\nreturn user()\n');
    const lua = loadScripts(dir).get('both')!.lua;
    expect(lua.match(/local function helper\(\)/g)).toHaveLength(1);
    expect(lua.indexOf('local function helper()')).toBeLessThan(lua.indexOf('local function user()'));
    expect(lua).not.toContain('@include');
  });

  test('a missing or circular include fails loudly', () => {
    const dir = mkdtempSync(join(tmpdir(), 'lua-'));
    writeFileSync(join(dir, 'broken-1.lua'), '--- @include "nope"\nreturn 1\n');
    expect(() => loadScripts(dir)).toThrow(/missing @include "nope"/);
    const dir2 = mkdtempSync(join(tmpdir(), 'lua-'));
    writeFileSync(join(dir2, 'a.lua'), '--- @include "b"\n');
    writeFileSync(join(dir2, 'b.lua'), '--- @include "a"\n');
    writeFileSync(join(dir2, 'loop-1.lua'), '--- @include "a"\nreturn 1\n');
    expect(() => loadScripts(dir2)).toThrow(/circular @include/);
  });

  test('every negative code documented in a script header maps to an error code, and no mapping is unused', () => {
    const documented = new Set<number>();
    for (const file of readdirSync(luaDirectory()).filter((f) => f.endsWith('.lua'))) {
      const header = /--\[\[([\s\S]*?)\]\]/.exec(readFileSync(join(luaDirectory(), file), 'utf8'))?.[1] ?? '';
      for (const m of header.matchAll(/^\s*(-\d+)\s+([A-Z_]+)/gm)) {
        const code = Number(m[1]);
        documented.add(code);
        expect({ file, code, name: ScriptErrorCodes[code] }).toEqual({ file, code, name: m[2] });
      }
    }
    expect([...documented].sort((a, b) => a - b)).toEqual(
      Object.keys(ScriptErrorCodes)
        .map(Number)
        .sort((a, b) => a - b),
    );
  });

  test('script errors carry the stable code and keep script data out of the message', () => {
    const e = scriptError('reserve', -4, [0]);
    expect([e.code, e.status, e.message]).toEqual(['SOLD_OUT', 409, 'Sold out']);
    expect(e.extra).toEqual({ script: 'reserve', data: [0] });
    expect(scriptError('reserve', -99).code).toBe('INTERNAL');
  });
});
