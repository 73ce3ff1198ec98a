"""The kernel backend of the sampling recipe (`recipe.py`): the fused Triton kernels
(`tpsample.kernels`) over full rows on a kernel device (`kernels_apply`).

Steps 2-5 (sparse processors) run in torch on an fp32 copy when a row uses them; steps 6-10 and
the guard run in the kernels, which read the logits once per pass, upcast per block, and
allocate only O(rows x bins) workspace; raw logprobs (and logits, and logprobs after the
temperature: the same pass over fp32(x) / T) come from one statistics pass; top-n-sigma
joins min-p's threshold inside them (one more pass, only for a batch that uses it); rows with XTC
or a kept support take the kept pass once their thresholds are settled (one more kernel over
those rows only: XTC's bound and redraw, each kept support's count and bounds), and a kept
support's ids come from one top-n over those rows (`support.kept_ids`). Rows that verify drafts
or want processed logprobs are drawn plainly here (the recipe replaces their results). Which
code the kernels compile and run is decided from the batch's host-side parameters: no device
read, no sync. The kernels implement the same thresholds and noise, so
tokens equal the torch backend's.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import torch

from ..kernels.launcher import kernels_wanted, row_hints
from ..noise import SALT_DRAW, SALT_XTC, uniform01
from ..state.columns import LP_LOGITS, LP_TEMPERATURE
from ..state.rows import HostRows, RowBatch
from . import processors as P
from .support import asked_supports, kept_ids


@functools.cache
def _kernels() -> SimpleNamespace:
    """The kernel modules (.sample, .launcher, .stats, .step_ops), imported on first use
    (triton.jit picks interpreted or compiled when a kernel module is imported) and kept, so a
    step runs no import statement."""
    from ..kernels import launcher, sample, stats, step_ops
    return SimpleNamespace(sample=sample, launcher=launcher, stats=stats, step_ops=step_ops)


def kernels_apply(x: torch.Tensor) -> bool:
    """The kernels sample rows of x: a kernel device (`kernels.launcher.kernels_wanted`) and unit
    column stride."""
    return x.stride(1) == 1 and kernels_wanted(x.device)


def hints_from_host(host: HostRows, vocab_size: int):
    """The kernels' RowHints from host-side parameters (never a device read); computed once per
    set of rows (the host rows of a plan are reused step after step)."""
    got = host.memo.get(("hints", vocab_size))
    if got is not None:
        return got
    # a top-n-sigma row filters as a min-p row does: a threshold below the max
    got = host.memo[("hints", vocab_size)] = row_hints(host.temperature, host.top_k, host.top_p,
                                                       (host.min_p > 0) | host.uses("top_n_sigma"), vocab_size)
    return got


def _kernel_columns(layout) -> tuple[dict, dict]:
    """The table rows the kernels read, as their constexpr names: `prepare_rows`'s and
    `raw_logprobs`'s (computed once per layout)."""
    got = _COLUMNS.get(id(layout))
    if got is None:
        f, i = layout.f32, layout.i64
        got = _COLUMNS[id(layout)] = (layout, {"T": f["temperature"], "TOP_P": f["top_p"], "MIN_P": f["min_p"],
                                               "SEED": i["seed"], "TOP_K": i["top_k"], "PROMPT_LEN": i["prompt_len"]},
                                      {"NUM_LP": i["num_logprobs"], "PROCESSED": i["processed"]})
    return got[1:]


_COLUMNS: dict = {}         # id(layout) -> (layout: kept, so its id stays its own, prepare's, raw logprobs')


class _Step:
    """One call's working state between the steps (see recipe.py)."""

    exact_rows = 0                  # the kernels settle every row exactly in their own passes

    def __init__(self, a):
        self.a = a
        self.l = a.x                # the rows the kernels read
        self.guard = None           # per-part best grammar-allowed (value, id), when prepared
        self.raw = None             # the raw rows for raw logprobs, when they differ from x
        self.nans = None            # NaN counts, when prepared (else the kernels count them)
        self.drawn = None           # (tokens, valid, per-split NaN counts) from the kernels
        self.kept = None            # (count, smallest, largest, upper) of the kept pass's rows


