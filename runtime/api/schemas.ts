/** Request schemas: nothing the client sends beyond ids and quantity is trusted or even read. */
import type { Request } from 'express';
import { z } from 'zod';
import { FlashSaleError } from '../../core/errors.js';

const id = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, 'letters, digits, ".", "_", "-"; at most 63');

export const submitOrderBody = z
  .object({
    skuId: id,
    quantity: z.number().int().min(1).max(100),
    requestId: z.string().regex(/^[A-Za-z0-9._:-]{1,64}$/, '1-64 characters of [A-Za-z0-9._:-]'),
    orderCode: z
      .string()
      .regex(/^[A-Za-z0-9_-]{16,64}$/)
      .optional(),
  })
  .strict();

export const orderCodeBody = z.object({ skuId: id }).strict();

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
  const activityId = parse(activityParam, req.params.activityId);
  if (served && activityId !== served) {
    throw new FlashSaleError('UNKNOWN_ACTIVITY', `this endpoint serves activity ${served}`);
  }
  return activityId;
}
