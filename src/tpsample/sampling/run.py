"""Which path samples a block of rows: the fused kernels, the torch pipeline, or both.

`sample_batch` gives the same `RowResult` whichever path runs (the kernels implement the same
thresholds and noise). Full rows on a kernel device go through the kernels (raw logprobs
included); rows that verify drafts or want processed logprobs then go through the torch pipeline
on a copy of just those rows. Shards
(vocab-parallel) and devices without kernels take the torch pipeline for every row.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..numerics import NEG_INF
from ..state.rowbatch import RowBatch
from .fastpath import _wanted, try_fast_path
from .pipeline import sample_rows
from .reducer import LocalRows
from .result import RowResult
from .rows_in import SampleArgs


def sample_batch(a: SampleArgs, batch_of: Callable[[np.ndarray], RowBatch]) -> RowResult:
    """batch_of(rows): the RowBatch of a subset of the rows (host indices), for the split."""
    if _wanted(a.x) and isinstance(a.red, LocalRows):
        slow = _slow_rows(a.batch.host)
        if len(slow) == 0 and a.draft_probs is None:
            res = try_fast_path(a)
        else:
            res = _split(a, batch_of, slow)
        if res is not None:
            return res
    return sample_rows(a)


def _slow_rows(host) -> np.ndarray:
    """Rows the kernels do not finish: draft verification, processed logprobs (once per rows)."""
    got = host.memo.get("slow")
    if got is None:
        got = host.memo["slow"] = np.flatnonzero(host.has_draft | ((host.num_logprobs >= 0) & host.processed))
    return got


def _split(a: SampleArgs, batch_of, slow):
    """All rows through the kernels, then the slow rows through the torch pipeline; None when
    the kernels do not apply."""
    res_slow = idx = None
    if len(slow):   # before the kernels, which may reuse x in place
        idx = torch.from_numpy(slow).to(a.x.device, non_blocking=True)
        res_slow = sample_rows(a.rows(idx, batch_of(slow)))
    res = try_fast_path(a, force=True)
    if res is None:
        return None
    if res_slow is not None:
        _merge(res, res_slow, idx, a.batch.logprobs_max)
    return res


def _merge(res: RowResult, part: RowResult, idx: torch.Tensor, width_n: int) -> None:
    res.emitted[idx], res.accepted[idx] = part.emitted, part.accepted.to(res.accepted.dtype)
    res.fallback[idx], res.num_nans[idx] = part.fallback.to(res.fallback.dtype), part.num_nans
    if part.lp_ids is not None:
        n_rows, w = res.emitted.shape[0], 1 + width_n
        dev = res.emitted.device
        if res.lp_ids is None:            # else the kernels' raw logprobs of the other rows stay
            res.lp_ids = torch.full((n_rows, w), -1, dtype=torch.int64, device=dev)
            res.lp_vals = torch.full((n_rows, w), NEG_INF, device=dev)
            res.lp_ranks = torch.zeros(n_rows, dtype=torch.int64, device=dev)
        pw = part.lp_ids.shape[1]
        res.lp_ids[idx, :pw], res.lp_vals[idx, :pw], res.lp_ranks[idx] = part.lp_ids, part.lp_vals, part.lp_ranks