class KernelSteps:
    """The recipe's steps on the fused kernels, for full rows on a kernel device."""

    def front(self, a) -> _Step:                              # 1-5
        st = _Step(a)
        x, b = a.x, a.batch
        if b.uses_processors or a.bitmask is not None:
            l = x if (a.inplace and x.dtype == torch.float32) else x.to(torch.float32, copy=True)
            # one pass: NaN -> -inf (counted), the grammar mask, and the best grammar-allowed token
            # of each part of the row, for the guard
            st.nans, *st.guard = _kernels().step_ops.prep_rows_(l, a.col_start, a.bitmask)
            if b.lp_raw_rows is not None:
                st.raw = l.clone() if b.uses_processors else l   # raw logprobs see the row before 3-5
            if b.uses_processors:
                P.apply_processors(l, b, a.col_start)
            st.l = l
        return st

    def draw(self, st: _Step) -> None:
        """6-10 in the kernels' launch sequence (the guard's raw argmax included, when no front
        pass found it)."""
        k = _kernels()
        b = st.a.batch
        src = b.source
        n, dev = b.num_rows, st.l.device
        # the per-row kernel inputs and raw draws live only within this call: reused buffers
        scratch = k.launcher.stream_scratch(dev, ("fast_path", n), lambda: (k.step_ops.row_buffers(n, dev), (
            torch.empty(n, dtype=torch.int64, device=dev), torch.empty(n, dtype=torch.bool, device=dev))))
        t, top_k, p, log_min_p, key0, key1 = k.step_ops.prepare_rows(src.f32_table, src.i64_table, src.num_out,
                                                                     src.slots, src.offsets, SALT_DRAW,
                                                                     _kernel_columns(src.layout)[0], out=scratch[0])
        n_sigma = b.top_n_sigma.to(dev, torch.float32).contiguous() if b.sigma_any else None
        drawn = k.sample.sample_rows(st.l, t, top_k, p, log_min_p, key0, key1, col_offset=st.a.col_start,
                                     vocab_size_global=b.vocab_size, hints=hints_from_host(b.host, b.vocab_size),
                                     nans_out="partials", out=scratch[1], n_sigma=n_sigma, kept=_kept_rows(b, dev))
        st.drawn, st.kept = drawn[:3], drawn[3:] or None

    def guard(self, st: _Step) -> tuple:                                  # 12
        tokens, valid, nan_parts = st.drawn
        # a winner at +inf is no finite kept token either: the block flags it (its token, the
        # lowest +inf id, is the guard's choice already when the kernel ran on the caller's logits)
        block = _kernels().step_ops.finalize_rows(tokens, valid, st.l, st.a.col_start,
                                                  nan_parts if st.nans is None else st.nans, st.guard)
        # accepted: the block's num_rejected column, 0 (no row verifies a draft here; the recipe
        # writes draft rows' own results over it)
        return block[:, 0], block[:, 2], block[:, 4], block[:, 3], block

    def logprobs(self, st: _Step, emitted: torch.Tensor) -> tuple:        # 11: raw rows here
        a, b = st.a, st.a.batch
        if b.lp_raw_rows is None:       # processed rows only: the recipe fills them
            return None, None, None
        l_raw = st.raw if st.raw is not None else a.x
        return _raw_logprobs(l_raw, emitted, b, a.col_start)


    def support(self, st: _Step, emitted: torch.Tensor) -> tuple:
        """The kept supports from the kept pass's counts and bounds, and the ids of the sampled
        rows that ask for some (one top-n over just those rows)."""
        a, b = st.a, st.a.batch
        count, low, top, upper = st.kept
        ids = torch.full((b.num_rows, b.kept_cap_max), -1, dtype=torch.int64, device=count.device)
        host = b.host
        listed = np.flatnonzero((host.kept_cap > 0) & (host.temperature > 0))
        if len(listed):
            idx = torch.from_numpy(listed).to(count.device, non_blocking=True)
            l = st.l.index_select(0, idx).float() / b.temperature.to(count.device).index_select(0, idx).unsqueeze(1)
            ids[idx] = kept_ids(l, low[idx], upper[idx], b.kept_cap_max, a.col_start)
        return asked_supports(ids, count, low, top, upper, emitted, b)


