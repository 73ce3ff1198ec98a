"""One sampling step over a block of rows, in the order of docs/semantics.md, written once.

    front     1-5   NaN count, grammar mask, allowed ids / logit bias / min_tokens, penalties,
                    bad words (the row's columns only: no communication)
    draw      6-10  temperature, the min-p / top-k / top-p threshold, the Gumbel draw
                    (greedy rows: the argmax of the processed row)
    guard     12    the emitted token of every row: the draw, or the raw argmax where nothing
                    finite was kept; rows that verify a draft token accept or replace it
    logprobs  11    the sampled token's logprob and rank and the top-n, when a row asks

`sample_block(a, steps)` runs them; `steps` is the backend, which holds its own per-call state
between the steps (`steps.front` returns it):
- `pipeline.TORCH`: torch ops on full rows or on a vocab shard through the reducer; the
  reference the kernels are tested against.
- `fastpath.KERNELS`: the fused Triton kernels for full rows (steps 6-10 and 12 are one launch
  sequence, so `draw` does them and `guard` packs the result).
- `parallel.vocab.split_rows.ROUNDS`: vocab-parallel rounds on a shard, whose collectives are
  packed (one gather settles the guard, the winners and the logprob statistics).
Every backend gives the same tokens for the same rows; which one runs is `run.sample_batch`'s
choice.
"""
from __future__ import annotations

from .result import RowResult
from .rows_in import SampleArgs


def sample_block(a: SampleArgs, steps) -> RowResult:
    st = steps.front(a)                        # 1-5
    steps.draw(st)                             # 6-10
    out = steps.guard(st)                      # 12 (and draft verification)
    if a.batch.logprobs_max >= 0:
        steps.logprobs(st, out)                # 11
    return out
