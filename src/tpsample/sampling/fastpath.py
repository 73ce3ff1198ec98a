"""The fused Triton path for full rows on CUDA (the kernels in `tpsample.kernels`).

`try_fast_path` returns a `RowResult` when the rows are whole on this rank (LocalRows), live on a
CUDA device with Triton, and need neither draft verification nor logprobs; otherwise None and the
caller runs the torch pipeline. Steps 2-5 (sparse processors) run in torch on an fp32 copy
when a row uses them; steps 6-10 and the guard run in the kernels, which read the logits once
per pass, upcast per block, and allocate only O(rows x bins) workspace. Which code the kernels
compile and run is decided from the batch's host-side parameters: no device read, no sync.
The kernels implement the same thresholds and noise, so tokens equal the torch pipeline's.
"""
from __future__ import annotations

import os

import torch

from ..noise import SALT_DRAW
from ..state.rowbatch import HostRows, RowBatch
from . import processors as P
from .draw import local_argmax
from .filters import row_chunks
from .reducer import LocalRows
from .result import RowResult


def _wanted(x: torch.Tensor) -> bool:
    """CUDA tensors; CPU ones only when asked (TPSAMPLE_KERNELS_ON_CPU=1 with TRITON_INTERPRET=1,
    which is how CI tests this path)."""
    return x.is_cuda or os.environ.get("TPSAMPLE_KERNELS_ON_CPU") == "1"


def hints_from_host(host: HostRows, vocab_size: int):
    """The kernels' RowHints from host-side parameters (never a device read); computed once per
    set of rows (the host rows of a plan are reused step after step)."""
    got = host.memo.get(("hints", vocab_size))
    if got is not None:
        return got
    from ..kernels.dispatch import RowHints
    sampled = host.temperature != 0
    kp = sampled & (((host.top_k > 0) & (host.top_k < vocab_size)) | (host.top_p < 1))
    filt = kp | (sampled & (host.min_p > 0))
    got = host.memo[("hints", vocab_size)] = RowHints(
        any_filter=bool(filt.any()), any_top_k_or_p=bool(kp.any()), any_greedy=bool((~sampled).any()),
        any_plain=bool((sampled & ~filt).any()))
    return got


def try_fast_path(x: torch.Tensor, col_start: int, b: RowBatch, red, bitmask, draft_probs,
                  inplace: bool, meter=None, force: bool = False):
    """force: sample every row as a plain draw, even rows with drafts or processed logprobs (the
    caller replaces those rows' results). Raw logprobs come from the kernels."""
    if not _wanted(x) or not isinstance(red, LocalRows) or (draft_probs is not None and not force):
        return None
    if not force and (b.lp_proc_rows is not None or b.drafts_any):
        return None
    if x.stride(1) != 1:
        return None
    try:
        from ..kernels.dispatch import kernels_available, sample_rows
    except ImportError:
        return None
    if not kernels_available(x.device):
        return None
    l, guard, raw, nans = x, None, None, None      # without processors the kernels count NaNs
    if b.uses_processors or bitmask is not None:
        l = x if (inplace and x.dtype == torch.float32) else x.to(torch.float32, copy=True)
        nans = P.mask_nans(l, row_chunks(b.num_rows, l.shape[1], l.device))
        if bitmask is not None:
            P.apply_bitmask(l, bitmask, col_start)
        guard = local_argmax(l, col_start)         # the best grammar-allowed token, for the guard
        if b.lp_raw_rows is not None:
            if b.uses_processors:                  # raw logprobs see the row before steps 3-5
                raw = l.clone()
            else:
                raw = l
        P.apply_token_processors(l, b, col_start)
    from ..kernels.step_ops import finalize_rows, prepare_rows
    src = b.source
    cols = {"T": src.columns["temperature"], "TOP_P": src.columns["top_p"], "MIN_P": src.columns["min_p"],
            "SEED": src.columns["seed"], "TOP_K": src.columns["top_k"], "PROMPT_LEN": src.columns["prompt_len"]}
    t, k, p, log_min_p, key0, key1 = prepare_rows(src.f32_table, src.i64_table, src.num_out, src.slots, src.offsets,
                                                  SALT_DRAW, cols)
    tokens, valid, nan_parts = sample_rows(l, t, k, p, log_min_p, key0, key1, col_offset=col_start,
                                           vocab_size_global=b.vocab_size,
                                           hints=hints_from_host(b.host, b.vocab_size), nans_out="partials")
    # a winner at +inf is no finite kept token either: the block flags it (its token, the lowest
    # +inf id, is the guard's choice already when the kernel ran on the caller's logits)
    block = finalize_rows(tokens, valid, l, col_start, nan_parts if l is x else nans.view(-1, 1), guard)
    accepted = torch.zeros(b.num_rows, dtype=torch.bool, device=x.device)
    res = RowResult(block[:, 0], accepted, block[:, 4], block[:, 3], block=block)
    tokens = res.emitted
    if b.lp_raw_rows is not None:
        res.lp_ids, res.lp_vals, res.lp_ranks = _raw_logprobs(raw if raw is not None else x, tokens, b, col_start)
    return res


def _raw_logprobs(l_raw: torch.Tensor, tokens: torch.Tensor, b: RowBatch, col_start: int):
    """Logprobs of the raw row (after the grammar mask) for the rows that want them, from one
    streaming pass (log-sum-exp, top-n, the count above the sampled token) and one kernel that
    lays the rows out: no [rows, V] buffer."""
    from ..kernels.dispatch import token_logprob_stats
    from ..kernels.step_ops import raw_logprobs
    n = b.logprobs_max
    local = (tokens - col_start).clamp_(0, l_raw.shape[1] - 1).unsqueeze_(1)
    v = l_raw.gather(1, local).squeeze_(1).float()
    v = torch.nan_to_num_(v, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))   # NaN counts as -inf
    lse, top_v, top_i, above = token_logprob_stats(l_raw, v, n, col_offset=col_start)
    src = b.source
    cols = {"NUM_LP": src.columns["num_logprobs"], "PROCESSED": src.columns["processed"]}
    return raw_logprobs(tokens, l_raw, col_start, lse, top_v, top_i, above, src.i64_table, src.slots, cols, 1 + n)