KERNELS = KernelSteps()


def _kept_rows(b: RowBatch, dev):
    """The kept pass's `Kept` (kernels/sample/kept.py): the rows with a kept support or XTC (found
    once per set of rows), with XTC's thresholds and seeded coins (`sampling.xtc`'s) when some
    row has it; None when no row has either."""
    host = b.host
    rows = host.memo.get("kept")
    if rows is None:
        asks = host.uses("xtc_probability")
        if host.kept_cap is not None:
            asks = asks | (host.kept_cap >= 0)
        rows = host.memo["kept"] = np.flatnonzero(asks)
    if not len(rows):
        return None
    Kept = _kernels().sample.Kept
    sel = torch.from_numpy(rows).to(dev, non_blocking=True)
    if not b.xtc_any:
        return Kept(sel)
    coin = uniform01(b.seeds.to(dev), b.positions.to(dev), SALT_XTC) < b.column("xtc_probability").to(dev).double()
    return Kept(sel, b.column("xtc_threshold").to(dev, torch.float32).contiguous(), coin.contiguous())


def _raw_logprobs(l_raw: torch.Tensor, tokens: torch.Tensor, b: RowBatch, col_start: int):
    """Logprobs of the raw row (after the grammar mask) for the rows that want them, from one
    streaming pass (log-sum-exp, top-n, the count above the sampled token) and one kernel that
    lays the rows out: no [rows, V] buffer. Rows asking for raw logits take lse 0 (their values
    as they are, as `logprobs.row_logprobs` gives them); rows asking for logprobs after the
    temperature are the row fp32(x) / T in both kernels (`_lp_divisor`)."""
    k = _kernels()
    n = b.logprobs_max
    div = _lp_divisor(b, l_raw.device)
    # the count of entries above the sampled token's value (NaN as -inf), read in the pass itself
    lse, top_v, top_i, above = k.stats.token_logprob_stats(l_raw, None, n, col_offset=col_start, tokens=tokens,
                                                            temperature=div)
    if b.host.lp_kind is not None and (b.host.lp_kind == LP_LOGITS).any():    # raw logits: the values themselves
        lse = torch.where(b.column("lp_kind").to(lse.device) == LP_LOGITS, torch.zeros_like(lse), lse)
    src = b.source
    return k.stats.raw_logprobs(tokens, l_raw, col_start, lse, top_v, top_i, above, src.i64_table, src.slots,
                                _kernel_columns(src.layout)[1], 1 + n, temperature=div)


def _lp_divisor(b: RowBatch, dev):
    """The per-row divisor [R] fp32 of the logprob passes: T for rows asking for logprobs after
    the temperature, 0 (none; greedy rows too) for the others; None when no row asks, so those
    batches compile and launch what they did (decided on the host, once per set of rows)."""
    host = b.host
    asks = host.memo.get("lp_temperature")
    if asks is None:
        asks = host.memo["lp_temperature"] = host.lp_kind is not None and bool(
            ((host.lp_kind == LP_TEMPERATURE) & (host.num_logprobs >= 0)).any())
    if not asks:
        return None
    t = b.temperature.to(dev, torch.float32)
    return torch.where(b.column("lp_kind").to(dev) == LP_TEMPERATURE, t, torch.zeros_like(t)).contiguous()
