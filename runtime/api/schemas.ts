/**
 * Request schemas: nothing the client sends beyond ids and quantity is trusted or even read.
 *
 * The zod schemas are the definition. The two checks every order request pays for (the activity
 * id of the path and the submission body) also have a precompiled form, a few regular
 * expressions and type checks, that accepts exactly what the schema accepts; whatever it does
 * not accept goes through zod, so every refusal keeps zod's VALIDATION_ERROR and messages.
 */
import type { Request } from 'express';
import { z } from 'zod';
import { isStorableText } from '../../core/db/storable-text.js';
import { FlashSaleError } from '../../core/errors.js';

const ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
const QUANTITY_MAX = 100;
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,64}$/;
const ORDER_CODE = /^[A-Za-z0-9_-]{16,64}$/;

const id = z.string().regex(ID, 'letters, digits, ".", "_", "-"; at most 63');

export const submitOrderBody = z
  .object({
    skuId: id,
    quantity: z.number().int().min(1).max(QUANTITY_MAX),
    requestId: z.string().regex(REQUEST_ID, '1-64 characters of [A-Za-z0-9._:-]'),
    orderCode: z.string().regex(ORDER_CODE).optional(),
  })
  .strict();

export type SubmitOrder = z.infer<typeof submitOrderBody>;

/** submitOrderBody.parse() without zod for a body it accepts; zod's refusal for any other. */
export function parseSubmitOrder(value: unknown): SubmitOrder {
  if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
    const v = value as Record<string, unknown>;
    const { skuId, quantity, requestId, orderCode } = v;
    let keys = 0;
    for (const k in v) {
      if (!Object.hasOwn(v, k)) continue;
      if (k !== 'skuId' && k !== 'quantity' && k !== 'requestId' && k !== 'orderCode') {
        keys = -1;
        break;
      }
      keys += 1;
    }
    if (
      keys >= 3 &&
      typeof skuId === 'string' &&
      ID.test(skuId) &&
      typeof quantity === 'number' &&
      Number.isSafeInteger(quantity) &&
      quantity >= 1 &&
      quantity <= QUANTITY_MAX &&
      typeof requestId === 'string' &&
      REQUEST_ID.test(requestId) &&
      (orderCode === undefined || (typeof orderCode === 'string' && ORDER_CODE.test(orderCode)))
    ) {
      return orderCode === undefined
        ? { skuId, quantity, requestId }
        : { skuId, quantity, requestId, orderCode };
    }
  }
  return parse(submitOrderBody, value);
}

export const orderCodeBody = z.object({ skuId: id }).strict();

/**
 * The string schema `s` refined to text PostgreSQL can store (core/db/storable-text.ts; a 400,
 * never the database's 500). The ids above are ASCII by their patterns; every other free-text
 * field that reaches PostgreSQL goes through it.
 */
export const storableText = (s: z.ZodString = z.string()): z.ZodString =>
  s.refine(isStorableText, 'no U+0000 and no unpaired surrogate (text the database can store)');

export const activityParam = id;
export const reservationParam = z.string().regex(/^[A-Za-z0-9_-]{1,64}$/);
export const requestIdQuery = z.string().regex(/^[A-Za-z0-9._:-]{1,64}$/);

export function parse<T extends z.ZodType>(schema: T, value: unknown): z.infer<T> {
  const r = schema.safeParse(value);
  if (!r.success) {
    throw new FlashSaleError('VALIDATION_ERROR', 'the request is not valid', {
      errors: r.error.issues.map((i) => ({ path: i.path.join('.'), message: i.message })),
    });
  }
  return r.data;
}

/** The activity of a request's path; an api bound to one activity refuses the others. */
export function servedActivity(req: Request, served: string | undefined): string {
  const given = req.params.activityId;
  const activityId = typeof given === 'string' && ID.test(given) ? given : parse(activityParam, given);
  if (served && activityId !== served) {
    throw new FlashSaleError('UNKNOWN_ACTIVITY', `this endpoint serves activity ${served}`);
  }
  return activityId;
}
