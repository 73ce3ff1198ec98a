"""The ops' bodies over tensors and ints only, registered as torch.library custom ops with fake
(meta) implementations: `torch.ops.tpsample.sample`, `apply_penalties`, `apply_dry`,
`apply_bias`, `apply_bitmask` and `logprobs`, when `tpsample.ops` is imported.

Contract (arguments already checked by the public wrappers in `ops.api` / `ops.processors`,
which broadcast scalars to per-row tensors and pick the hints; the raw ops do not validate):
- schemas hold tensors and scalars only, so torch.compile traces a call as one opaque node
  (`fullgraph=True` holds) and a CUDA graph records the kernels it launches; the fakes give each
  output's shape and dtype from the inputs' alone (the logprob width is an int argument).
  Every op is functional (`mutates_args=()`); collectives are never inside an op.
- `sample_impl`: per-row tensors (temperature, top-k, top-p, min-p as given, seeds, positions)
  -> `table.sample_full`'s six tensors (`direct.sample_direct` on a kernel device without a
  bitmask or processed logprobs: the same kernels and inputs, launched without the tables).
  Normalises as the Sampler stores a request, reads the rows' parameters on the host only
  where the torch pipeline decides from them (CPU tensors: free; a device: one copy), else
  hands the kernels the caller's hints (`hints` bits, -1: all on).
- the processors return a new fp32 `[rows, cols]` copy of the logits (contiguous) with the
  Sampler's processor applied (`sampling.processors`), columns `[col_start, col_start + cols)`
  of the vocabulary: a full row (0) or a TP shard. Nothing is communicated.
- `logprobs_impl`: `row_logprobs` (torch, any reducer) or, for full rows on a kernel device, the
  one-pass statistics kernel the Sampler's raw logprobs use; no `[rows, V]` logprob tensor.
  Zero rows give empty results of the usual dtypes and widths, with no collective.
Never imports the Sampler or the engine.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ..numerics import NEG_INF, row_chunks
from ..sampling import processors as P
from ..sampling.dry import Dry, dry_penalties
from ..sampling.logit_bias import LogitBias
from ..sampling.logprobs import finite_logprobs, row_logprobs
from ..sampling.penalties import Penalties, PenaltyRows
from ..sampling.reducer import LocalRows
from ..sampling.scatter import PaddedRows
from .args import normalise
from .direct import sample_direct
from .table import RowTable, kernel_path, needs_host_values, sample_full


def host_params(temperature, top_k, top_p, min_p) -> dict:
    """The normalised parameters as numpy, in one device read (fp64 holds each exactly)."""
    both = torch.stack([temperature.double(), top_k.double(), top_p.double(), min_p.double()]).cpu().numpy()
    return {"temperature": both[0].astype(np.float32), "top_k": both[1].astype(np.int64),
            "top_p": both[2].astype(np.float32), "min_p": both[3].astype(np.float32)}


def sample_impl(logits, temperature, top_k, top_p, min_p, seeds, positions, bitmask: Optional[torch.Tensor],
                num_logprobs: int, processed: bool, hints: int):
    dev, vocab = logits.device, logits.shape[1]
    if bitmask is None and not (processed and num_logprobs >= 0) and kernel_path(logits):
        return sample_direct(logits, (temperature, top_k, top_p, min_p, seeds, positions), hints, num_logprobs)
    t = temperature.to(dev, torch.float32)
    k, p, m = normalise(t, top_k.to(dev, torch.int64), top_p.to(dev, torch.float32), min_p.to(dev, torch.float32),
                        vocab)
    host = None
    if dev.type == "cpu" or needs_host_values(logits, processed and num_logprobs >= 0, 1):
        host = host_params(t, k, p, m)
    table = RowTable.build(t, k, p, m, seeds.to(dev, torch.int64), positions.to(dev, torch.int64),
                           num_logprobs=num_logprobs, processed=processed, vocab_size=vocab, host=host, hints=hints)
    width = num_logprobs + 1 if num_logprobs >= 0 else 0
    return sample_full(logits, table, None if bitmask is None else bitmask.to(dev), width)


def fp32_copy(logits: torch.Tensor) -> torch.Tensor:
    return logits.to(torch.float32, memory_format=torch.contiguous_format, copy=True)


def distinct_ascending(ids: torch.Tensor) -> torch.Tensor:
    """[rows, P] token ids (-1 pads anywhere, repeats allowed) -> each row's distinct ids
    ascending, -1 padded at the end, int32: the Sampler's per-slot prompt set."""
    big = torch.iinfo(torch.int64).max
    s = torch.sort(torch.where(ids < 0, big, ids.to(torch.int64)), dim=1).values
    dup = torch.zeros_like(s, dtype=torch.bool)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    s = torch.sort(torch.where(dup, big, s), dim=1).values
    return torch.where(s == big, -1, s).to(torch.int32)


def penalties_impl(logits, output_ids, prompt_ids: Optional[torch.Tensor], repetition, frequency, presence,
                   col_start: int) -> torch.Tensor:
    l = fp32_copy(logits)
    rows, dev = l.shape[0], l.device
    idx = torch.arange(rows, device=dev)
    table = torch.stack([repetition.to(dev, torch.float32), frequency.to(dev, torch.float32),
                         presence.to(dev, torch.float32)])
    prompt = None if prompt_ids is None else distinct_ascending(prompt_ids.to(dev))
    pen = PenaltyRows(idx, idx, output_ids.to(dev, torch.int64), prompt, 0 if prompt is None else prompt.shape[1],
                      table, (0, 1, 2))
    Penalties().apply(l, pen, col_start)
    return l


