/**
 * Text PostgreSQL cannot store: U+0000 (refused in text columns and in jsonb) and unpaired UTF-16
 * surrogates (JSON's `"\ud800"` parses to one; jsonb refuses its escape and a text column would
 * silently get U+FFFD instead). Client text that reaches PostgreSQL is checked against it first, so
 * the client gets a 400 and never the database's 500 (runtime/api/schemas.ts `storableText`, the
 * payment notifications in runtime/payments/apply.ts).
 */
const NOT_STORABLE = /[\0\p{Cs}]/u;

/** Whether PostgreSQL can store `text` as it is (well-formed UTF-16 without U+0000). */
export const isStorableText = (text: string): boolean => !NOT_STORABLE.test(text);

/**
 * `text` made storable, for text PostgreSQL must keep whatever it holds (a third party's answer,
 * an error message): U+0000 and unpaired surrogates become U+FFFD, and it is cut to at most `max`
 * code points, never between the two halves of a pair (a cut there would leave one unpaired).
 */
export function storableText(text: string, max: number): string {
  const points = Array.from(text.replace(/[\0\p{Cs}]/gu, '\uFFFD'));
  return points.length > max ? points.slice(0, max).join('') : points.join('');
}
