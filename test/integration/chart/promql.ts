// A small PromQL scanner for the metrics contract: finds the metric names a query selects and the
// label names its matchers use. It understands what dashboards and alert rules contain (selectors,
// functions, aggregations with by/without, vector matching, ranges, subqueries, offsets, Grafana
// variables and Grafana's label_values()/query_result()); anything it does not understand is an
// error, never a silent skip.

/** PromQL functions (Prometheus 3.x), aggregation operators, and Grafana's query helpers. */
const FUNCTIONS = new Set([
  'abs',
  'absent',
  'absent_over_time',
  'acos',
  'acosh',
  'asin',
  'asinh',
  'atan',
  'atanh',
  'avg_over_time',
  'ceil',
  'changes',
  'clamp',
  'clamp_max',
  'clamp_min',
  'cos',
  'cosh',
  'count_over_time',
  'day_of_month',
  'day_of_week',
  'day_of_year',
  'days_in_month',
  'deg',
  'delta',
  'deriv',
  'double_exponential_smoothing',
  'end',
  'exp',
  'floor',
  'histogram_avg',
  'histogram_count',
  'histogram_fraction',
  'histogram_quantile',
  'histogram_stddev',
  'histogram_stdvar',
  'histogram_sum',
  'holt_winters',
  'hour',
  'idelta',
  'increase',
  'info',
  'irate',
  'label_join',
  'label_replace',
  'last_over_time',
  'ln',
  'log10',
  'log2',
  'mad_over_time',
  'max_over_time',
  'min_over_time',
  'minute',
  'month',
  'pi',
  'predict_linear',
  'present_over_time',
  'quantile_over_time',
  'rad',
  'rate',
  'resets',
  'round',
  'scalar',
  'sgn',
  'sin',
  'sinh',
  'sort',
  'sort_by_label',
  'sort_by_label_desc',
  'sort_desc',
  'sqrt',
  'start',
  'stddev_over_time',
  'stdvar_over_time',
  'sum_over_time',
  'tan',
  'tanh',
  'time',
  'timestamp',
  'vector',
  'year',
  // aggregation operators
  'avg',
  'bottomk',
  'count',
  'count_values',
  'group',
  'limit_ratio',
  'limitk',
  'max',
  'min',
  'quantile',
  'stddev',
  'stdvar',
  'sum',
  'topk',
]);
/** Keywords followed by a parenthesised list of label names. */
const LABEL_LIST_KEYWORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right']);
const KEYWORDS = new Set([
  'and',
  'or',
  'unless',
  'bool',
  'offset',
  'atan2',
  'inf',
  'nan',
  ...LABEL_LIST_KEYWORDS,
]);
const IDENT = /[A-Za-z_:][A-Za-z0-9_:]*/y;

export interface Selector {
  metric: string;
  /** Label names used in this selector's matchers. */
  labels: string[];
  /** The matcher block as written (`{a="b", ...}`), when asked for (`selectors(expr, true)`). */
  block?: string;
}

export class PromQLScanError extends Error {}

function skipString(expr: string, i: number): number {
  const quote = expr[i];
  let j = i + 1;
  while (j < expr.length && expr[j] !== quote) j += expr[j] === '\\' && quote !== '`' ? 2 : 1;
  if (j >= expr.length) throw new PromQLScanError(`unterminated string in: ${expr}`);
  return j + 1;
}

/** Index just past the bracket that closes the one at i (strings skipped). */
function skipGroup(expr: string, i: number, open: string, close: string): number {
  let depth = 0;
  for (let j = i; j < expr.length;) {
    const c = expr[j] as string;
    if (c === '"' || c === "'" || c === '`') {
      j = skipString(expr, j);
      continue;
    }
    if (c === open) depth += 1;
    if (c === close) {
      depth -= 1;
      if (depth === 0) return j + 1;
    }
    j += 1;
  }
  throw new PromQLScanError(`unbalanced ${open}${close} in: ${expr}`);
}

/** Label names of a `{...}` matcher block starting at i. */
function matcherLabels(block: string): string[] {
  const labels: string[] = [];
  const body = block.slice(1, -1);
  for (let i = 0; i < body.length;) {
    const c = body[i] as string;
    if (c === '"' || c === "'" || c === '`') {
      i = skipString(body, i);
      continue;
    }
    IDENT.lastIndex = i;
    const m = IDENT.exec(body);
    if (m) {
      labels.push(m[0]);
      i += m[0].length;
      continue;
    }
    i += 1;
  }
  return labels;
}

function nextNonSpace(expr: string, i: number): number {
  let j = i;
  while (j < expr.length && /\s/.test(expr[j] as string)) j += 1;
  return j;
}

/** Splits `a, b` at its last top-level comma. */
function splitLastArg(args: string): [string, string | undefined] {
  let depth = 0;
  let last = -1;
  for (let i = 0; i < args.length;) {
    const c = args[i] as string;
    if (c === '"' || c === "'" || c === '`') {
      i = skipString(args, i);
      continue;
    }
    if (c === '(' || c === '{' || c === '[') depth += 1;
    if (c === ')' || c === '}' || c === ']') depth -= 1;
    if (c === ',' && depth === 0) last = i;
    i += 1;
  }
  return last < 0 ? [args, undefined] : [args.slice(0, last), args.slice(last + 1).trim()];
}

