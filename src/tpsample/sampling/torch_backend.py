"""The torch backend of the sampling recipe (`recipe.py`): docs/semantics.md steps 1-12 in
torch ops, on a block of rows: the reference the kernels and the rounds are tested against.

`TORCH`'s steps take logits rows `x` ([rows, cols], any float dtype) holding global columns
[col_start, col_start + cols) and a reducer (`LocalRows` for full rows, a shard reducer for
vocab-parallel; see `recipe.SampleArgs`). The guard gives, per row, the token the row emits if
it is reached: the sampled token for ordinary and bonus rows; for a row that
verifies a draft token, that token when accepted, else the sampled token (a draft
distribution's rows: the residual draw; see rejection.py). The same steps serve every strategy,
so equal logits and seeds give equal tokens everywhere.

Invariants: never returns an id outside [0, V); never materialises a logprob tensor; processors
no row uses are skipped; `x` is never modified unless `inplace` (then an fp32 `x` is the
working buffer and ends up holding the processed rows).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..numerics import NEG_INF, note_memory, row_chunks
from ..state.columns import LP_LOGITS, LP_TEMPERATURE
from ..state.rows import RowBatch
from . import processors as P
from .draw import emitted_tokens, local_argmax, local_gumbel_draw
from .keys import shard_passes
from .logprobs import blank_unasked, empty_logprobs, put_logprobs, row_logprobs
from .reducer import combine_pairs
from .rejection import verify_drafts
from .support import kept_support
from .thresholds import min_p_threshold, top_k_threshold, top_p_threshold
from .top_n_sigma import top_n_sigma_threshold
from .xtc import xtc_upper_bound


class _Step:
    """One call's working state between the steps (see recipe.py)."""

    exact_rows = 0

    def __init__(self, a, f: Front):
        self.a, self.f = a, f
        self.drawn = None                   # local (max, id) of l + noise over the kept entries
        self.bounds = None                  # (threshold, upper) of the kept values, once drawn


class TorchSteps:
    """The recipe's steps in torch ops, on full rows (LocalRows) or a vocab shard (a reducer)."""

    def front(self, a) -> _Step:
        return _Step(a, front(a))                                         # 1-5

    def draw(self, st: _Step) -> None:
        a, f = st.a, st.f
        b, l = a.batch, f.l
        if not b.sample_any:
            st.drawn = f.greedy
            return
        P.apply_temperature(l, b.temperature)                             # 6
        thr = _thresholds(l, b, a.red)                                    # 7-9
        upper = xtc_upper_bound(l, thr, b, a.red) if b.xtc_any else None  # 9: XTC
        st.bounds = (thr, upper if upper is not None else torch.full_like(thr, float("inf")))
        for s, t in row_chunks(b.num_rows, l.shape[1], l.device):
            drop = l[s:t] < thr[s:t].unsqueeze(1)
            if upper is not None:
                drop |= l[s:t] > upper[s:t].unsqueeze(1)
            l[s:t].masked_fill_(drop, NEG_INF)
        none = torch.full_like(thr, NEG_INF)
        st.drawn = local_gumbel_draw(l, none, b.seeds, b.positions, a.col_start)          # 10

    def guard(self, st: _Step) -> tuple:
        a, f = st.a, st.f
        b, red, dev = a.batch, a.red, f.l.device
        # one gather settles the raw argmax (guard), the greedy and the drawn winners, and NaN counts
        (guard, greedy, drawn), num_nans = combine_pairs(red, [f.guard, f.greedy, st.drawn], f.nans)
        num_nans = num_nans.to(torch.int64)
        main, fallback = emitted_tokens(b.greedy.to(dev), guard, greedy, drawn)     # 12
        emitted, accepted = main, torch.zeros_like(fallback)
        if b.drafts_any:
            accepted, residual = verify_drafts(f.l, b, main, a.col_start, red, a.draft_probs)
            accepted &= ~fallback
            has_draft = b.draft_tokens.to(dev) >= 0
            emitted = torch.where(has_draft, torch.where(accepted, b.draft_tokens.to(dev), residual), main)
            emitted = torch.where(fallback, main, emitted)
        note_memory(a.meter, f)
        return emitted, accepted, fallback, num_nans, None

    def logprobs(self, st: _Step, emitted: torch.Tensor) -> tuple:
        a = st.a
        return _logprobs(emitted, st.f.l, st.f.raw, a.batch, a.col_start, a.red)     # 11

    def support(self, st: _Step, emitted: torch.Tensor) -> tuple:
        a = st.a
        return kept_support(st.f.l, st.bounds, emitted, a.batch, a.col_start, a.red)


