"""The sampling recipe over a block of rows, in the order of docs/semantics.md, written once.

    front     1-5   NaN count, grammar mask, allowed ids / logit bias / min_tokens, penalties,
                    bad words (the row's columns only: no communication)
    draw      6-10  temperature, the min-p / top-k / top-p threshold, the Gumbel draw
                    (greedy rows: the argmax of the processed row)
    guard     12    the emitted token of every row: the draw, or the raw argmax where nothing
                    finite was kept; rows that verify a draft token accept or replace it
    logprobs  11    the sampled token's logprob and rank and the top-n, when a row asks
    support         the kept support (bounds, count, ids), when a row asks (RL sampling masks)

`sample_rows(rows)` chooses the backend that runs these steps and returns a `RowResult`:
- `kernel_backend.KERNELS`: the fused Triton kernels, for full rows on a kernel device. Rows
  the kernels do not finish (`_slow_rows`: drafts, processed logprobs and logits) are sampled
  by the torch backend on a copy of just those rows, and their results replace the kernels' for
  them; a batch without such rows runs the kernels alone;
- `rounds.ROUNDS`: vocab-parallel rounds on a shard (packed collectives), for split rows
  without XTC, other logprob values, a kept support or a top-p-only row verifying against a
  draft distribution (`ShardRounds.takes`);
- `torch_backend.TORCH`: torch ops on full rows or a shard (through the reducer): every other
  case, and the reference the other two are tested against.
Every backend gives the same tokens for the same rows. Backends only run their steps and
return: none calls back into this module.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np
import torch

from ..numerics import NEG_INF
from ..state.rows import RowBatch
from .kernel_backend import KERNELS, kernels_apply
from .logprobs import empty_logprobs, put_logprobs
from .reducer import LocalRows
from .rounds.rounds import ROUNDS
from .torch_backend import TORCH


@dataclass(frozen=True)
class SampleArgs:
    """The rows one backend samples. x: [rows, cols] logits (any float dtype) holding global
    columns [col_start, col_start + cols); batch: the rows' parameters and state; red: the
    reducer (`LocalRows` for full rows, a shard reducer under vocab parallelism); bitmask:
    optional int32 [rows, words] grammar mask; draft_probs: optional [rows, cols] draft
    distributions; meter: optional memory meter; inplace: x may serve as the working buffer (an
    fp32 x then ends up holding the processed rows)."""
    x: torch.Tensor
    col_start: int
    batch: RowBatch
    red: Any
    bitmask: Optional[torch.Tensor] = None
    draft_probs: Optional[torch.Tensor] = None
    meter: Any = None
    inplace: bool = False

    def rows(self, idx: torch.Tensor, batch: RowBatch) -> "SampleArgs":
        """The rows `idx` (device indices) with their own batch, as copies (so in place)."""
        pick = lambda t: None if t is None else t.to(self.x.device).index_select(0, idx)  # noqa: E731
        return replace(self, x=self.x.index_select(0, idx), batch=batch, bitmask=pick(self.bitmask),
                       draft_probs=pick(self.draft_probs), inplace=True)


@dataclass
class RowResult:
    """What sampling a block of rows produces, per row (before per-request assembly)."""
    emitted: torch.Tensor              # [rows] int64
    accepted: torch.Tensor             # [rows] bool or 0/1 int64 (0 for rows without a draft)
    fallback: torch.Tensor             # [rows] bool: no finite kept token, guard used
    num_nans: torch.Tensor             # [rows] int64
    lp_ids: Optional[torch.Tensor] = None    # [rows, 1 + n] int64
    lp_vals: Optional[torch.Tensor] = None   # [rows, 1 + n] fp32
    lp_ranks: Optional[torch.Tensor] = None  # [rows] int64
    block: Optional[torch.Tensor] = None     # [rows, 5] packed by the kernels (one row per request, no
                                             # drafts): emitted, num_nans and fallback are views into it
    exact_rows: int = 0                      # rows that took vocab-parallel's exact top-p path
    support: Optional[tuple] = None          # (ids [rows, cap], count, threshold, upper): kept supports


def sample_rows(a: SampleArgs, *, backend=None) -> RowResult:
    """Steps 1-12 for the rows of `a`, by the backend that fits them (module docstring).

    backend: run this backend's steps instead of choosing (the kernels' split below, and tests
    that hold the backends to each other)."""
    if backend is None:
        backend = _backend(a)
        if backend is None:
            return _kernels_then_torch(a)
    st = backend.front(a)                                            # 1-5
    backend.draw(st)                                                 # 6-10
    emitted, accepted, fallback, num_nans, block = backend.guard(st)   # 12 (and draft verification)
    out = RowResult(emitted, accepted, fallback, num_nans, block=block)
    if a.batch.logprobs_max >= 0:
        out.lp_ids, out.lp_vals, out.lp_ranks = backend.logprobs(st, out.emitted)   # 11
    if a.batch.kept_cap_max >= 0:
        out.support = backend.support(st, out.emitted)                # the kept supports asked for
    out.exact_rows = st.exact_rows
    return out


def _backend(a: SampleArgs):
    """KERNELS, ROUNDS or TORCH for these rows; None: the kernels with some rows left to torch."""
    full = isinstance(a.red, LocalRows)
    if full and kernels_apply(a.x):
        return None if len(_slow_rows(a.batch.host)) or a.draft_probs is not None else KERNELS
    if not full and ROUNDS.takes(a):
        return ROUNDS
    return TORCH


def _slow_rows(host) -> np.ndarray:
    """Rows the kernels do not finish: draft verification, processed logprobs and logits (found
    once per set of rows). Raw logits, logprobs after the temperature, XTC and kept supports
    they give."""
    got = host.memo.get("slow")
    if got is None:
        got = host.memo["slow"] = np.flatnonzero(host.has_draft | ((host.num_logprobs >= 0) & host.processed))
    return got


def _kernels_then_torch(a: SampleArgs) -> RowResult:
    """Every row through the kernels, the slow rows also through the torch backend (first: the
    kernels may reuse x in place), whose results replace the kernels' for those rows."""
    part = idx = None
    slow = _slow_rows(a.batch.host)
    if len(slow):
        idx = torch.from_numpy(slow).to(a.x.device, non_blocking=True)
        part = sample_rows(a.rows(idx, a.batch.subset(slow)), backend=TORCH)
    res = sample_rows(a, backend=KERNELS)     # every row, drawn plainly
    if part is not None:
        res.emitted[idx], res.accepted[idx] = part.emitted, part.accepted.to(res.accepted.dtype)
        res.fallback[idx], res.num_nans[idx] = part.fallback.to(res.fallback.dtype), part.num_nans
        if part.lp_ids is not None:
            if res.lp_ids is None:       # else the kernels' raw logprobs of the other rows stay
                res.lp_ids, res.lp_vals, res.lp_ranks = empty_logprobs(res.emitted.shape[0],
                                                                       1 + a.batch.logprobs_max, a.x.device)
            put_logprobs((res.lp_ids, res.lp_vals, res.lp_ranks), idx, (part.lp_ids, part.lp_vals, part.lp_ranks))
        if part.support is not None:     # (the kernels' own supports of the other rows stay)
            ids, *rest = part.support
            for dst, src in zip(res.support[1:], rest):
                dst[idx] = src
            res.support[0][idx] = -1
            res.support[0][idx, : ids.shape[1]] = ids
    return res


def empty_support(rows: int, width: int, device) -> tuple:
    """(ids [rows, width] -1, count [rows] -1, threshold -inf, upper +inf): rows without a kept support."""
    return (torch.full((rows, width), -1, dtype=torch.int64, device=device),
            torch.full((rows,), -1, dtype=torch.int64, device=device),
            torch.full((rows,), NEG_INF, device=device), torch.full((rows,), float("inf"), device=device))


def padded_support(res: RowResult, rows: int, width: int, device) -> tuple:
    """The result's kept supports with `width` id columns (rows without one: empty)."""
    out = empty_support(rows, width, device)
    if res.support is not None:
        ids, *rest = res.support
        out[0][:, : ids.shape[1]] = ids
        for dst, src in zip(out[1:], rest):
            dst.copy_(src)
    return out
