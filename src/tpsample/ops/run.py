"""How the ops sample: the Sampler's own code paths, over a `RowTable` instead of a RequestStore.

- `sample_full(x, table, bitmask, width)`: full rows (TP = 1): the sampling recipe
  (`sampling.recipe.sample_rows`) with the identity reducer, exactly what every strategy runs at TP = 1: the fused kernels on a
  kernel device (CUDA, or CPU under the interpreter when asked), the torch pipeline elsewhere,
  the torch pipeline for processed-logprob rows either way.
- `sample_tp(x, table, strategy, comm, ...)`: a plan built from the rows (row r is request r,
  slot r, so batch_sharded's owner is r % TP) and the Sampler's strategy objects
  (`parallel.strategies`: the before and after around the recipe): replicated all-gathers the shards, batch_sharded moves rows
  to their owners in one all-to-all, vocab_parallel runs the round pipeline on the shards.
  Every rank gets the same result, equal bitwise to TP = 1. Rows that verify drafts come from
  the plan (`drafts`), as in `Sampler.plan`.
- `choose(strategy, table, tp, vocab_size, device, rows_per_req)`: "auto" as the Sampler means it.
- `needs_host_values(x, table)`: whether the torch pipeline will decide from the rows' host
  parameters (the caller then reads device tensors once; the kernels need only their hints).
Never imports the Sampler.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..parallel.collectives import Collectives
from ..kernels.launcher import kernels_wanted
from ..parallel import auto
from ..parallel.auto import Features, static_costs
from ..parallel.plan import build_plan
from ..parallel.shard import vocab_shard
from ..parallel.strategies import BY_NAME, Step
from ..sampling.logprobs import padded_logprobs
from ..sampling.recipe import SampleArgs, sample_rows
from ..sampling.reducer import LocalRows
from .table import RowTable, identity_view


def choose(strategy: str, table: RowTable, tp: int, vocab_size: int, device: torch.device,
           rows_per_req: np.ndarray) -> str:
    """"auto" means what it means for the Sampler: the strategy the cost model of
    `parallel.auto` estimates fastest for this batch's feature class, rows and owners
    (request r is owned by rank r % TP). The Sampler measures the model's constants on the real
    group on first use; a stateless call has no state to keep them in, so it takes the static
    constants of the device kind (those the Sampler starts from)."""
    if strategy != "auto":
        return strategy
    h = table.host
    f = Features.of(h["temperature"], h["top_k"], h["top_p"], h["min_p"], h["num_logprobs"], h["processed"],
                    bool((rows_per_req > 1).any()))
    owner_rows = max(int(rows_per_req[r::tp].sum()) for r in range(tp))
    return auto.choose(int(rows_per_req.sum()), owner_rows, vocab_size, tp, f, *static_costs(device.type, f))


def kernel_path(x: torch.Tensor) -> bool:
    """Full rows of x go through the fused kernels (the gate the recipe applies)."""
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
    res = sample_rows(SampleArgs(x, 0, b, LocalRows(), bitmask))
    if width:
        ids, vals, ranks = padded_logprobs((res.lp_ids, res.lp_vals, res.lp_ranks), n, width, dev)
    else:
        ids = torch.empty((n, 0), dtype=torch.int64, device=dev)
        vals = torch.empty((n, 0), dtype=torch.float32, device=dev)
        ranks = torch.zeros(n, dtype=torch.int64, device=dev)
    return (res.emitted.to(torch.int64).clone(), res.fallback.to(torch.bool).clone(),
            res.num_nans.to(torch.int64).clone(), ids.clone(), vals.clone(), ranks.clone())


def sample_tp(x: torch.Tensor, table: RowTable, strategy: str, comm: Collectives, vocab_size: int, *,
              bitmask: Optional[torch.Tensor] = None, width: int = 0, drafts: Optional[np.ndarray] = None,
              draft_probs: Optional[torch.Tensor] = None) -> tuple:
    """(block [reqs, max_rows + 4] int64, LogprobsOutput or None): one step of `strategy` over
    this rank's shard x [rows, V_r] in batch order (rows: each request's draft rows, then its
    bonus row, when drafts [reqs, D] are given)."""
    reqs = table.size
    drafts = np.zeros((reqs, 0), np.int64) if drafts is None else drafts
    plan = build_plan(BY_NAME[strategy], comm.size, range(reqs), np.arange(reqs, dtype=np.int64), np.zeros(reqs, np.int64),
                      drafts, width, bitmask, 0, vocab_size)
    start, end = vocab_shard(vocab_size, comm.size, comm.group.rank)
    if plan.sharding.by_owner and comm.size > 1:      # the strategy takes rows owner by owner
        order = plan.logits_order.to(x.device)
        x = x.index_select(0, order)
        draft_probs = None if draft_probs is None else draft_probs.index_select(0, order)
    step = Step(table, vocab_size, start, end, comm, draft_probs=draft_probs)
    return plan.sharding.after(sample_rows(plan.sharding.before(x, plan, step)), plan, step)
