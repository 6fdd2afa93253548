/**
 * The script registry: the only module that reads `lua/`. Each file is named
 * `<verbNoun>-<numKeys>.lua` (or `-var` when the caller passes the key count), so no other code
 * repeats a key count. `--- @include "includes/x"` lines are spliced in, once per script; a
 * missing or circular include fails loudly at start-up. Scripts are registered once per ioredis
 * connection with `defineCommand` (EVALSHA with automatic fallback to EVAL on NOSCRIPT).
 */
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Cluster, Redis } from 'ioredis';
import { scriptError } from './errors.js';

export type RedisClient = Redis | Cluster;
export type ScriptReply = [number, ...(string | number)[]];

export interface ScriptSource {
  name: string;
  /** Fixed key count, or undefined when the caller passes it. */
  numberOfKeys: number | undefined;
  lua: string;
  sha1: string;
}

const INCLUDE = /^--- @include "([^"]+)"\s*$/gm;

export function luaDirectory(): string {
  if (process.env.FLASHSALE_LUA_DIR) return resolve(process.env.FLASHSALE_LUA_DIR);
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 4; i += 1) {
    const candidate = join(dir, 'lua');
    if (existsSync(join(candidate, 'setGate-1.lua'))) return candidate;
    dir = dirname(dir);
  }
  throw new Error('cannot find the lua/ directory; set FLASHSALE_LUA_DIR');
}

/**
 * A script with its includes spliced in, each include once: one an include of the script's
 * includes also names (a helper both need) is already defined above where it is named again.
 */
function expand(dir: string, file: string, stack: string[], spliced = new Set<string>()): string {
  if (stack.includes(file)) throw new Error(`circular @include: ${[...stack, file].join(' -> ')}`);
  const path = join(dir, file.endsWith('.lua') ? file : `${file}.lua`);
  if (!existsSync(path)) throw new Error(`missing @include "${file}" (from ${stack.at(-1) ?? 'root'})`);
  const text = readFileSync(path, 'utf8');
  return text.replace(INCLUDE, (_line, inc: string) => {
    // An include that is still being spliced is circular: expand() says so.
    if (spliced.has(inc) && ![...stack, file].includes(inc)) return `-- (${inc}: spliced above)`;
    spliced.add(inc);
    return expand(dir, inc, [...stack, file], spliced);
  });
}

export function loadScripts(dir = luaDirectory()): Map<string, ScriptSource> {
  const scripts = new Map<string, ScriptSource>();
  for (const file of readdirSync(dir)) {
    const m = /^([A-Za-z]+)-(\d+|var)\.lua$/.exec(file);
    if (!m) continue;
    const [, name, keys] = m as unknown as [string, string, string];
    const lua = expand(dir, file, []);
    scripts.set(name, {
      name,
      numberOfKeys: keys === 'var' ? undefined : Number(keys),
      lua,
      sha1: createHash('sha1').update(lua).digest('hex'),
    });
  }
  return scripts;
}

let cached: Map<string, ScriptSource> | undefined;
function sources(): Map<string, ScriptSource> {
  cached ??= loadScripts();
  return cached;
}

/** One script's text with its includes spliced in (for a library that runs a script of its own). */
export function scriptSource(name: string): ScriptSource {
  const source = sources().get(name);
  if (!source) throw new Error(`unknown script ${name}`);
  return source;
}

const registered = new WeakSet<object>();

type Invoker = (...args: (string | number)[]) => Promise<unknown>;

/**
 * Commands of the `-var` scripts, whose first argument is the key count, not a key: ioredis'
 * auto-pipelining on a cluster groups a command by its first argument when it does not know the
 * command, and would put such a call into another node's pipeline (core/redis.ts leaves them out).
 */
export function keyCountFirstCommands(): string[] {
  return [...sources().values()].filter((s) => s.numberOfKeys === undefined).map((s) => `fs_${s.name}`);
}

/** Registers every script on this connection (idempotent). */
export function registerScripts(redis: RedisClient): void {
  if (registered.has(redis)) return;
  for (const s of sources().values()) {
    const options =
      s.numberOfKeys === undefined ? { lua: s.lua } : { lua: s.lua, numberOfKeys: s.numberOfKeys };
    redis.defineCommand(`fs_${s.name}`, options);
  }
  registered.add(redis);
}

/**
 * Runs a script and turns negative codes into FlashSaleError. Positive replies are returned
 * as they are. For `-var` scripts the first argument is the key count.
 */
export async function runScript(
  redis: RedisClient,
  name: string,
  keys: string[],
  args: (string | number)[],
): Promise<ScriptReply> {
  registerScripts(redis);
  const source = sources().get(name);
  if (!source) throw new Error(`unknown script ${name}`);
  if (source.numberOfKeys !== undefined && source.numberOfKeys !== keys.length) {
    throw new Error(`script ${name} takes ${source.numberOfKeys} keys, got ${keys.length}`);
  }
  const invoke = (redis as unknown as Record<string, Invoker>)[`fs_${name}`];
  if (!invoke) throw new Error(`script ${name} is not registered`);
  const params = source.numberOfKeys === undefined ? [keys.length, ...keys, ...args] : [...keys, ...args];
  const reply = (await invoke.apply(redis, params)) as ScriptReply | number;
  const arr: ScriptReply = Array.isArray(reply) ? reply : [reply];
  const code = Number(arr[0]);
  if (code < 0) throw scriptError(name, code, arr.slice(1));
  return arr;
}
