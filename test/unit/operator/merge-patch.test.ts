import { mergePatch } from '../../../operator/kube/activities.js';

describe('mergePatch (RFC 7386)', () => {
  it('is undefined when nothing changed', () => {
    expect(mergePatch({ a: 1, b: { c: [1, 2] } }, { a: 1, b: { c: [1, 2] } })).toBeUndefined();
  });

  it('carries changed and added keys only', () => {
    expect(mergePatch({ a: 1, b: { c: 1, d: 2 } }, { a: 1, b: { c: 3, d: 2 }, e: 'x' })).toEqual({
      b: { c: 3 },
      e: 'x',
    });
  });

  it('removes a key with null, at any depth', () => {
    expect(mergePatch({ a: 1, b: { c: 1, d: 2 } }, { b: { c: 1 } })).toEqual({ a: null, b: { d: null } });
  });

  it('replaces arrays whole (conditions are written as a list)', () => {
    expect(mergePatch({ l: [{ t: 'a' }, { t: 'b' }] }, { l: [{ t: 'a' }] })).toEqual({ l: [{ t: 'a' }] });
  });

  it('ignores undefined values in the target', () => {
    expect(mergePatch({ a: 1 }, { a: 1, b: undefined })).toBeUndefined();
  });

  it('turns a nested object into a scalar and back', () => {
    expect(mergePatch({ a: { b: 1 } }, { a: 2 })).toEqual({ a: 2 });
    expect(mergePatch({ a: 2 }, { a: { b: 1 } })).toEqual({ a: { b: 1 } });
  });
});
