"""The fused Triton path for full rows on CUDA (DESIGN.md section 3, "Kernels").

`try_fast_path` returns a `RowResult` when the rows are whole on this rank (LocalRows), live on a
CUDA device with Triton, and need neither draft verification nor logprobs; otherwise None and the
caller runs the torch pipeline. Steps 2-5 (sparse processors) still run in torch on an fp32 copy
when a row uses them; steps 6-10 and the guard run in the kernels, which read the logits once
per pass, upcast per block, and allocate only O(rows x bins) workspace. The kernels implement the
same thresholds and noise, so tokens equal the torch pipeline's (tested on the GPU).
"""
from __future__ import annotations

import os

import torch

from . import processors as P
from .batch import RowBatch
from .filters import NEG_INF, row_chunks
from .reducer import LocalRows
from .rng import SALT_DRAW, row_keys


def _uses_processors(b: RowBatch, bitmask) -> bool:
    return bitmask is not None or any(x is not None for x in (b.allowed, b.bias, b.banned, b.seen, b.out_counts))


def _wanted(x: torch.Tensor) -> bool:
    """CUDA tensors; CPU ones only when asked (TPSAMPLE_KERNELS_ON_CPU=1 with TRITON_INTERPRET=1,
    which is how CI tests this path)."""
    return x.is_cuda or os.environ.get("TPSAMPLE_KERNELS_ON_CPU") == "1"


def try_fast_path(x: torch.Tensor, col_start: int, b: RowBatch, red, bitmask, draft_probs,
                  inplace: bool, meter=None, force: bool = False):
    """force: sample every row as a plain draw, even rows with drafts or logprobs (the caller
    replaces those rows' results)."""
    if not _wanted(x) or not isinstance(red, LocalRows) or (draft_probs is not None and not force):
        return None
    if not force and (b.logprobs_max >= 0 or bool((b.draft_tokens >= 0).any())):
        return None
    if x.stride(1) != 1:
        return None
    try:
        from ..kernels.dispatch import hints_from_params, kernels_available, sample_rows
    except ImportError:
        return None
    if not kernels_available(x.device):
        return None
    from .pipeline import RowResult
    nans = torch.zeros(b.num_rows, dtype=torch.int64, device=x.device)   # the kernel fills it
    l = x
    if _uses_processors(b, bitmask):
        l = x if (inplace and x.dtype == torch.float32) else x.to(torch.float32, copy=True)
        nans = P.mask_nans(l, row_chunks(b.num_rows, l.shape[1], l.device))
        if bitmask is not None:
            P.apply_bitmask(l, bitmask, col_start)
        P.apply_token_processors(l, b, col_start)
    key0, key1 = row_keys(b.seeds, b.positions, SALT_DRAW)
    log_min_p = torch.log(b.min_p)
    # hints from the host-side params: no device sync, and only the code the batch needs
    hints = hints_from_params(b.temperature, b.top_k, b.top_p, log_min_p, l.shape[1])
    tokens, valid = sample_rows(l, b.temperature, b.top_k, b.top_p, log_min_p, key0, key1,
                                col_offset=col_start, vocab_size_global=b.vocab_size, hints=hints,
                                nans_out=None if l is not x else nans)
    fallback = ~valid
    # a winner at +inf is no finite kept token either: flag it (its token, the lowest +inf id, is
    # already the raw argmax)
    fallback |= l.gather(1, (tokens - col_start).clamp(0, l.shape[1] - 1).unsqueeze(1)).squeeze(1) == float("inf")
    if l is not x and bool(fallback.any()):      # the guard wants the raw row's argmax
        rows = fallback.nonzero().squeeze(1)
        raw = x.index_select(0, rows).float()
        raw.masked_fill_(torch.isnan(raw), NEG_INF)
        arg = raw.argmax(dim=1)                   # first occurrence: ties -> lowest id
        best = raw.gather(1, arg.unsqueeze(1)).squeeze(1)
        tokens[rows] = torch.where(best > NEG_INF, arg + col_start, torch.zeros_like(arg))
    accepted = torch.zeros(b.num_rows, dtype=torch.bool, device=x.device)
    return RowResult(tokens, accepted, fallback, nans)


def sample_rows_split(x: torch.Tensor, col_start: int, specs: list, vocab_size: int, eos, red, bitmask,
                      draft_probs, meter, inplace: bool):
    """All rows through the kernels, then the rows that verify drafts or want logprobs through the
    torch pipeline (on a copy of just those rows). None when the kernels do not apply."""
    from .batch import build_row_batch
    from .pipeline import sample_rows
    if not _wanted(x) or not isinstance(red, LocalRows):
        return None
    slow = [i for i, s in enumerate(specs)
            if s.draft_token >= 0 or s.request.params.logprobs is not None]
    b = build_row_batch(specs, vocab_size, eos)
    res_slow = None
    if slow:   # before the kernels, which may reuse x in place
        idx = torch.tensor(slow, dtype=torch.int64, device=x.device)
        b_slow = build_row_batch([specs[i] for i in slow], vocab_size, eos)
        res_slow = sample_rows(x.index_select(0, idx), col_start, b_slow, red,
                               None if bitmask is None else bitmask[idx.cpu()],
                               None if draft_probs is None else draft_probs.index_select(0, idx),
                               meter, inplace=True)
    res = try_fast_path(x, col_start, b, red, bitmask, draft_probs, inplace, meter, force=True)
    if res is None:
        return None
    if res_slow is not None:
        _merge(res, res_slow, idx, b.logprobs_max)
    return res


def _merge(res, part, idx, width_n: int) -> None:
    res.emitted[idx], res.accepted[idx] = part.emitted, part.accepted
    res.fallback[idx], res.num_nans[idx] = part.fallback, part.num_nans
    if part.lp_ids is not None:
        n_rows, w = res.emitted.shape[0], 1 + width_n
        dev = res.emitted.device
        res.lp_ids = torch.full((n_rows, w), -1, dtype=torch.int64, device=dev)
        res.lp_vals = torch.full((n_rows, w), NEG_INF, device=dev)
        res.lp_ranks = torch.zeros(n_rows, dtype=torch.int64, device=dev)
        pw = part.lp_ids.shape[1]
        res.lp_ids[idx, :pw], res.lp_vals[idx, :pw], res.lp_ranks[idx] = part.lp_ids, part.lp_vals, part.lp_ranks
