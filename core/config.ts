/**
 * Configuration is one typed object per program, read from the environment and validated at
 * start-up; a bad value stops the program with a message naming the variable.
 */
import { z } from 'zod';

export class ConfigError extends Error {}

export function readConfig<T extends z.ZodType>(schema: T, env: NodeJS.ProcessEnv = process.env): z.infer<T> {
  const result = schema.safeParse(env);
  if (!result.success) {
    const lines = result.error.issues.map((i) => `  ${i.path.join('.') || '(root)'}: ${i.message}`);
    throw new ConfigError(`invalid configuration:\n${lines.join('\n')}`);
  }
  return result.data;
}

/** A blank environment value (`X=`) reads as unset: coerced, it would be 0. */
export const unsetIfBlank = (v: unknown): unknown =>
  typeof v === 'string' && v.trim() === '' ? undefined : v;

/** `schema` for a number read from the environment, a blank value being unset. */
export function envNumber<T extends z.ZodType>(schema: T) {
  return z.preprocess(unsetIfBlank, schema);
}

/** Helpers for environment values (always strings). */
export const env = {
  /**
   * An integer; blank (`X=` in a Compose file or an env list) is unset, the default. Coerced as
   * it is, a blank would read as 0, which turns off every limit whose 0 means "off".
   */
  int: (def: number, min = 0, max = Number.MAX_SAFE_INTEGER) =>
    envNumber(z.coerce.number().int().min(min).max(max).default(def)),
  bool: (def: boolean) =>
    z
      .enum(['true', 'false', '1', '0'])
      .default(def ? 'true' : 'false')
      .transform((v) => v === 'true' || v === '1'),
  list: () =>
    z
      .string()
      .default('')
      .transform((v) =>
        v
          .split(',')
          .map((s) => s.trim())
          .filter(Boolean),
      ),
};
