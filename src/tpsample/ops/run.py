"""How the ops sample: the Sampler's own code paths, over a `RowTable` instead of a RequestStore.

- `sample_full(x, table, bitmask, width)`: full rows (TP = 1): `sampling.run.sample_batch` with
  the identity reducer, exactly what every strategy runs at TP = 1: the fused kernels on a
  kernel device (CUDA, or CPU under the interpreter when asked), the torch pipeline elsewhere,
  the torch pipeline for processed-logprob rows either way.
- `sample_tp(x, table, strategy, comm, ...)`: a plan built from the rows (row r is request r,
  slot r, so batch_sharded's owner is r % TP) and the Sampler's strategy objects
  (`parallel.registry.STRATEGIES`): replicated all-gathers the shards, batch_sharded moves rows
  to their owners in one all-to-all, vocab_parallel runs the round pipeline on the shards.
  Every rank gets the same result, equal bitwise to TP = 1. Rows that verify drafts come from
  the plan (`drafts`), as in `Sampler.plan`.
- `choose(strategy, tp, rows, device)`: what "auto" means here (see `choose`).
- `needs_host_values(x, table)`: whether the torch pipeline will decide from the rows' host
  parameters (the caller then reads device tensors once; the kernels need only their hints).
Never imports the Sampler.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..parallel.collectives import Collectives
from ..parallel.common import StepContext, StepResult, pad_logprobs
from ..parallel.plan import build_plan
from ..parallel.registry import STRATEGIES
from ..parallel.shard import vocab_shard
from ..kernels.gate import kernels_wanted
from ..sampling.reducer import LocalRows
from ..sampling.rows_in import SampleArgs
from ..sampling.run import sample_batch
from .table import RowTable, identity_view


def choose(strategy: str, tp: int, rows: int, device: torch.device) -> str:
    """"auto": TP = 1 -> replicated (every strategy is the same computation there); at TP > 1,
    batch_sharded on CUDA when every rank owns a row (full rows run the fused kernels there,
    while shards run torch ops), else vocab_parallel (no rank ever holds a full row: the least
    memory and the fewest bytes moved). The Sampler's measured `auto` is not used: it needs
    calibration collectives and state."""
    if strategy != "auto":
        return strategy
    if tp == 1:
        return "replicated"
    return "batch_sharded" if device.type == "cuda" and rows >= tp else "vocab_parallel"


def kernel_path(x: torch.Tensor) -> bool:
    """Full rows of x go through the fused kernels (the gate `sampling.run` applies)."""
    return x.stride(1) == 1 and kernels_wanted(x.device)


def needs_host_values(x: torch.Tensor, processed_logprobs: bool, tp: int) -> bool:
    """The torch pipeline runs on some row and decides from host parameters."""
    return tp > 1 or processed_logprobs or not kernel_path(x)


def sample_full(x: torch.Tensor, table: RowTable, bitmask: Optional[torch.Tensor], width: int):
    """(tokens [R] int64, fallback [R] bool, num_nans [R] int64, lp_ids [R, width] int64,
    lp_vals [R, width] fp32, lp_ranks [R] int64), each a tensor of its own (no views)."""
    dev, n = x.device, table.size
    view = identity_view(n)
    b = table.row_batch(view, dev)
    res = sample_batch(SampleArgs(x, 0, b, LocalRows(), bitmask), lambda rows: table.row_batch(view.subset(rows), dev))
    if width:
        ids, vals, ranks = pad_logprobs(res, n, width, dev)
    else:
        ids = torch.empty((n, 0), dtype=torch.int64, device=dev)
        vals = torch.empty((n, 0), dtype=torch.float32, device=dev)
        ranks = torch.zeros(n, dtype=torch.int64, device=dev)
    return (res.emitted.to(torch.int64).clone(), res.fallback.to(torch.bool).clone(),
            res.num_nans.to(torch.int64).clone(), ids.clone(), vals.clone(), ranks.clone())


def sample_tp(x: torch.Tensor, table: RowTable, strategy: str, comm: Collectives, vocab_size: int, *,
              bitmask: Optional[torch.Tensor] = None, width: int = 0, drafts: Optional[np.ndarray] = None,
              draft_probs: Optional[torch.Tensor] = None) -> StepResult:
    """One step of `strategy` over this rank's shard x [rows, V_r] in batch order (rows: each
    request's draft rows, then its bonus row, when drafts [reqs, D] are given)."""
    reqs = table.size
    drafts = np.zeros((reqs, 0), np.int64) if drafts is None else drafts
    plan = build_plan(strategy, comm.size, range(reqs), np.arange(reqs, dtype=np.int64), np.zeros(reqs, np.int64),
                      drafts, width, bitmask, 0, vocab_size)
    start, end = vocab_shard(vocab_size, comm.size, comm.group.rank)
    if strategy == "batch_sharded" and comm.size > 1:      # the strategy takes rows owner by owner
        order = plan.logits_order.to(x.device)
        x = x.index_select(0, order)
        draft_probs = None if draft_probs is None else draft_probs.index_select(0, order)
    ctx = StepContext(table, vocab_size, start, end, comm, draft_probs=draft_probs)
    return STRATEGIES[strategy].sample(x, plan, ctx)
