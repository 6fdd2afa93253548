// The DLQ's handled offset (core/kafka.ts advanceHandled): it moves over handled messages in order
// and stops at the first one nobody handled, so the unhandled count never hides a dead letter.
import { advanceHandled } from '../../../core/kafka.js';

const msgs = (...refs: string[]) =>
  refs.map((r) => {
    const [partition, offset] = r.split(':');
    return { partition: Number(partition), offset: offset! };
  });

describe('advanceHandled', () => {
  it('moves over the handled messages that follow the offset, per partition', () => {
    const next = advanceHandled(new Map(), msgs('0:0', '0:1', '0:2', '1:0'), new Set(['0:0', '0:1', '1:0']));
    expect(next).toEqual(
      new Map([
        [0, 2n],
        [1, 1n],
      ]),
    );
  });

  it('stops at an unhandled message: a later handled one does not move it', () => {
    expect(advanceHandled(new Map([[0, 1n]]), msgs('0:1', '0:2', '0:3'), new Set(['0:2', '0:3']))).toEqual(
      new Map([[0, 1n]]),
    );
    expect(advanceHandled(new Map(), msgs('0:0', '0:1'), new Set(['0:1']))).toEqual(new Map());
  });

  it('continues from the committed offset, ignores messages before it and never moves back', () => {
    expect(advanceHandled(new Map([[0, 5n]]), msgs('0:3', '0:4', '0:5', '0:6'), new Set(['0:5']))).toEqual(
      new Map([[0, 6n]]),
    );
    expect(advanceHandled(new Map([[0, 5n]]), msgs('0:3'), new Set(['0:3']))).toEqual(new Map([[0, 5n]]));
  });

  it('starts at the oldest message held when retention deleted the ones before (offsets with gaps)', () => {
    expect(advanceHandled(new Map(), msgs('0:7', '0:9'), new Set(['0:7', '0:9']))).toEqual(
      new Map([[0, 10n]]),
    );
  });
});
