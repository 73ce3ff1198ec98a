"""tpsample.ops: stateless sampling functions over per-row tensors, for engines that keep their
own per-request state (per-slot tensors gathered each step, or a batch's parameter tensors).

    from tpsample import ops
    out = ops.sample(logits, temperature=t, top_k=k, top_p=p, min_p=m, seeds=seeds, positions=pos)
    out.token_ids                       # [rows] int64

- `sample`: one token per row, bitwise the `Sampler`'s for the same logits, seeds and positions
  (the noise is keyed by (seed, position, token id): a row's token never depends on its index,
  the other rows, the strategy or TP). Under TP, `logits` is this rank's vocabulary shard and
  `group` the TP group; strategy "replicated", "batch_sharded", "vocab_parallel" or "auto".
- `verify_drafts`: speculative decoding's verification, as the Sampler does it.
- `apply_penalties`, `apply_dry`, `apply_bias`, `apply_bitmask`: the Sampler's processors, column-local.
- `logprobs`: given tokens' logprobs and ranks and the top-n, no [rows, V] logprob tensor.
- `torch.ops.tpsample.{sample, apply_penalties, apply_dry, apply_bias, apply_bitmask, logprobs}`: the
  custom ops behind them (fake implementations registered), so a function calling these at
  TP = 1 compiles with `torch.compile(fullgraph=True)` and records into a CUDA graph.

Submodules: `args` (checks, broadcasting), `table` (per-row tables standing in for the
Sampler's request store, and which path samples), `impl` (the ops' bodies and their
registration), `direct` (the kernel route), `api` (sample, verify_drafts), `processors`. The
facade layer: imports no engine, model or transformers code.
"""
from __future__ import annotations

from ..sampling.output import LogprobsOutput
from .api import Sampled, Verified, sample, verify_drafts
from .processors import apply_bias, apply_bitmask, apply_dry, apply_penalties, logprobs

__all__ = ["sample", "verify_drafts", "apply_penalties", "apply_dry", "apply_bias", "apply_bitmask", "logprobs", "Sampled",
           "Verified", "LogprobsOutput"]