/**
 * The metric selectors of a PromQL expression (or a Grafana variable query); with `withBlocks`,
 * each one's matcher block too.
 */
export function selectors(expr: string, withBlocks = false): Selector[] {
  const grafana = /^\s*(label_values|query_result)\s*\(([\s\S]*)\)\s*$/.exec(expr);
  if (grafana) {
    const [, fn, args = ''] = grafana;
    if (fn === 'query_result') return selectors(args, withBlocks);
    const [query, label] = splitLastArg(args);
    if (label === undefined) return []; // label_values(label): no metric
    const found = selectors(query, withBlocks);
    if (found.length !== 1) throw new PromQLScanError(`label_values needs one metric: ${expr}`);
    const only = found[0] as Selector;
    return [{ ...only, labels: [...only.labels, label] }];
  }
  const out: Selector[] = [];
  let i = 0;
  while (i < expr.length) {
    const c = expr[i] as string;
    if (/\s/.test(c)) {
      i += 1;
    } else if (c === '#') {
      const nl = expr.indexOf('\n', i);
      i = nl < 0 ? expr.length : nl + 1;
    } else if (c === '"' || c === "'" || c === '`') {
      i = skipString(expr, i);
    } else if (c === '{') {
      const end = skipGroup(expr, i, '{', '}');
      const labels = matcherLabels(expr.slice(i, end));
      if (labels.includes('__name__'))
        throw new PromQLScanError(`select metrics by name, not __name__: ${expr}`);
      throw new PromQLScanError(`a matcher block without a metric name: ${expr}`);
    } else if (c === '[') {
      i = skipGroup(expr, i, '[', ']');
    } else if (c === '$') {
      // A Grafana variable: $name, ${name} or ${name:format}.
      if (expr[i + 1] === '{') {
        i = skipGroup(expr, i + 1, '{', '}');
      } else {
        IDENT.lastIndex = i + 1;
        i += 1 + (IDENT.exec(expr)?.[0].length ?? 0);
      }
    } else if (/[0-9.]/.test(c)) {
      const number = /[0-9.][0-9A-Za-z.]*/y; // 0.95, 5m, 1e6, 0x1f
      number.lastIndex = i;
      i += number.exec(expr)?.[0].length ?? 1;
    } else if (/[A-Za-z_:]/.test(c)) {
      IDENT.lastIndex = i;
      const word = (IDENT.exec(expr) as RegExpExecArray)[0];
      const after = nextNonSpace(expr, i + word.length);
      const next = expr[after];
      if (LABEL_LIST_KEYWORDS.has(word) && next === '(') {
        i = skipGroup(expr, after, '(', ')');
      } else if (KEYWORDS.has(word)) {
        i += word.length;
      } else if (FUNCTIONS.has(word) && /^(by|without)\b/.test(expr.slice(after))) {
        i = after; // an aggregation with its grouping first: sum by (x) (...)
      } else if (next === '(') {
        if (!FUNCTIONS.has(word)) throw new PromQLScanError(`unknown function ${word}() in: ${expr}`);
        i = after; // the arguments are scanned as part of the expression
      } else {
        // A metric name, with an optional matcher block right after it.
        const sel: Selector = { metric: word, labels: [] };
        i += word.length;
        if (expr[i] === '{') {
          const end = skipGroup(expr, i, '{', '}');
          sel.labels = matcherLabels(expr.slice(i, end));
          if (withBlocks) sel.block = expr.slice(i, end);
          i = end;
        }
        out.push(sel);
      }
    } else {
      i += 1; // operators, parentheses, commas, @
    }
  }
  return out;
}

/** Metric name → label names, from a Prometheus text exposition (`registry.metrics()`). */
export function exposition(text: string): Map<string, Set<string>> {
  const metrics = new Map<string, Set<string>>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s/.exec(line);
    if (!m) throw new PromQLScanError(`unexpected exposition line: ${line}`);
    const name = m[1] as string;
    const labels = metrics.get(name) ?? new Set<string>();
    for (const pair of (m[3] ?? '').matchAll(/([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"/g)) {
      labels.add(pair[1] as string);
    }
    metrics.set(name, labels);
  }
  return metrics;
}

/** Labels every scraped series gets from the prometheus-operator's PodMonitor/ServiceMonitor. */
export const TARGET_LABELS = ['namespace', 'pod', 'container', 'endpoint', 'job', 'instance', 'service'];

/**
 * Problems of a set of queries against what the code exports: unknown metric names (a typo, a
 * renamed or removed metric), and matcher labels the metric does not have.
 */
export function contractViolations(
  queries: { source: string; expr: string }[],
  exported: Map<string, Set<string>>,
): string[] {
  const problems: string[] = [];
  for (const { source, expr } of queries) {
    let found: Selector[];
    try {
      found = selectors(expr);
    } catch (err) {
      problems.push(`${source}: ${(err as Error).message}`);
      continue;
    }
    for (const sel of found) {
      const labels = exported.get(sel.metric);
      if (!labels) {
        problems.push(`${source}: metric ${sel.metric} is not exported by core/metrics.ts`);
        continue;
      }
      for (const label of sel.labels) {
        if (!labels.has(label) && !TARGET_LABELS.includes(label)) {
          problems.push(
            `${source}: ${sel.metric} has no label "${label}" (it has: ${[...labels].join(', ')})`,
          );
        }
      }
    }
  }
  return problems;
}
