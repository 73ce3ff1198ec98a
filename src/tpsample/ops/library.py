"""The ops as torch.library custom ops, with fake (meta) implementations.

Registered when `tpsample.ops` is imported: `torch.ops.tpsample.sample`, `apply_penalties`,
`apply_dry`, `apply_bias`, `apply_bitmask` and `logprobs`. Their schemas hold tensors and scalars only, so
torch.compile traces a call as one opaque node (`fullgraph=True` holds) and a CUDA graph
records the kernels it launches. The fake implementations give each output's shape and dtype
from the inputs' alone (nothing data-dependent: the logprob width is an int argument).

These raw ops do not validate: call them through `tpsample.ops`, whose wrappers check every
argument on the host first, broadcast scalars to per-row tensors and pick the hints. Every op
is functional (`mutates_args=()`): outputs are new tensors, inputs are never written.
Collectives are never inside an op: under TP the wrappers run eagerly (not traced).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import impl

Six = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
Three = tuple[Tensor, Tensor, Tensor]


@torch.library.custom_op("tpsample::sample", mutates_args=())
def sample(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, seeds: Tensor,
           positions: Tensor, bitmask: Optional[Tensor], num_logprobs: int, processed: bool, hints: int) -> Six:
    """(tokens [R] int64, fallback [R] bool, num_nans [R] int64, lp_ids [R, W] int64,
    lp_vals [R, W] fp32, lp_ranks [R] int64), W = num_logprobs + 1 (0 when num_logprobs < 0)."""
    return impl.sample_impl(logits, temperature, top_k, top_p, min_p, seeds, positions, bitmask,
                            num_logprobs, processed, hints)


@sample.register_fake
def _(logits, temperature, top_k, top_p, min_p, seeds, positions, bitmask, num_logprobs, processed, hints):
    rows = logits.shape[0]
    width = num_logprobs + 1 if num_logprobs >= 0 else 0
    i64 = torch.int64
    return (logits.new_empty((rows,), dtype=i64), logits.new_empty((rows,), dtype=torch.bool),
            logits.new_empty((rows,), dtype=i64), logits.new_empty((rows, width), dtype=i64),
            logits.new_empty((rows, width), dtype=torch.float32), logits.new_empty((rows,), dtype=i64))


def _fp32_like(logits: Tensor) -> Tensor:
    return logits.new_empty(logits.shape, dtype=torch.float32)


@torch.library.custom_op("tpsample::apply_penalties", mutates_args=())
def apply_penalties(logits: Tensor, output_ids: Tensor, prompt_ids: Optional[Tensor], repetition: Tensor,
                    frequency: Tensor, presence: Tensor, col_start: int) -> Tensor:
    return impl.penalties_impl(logits, output_ids, prompt_ids, repetition, frequency, presence, col_start)


@apply_penalties.register_fake
def _(logits, output_ids, prompt_ids, repetition, frequency, presence, col_start):
    return _fp32_like(logits)


@torch.library.custom_op("tpsample::apply_dry", mutates_args=())
def apply_dry(logits: Tensor, context: Tensor, single: Tensor, multi: Tensor, multiplier: Tensor, base: Tensor,
              allowed: Tensor, last_n: Tensor, max_exp: Tensor, col_start: int) -> Tensor:
    return impl.dry_impl(logits, context, single, multi, multiplier, base, allowed, last_n, max_exp, col_start)


@apply_dry.register_fake
def _(logits, context, single, multi, multiplier, base, allowed, last_n, max_exp, col_start):
    return _fp32_like(logits)


@torch.library.custom_op("tpsample::apply_bias", mutates_args=())
def apply_bias(logits: Tensor, token_ids: Tensor, values: Tensor, col_start: int) -> Tensor:
    return impl.bias_impl(logits, token_ids, values, col_start)


@apply_bias.register_fake
def _(logits, token_ids, values, col_start):
    return _fp32_like(logits)


@torch.library.custom_op("tpsample::apply_bitmask", mutates_args=())
def apply_bitmask(logits: Tensor, bitmask: Tensor, col_start: int) -> Tensor:
    return impl.bitmask_impl(logits, bitmask, col_start)


@apply_bitmask.register_fake
def _(logits, bitmask, col_start):
    return _fp32_like(logits)


@torch.library.custom_op("tpsample::logprobs", mutates_args=())
def logprobs(logits: Tensor, token_ids: Tensor, top_n: int, col_start: int) -> Three:
    """Full rows only (TP = 1): (ids [R, 1 + n], logprobs [R, 1 + n] fp32, ranks [R])."""
    return impl.logprobs_impl(logits, token_ids, top_n, col_start)


@logprobs.register_fake
def _(logits, token_ids, top_n, col_start):
    rows = logits.shape[0]
    return (logits.new_empty((rows, 1 + top_n), dtype=torch.int64),
            logits.new_empty((rows, 1 + top_n), dtype=torch.float32), logits.new_empty((rows,), dtype=torch.int64))