def dry_impl(logits, context, single, multi, multiplier, base, allowed, last_n, max_exp, col_start: int) -> torch.Tensor:
    l = fp32_copy(logits)
    dev = l.device
    ctx = context.to(dev, torch.int64)
    none = ctx.new_zeros(ctx.shape[0])
    tokens, values = dry_penalties(ctx, ctx.new_zeros((ctx.shape[0], 0)), none,
                                   (single.to(dev, torch.int64), multi.to(dev, torch.int64)), last_n.to(dev),
                                   allowed.to(dev), max_exp.to(dev), multiplier.to(dev), base.to(dev))
    Dry().apply(l, PaddedRows(torch.arange(l.shape[0], device=dev), tokens, values), col_start)
    return l


def bias_impl(logits, token_ids, values, col_start: int) -> torch.Tensor:
    l = fp32_copy(logits)
    idx = torch.arange(l.shape[0], device=l.device)
    LogitBias().apply(l, PaddedRows(idx, token_ids.to(l.device, torch.int64), values.to(l.device, torch.float32)),
                 col_start)
    return l


def bitmask_impl(logits, bitmask, col_start: int) -> torch.Tensor:
    l = fp32_copy(logits)
    P.apply_bitmask(l, bitmask, col_start)
    return l


def logprobs_impl(logits, token_ids, top_n: int, col_start: int, red=None):
    """(ids [R, 1 + n] int64, logprobs [R, 1 + n] fp32, ranks [R] int64) of the given tokens."""
    red = LocalRows() if red is None else red
    tokens = token_ids.to(logits.device, torch.int64)
    rows, cols = logits.shape
    if rows == 0:         # nothing to compute or combine (every rank holds the same zero rows)
        return (tokens.new_empty((0, 1 + top_n)), logits.new_empty((0, 1 + top_n), dtype=torch.float32),
                tokens.new_empty((0,)))
    if isinstance(red, LocalRows) and rows and cols and kernel_path(logits):
        from ..kernels.stats import token_logprob_stats
        lse, top_v, top_i, above = token_logprob_stats(logits, None, top_n, col_offset=col_start, tokens=tokens)
        local = (tokens - col_start).clamp(0, cols - 1).unsqueeze(1)
        v = logits.gather(1, local).squeeze(1).float()
        v = torch.where(torch.isnan(v), NEG_INF, v)
        v = torch.where((tokens >= col_start) & (tokens < col_start + cols), v, NEG_INF)
        ids = torch.cat([tokens.unsqueeze(1), top_i], dim=1)
        return ids, finite_logprobs(ids, torch.cat([v.unsqueeze(1), top_v], dim=1), lse), above + 1
    l = fp32_copy(logits)
    P.mask_nans(l, row_chunks(rows, cols, l.device))
    return row_logprobs(l, tokens, top_n, col_start, red)


Six = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
Three = tuple[Tensor, Tensor, Tensor]


@torch.library.custom_op("tpsample::sample", mutates_args=())
def sample(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, seeds: Tensor,
           positions: Tensor, bitmask: Optional[Tensor], num_logprobs: int, processed: bool, hints: int) -> Six:
    """(tokens [R] int64, fallback [R] bool, num_nans [R] int64, lp_ids [R, W] int64,
    lp_vals [R, W] fp32, lp_ranks [R] int64), W = num_logprobs + 1 (0 when num_logprobs < 0)."""
    return sample_impl(logits, temperature, top_k, top_p, min_p, seeds, positions, bitmask,
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
    return penalties_impl(logits, output_ids, prompt_ids, repetition, frequency, presence, col_start)


@apply_penalties.register_fake
def _(logits, output_ids, prompt_ids, repetition, frequency, presence, col_start):
    return _fp32_like(logits)


@torch.library.custom_op("tpsample::apply_dry", mutates_args=())
def apply_dry(logits: Tensor, context: Tensor, single: Tensor, multi: Tensor, multiplier: Tensor, base: Tensor,
              allowed: Tensor, last_n: Tensor, max_exp: Tensor, col_start: int) -> Tensor:
    return dry_impl(logits, context, single, multi, multiplier, base, allowed, last_n, max_exp, col_start)


@apply_dry.register_fake
def _(logits, context, single, multi, multiplier, base, allowed, last_n, max_exp, col_start):
    return _fp32_like(logits)


@torch.library.custom_op("tpsample::apply_bias", mutates_args=())
def apply_bias(logits: Tensor, token_ids: Tensor, values: Tensor, col_start: int) -> Tensor:
    return bias_impl(logits, token_ids, values, col_start)


@apply_bias.register_fake
def _(logits, token_ids, values, col_start):
    return _fp32_like(logits)


@torch.library.custom_op("tpsample::apply_bitmask", mutates_args=())
def apply_bitmask(logits: Tensor, bitmask: Tensor, col_start: int) -> Tensor:
    return bitmask_impl(logits, bitmask, col_start)


@apply_bitmask.register_fake
def _(logits, bitmask, col_start):
    return _fp32_like(logits)


@torch.library.custom_op("tpsample::logprobs", mutates_args=())
def logprobs(logits: Tensor, token_ids: Tensor, top_n: int, col_start: int) -> Three:
    """Full rows only (TP = 1): (ids [R, 1 + n], logprobs [R, 1 + n] fp32, ranks [R])."""
    return logprobs_impl(logits, token_ids, top_n, col_start)


@logprobs.register_fake
def _(logits, token_ids, top_n, col_start):
    rows = logits.shape[0]
    return (logits.new_empty((rows, 1 + top_n), dtype=torch.int64),
            logits.new_empty((rows, 1 + top_n), dtype=torch.float32), logits.new_empty((rows,), dtype=torch.int64))