TORCH = TorchSteps()


class Front(NamedTuple):
    """Steps 1-5 done: the working rows and the local partial results every pipeline needs."""
    l: torch.Tensor                         # [rows, cols] fp32 processed rows (steps 2-5)
    copy: bool                              # l is a copy of x
    nans: torch.Tensor                      # [rows] int64 local NaN counts
    guard: tuple                            # local (max, id) after the grammar mask (step 12)
    raw: Optional[tuple]                    # (rows, copy) for raw-logprob rows, else None
    greedy: tuple                           # local (max, id) of the processed row


def front(a) -> Front:
    """Steps 1-5 on the columns held (no communication)."""
    x, col_start, b, bitmask, inplace = a.x, a.col_start, a.batch, a.bitmask, a.inplace
    passes = shard_passes(x)
    copy = not (inplace and x.dtype == torch.float32)
    if passes is not None:      # one read of x: the working row, its NaN counts and argmax
        l = torch.empty(x.shape, dtype=torch.float32, device=x.device) if copy else x
        local_nans, *best = passes.front(x, col_start, l)                # 1
        guard_local = tuple(best)
    else:
        l = x.to(torch.float32, copy=True) if copy else x                 # [rows, cols] working row
        local_nans = P.mask_nans(l, row_chunks(b.num_rows, l.shape[1], x.device))  # 1
        guard_local = None
    if bitmask is not None:                                               # 2
        P.apply_bitmask(l, bitmask, col_start)
        guard_local = None
    if guard_local is None:       # 12 falls back to the best grammar-allowed token
        guard_local = local_argmax(l, col_start)
    raw = _raw_logprob_rows(l, b)
    if b.uses_processors:
        P.apply_processors(l, b, col_start)                         # 3-5
    greedy_local = local_argmax(l, col_start) if b.uses_processors else guard_local    # 5: greedy rows end here
    return Front(l, copy, local_nans, guard_local, raw, greedy_local)


def _thresholds(l: torch.Tensor, b: RowBatch, red) -> torch.Tensor:
    """min-p, top-n-sigma, top-k, top-p as one threshold per row (the first three are computed on
    the same row and commute: each keeps a top set of it; top-p then walks the kept tokens)."""
    thr = torch.full((b.num_rows,), NEG_INF, device=l.device)
    if b.sigma_any:
        thr = top_n_sigma_threshold(l, b.top_n_sigma, red, b.vocab_size)
    cand = None
    if b.top_k_max > 0:
        thr_k, cand = top_k_threshold(l, b.top_k, b.top_k_max, red)
        thr = torch.maximum(thr, thr_k)
    if b.min_p_any:
        row_max = None if cand is None else cand.values[:, 0]     # the union holds the row max
        thr = torch.maximum(thr, min_p_threshold(l, b.min_p, red, row_max))
    if b.top_p_any:
        thr = top_p_threshold(l, thr, b.top_p, red, b.vocab_size, cand)
    return thr


def _raw_logprob_rows(l: torch.Tensor, b: RowBatch):
    """(row indices, copy of those rows) for rows that want raw logprobs, else None."""
    if b.lp_raw_rows is None:
        return None
    return b.lp_raw_rows, l.index_select(0, b.lp_raw_rows)


def _logprobs(emitted: torch.Tensor, l: torch.Tensor, raw, b: RowBatch, col_start: int, red) -> tuple:
    n = b.logprobs_max
    out = empty_logprobs(b.num_rows, 1 + n, l.device)
    parts = []
    if raw is not None:
        parts.append((raw[0], raw[1]))
    if b.lp_proc_rows is not None:
        parts.append((b.lp_proc_rows, l.index_select(0, b.lp_proc_rows)))
    kind = b.column("lp_kind").to(l.device) if b.host.beyond_logprobs().any() else None
    for rows, block in parts:
        as_logits = None
        if kind is not None:        # temperature_logprobs: the raw row / T (greedy: T = 1); *_logits: values
            k = kind.index_select(0, rows)
            t = b.temperature.to(l.device).index_select(0, rows)
            scale = torch.where((k == LP_TEMPERATURE) & (t > 0), t, torch.ones_like(t))
            block = block / scale.unsqueeze(1)
            as_logits = k == LP_LOGITS
        put_logprobs(out, rows, row_logprobs(block, emitted[rows], n, col_start, red, as_logits))
    return blank_unasked(out, b.num_logprobs)
