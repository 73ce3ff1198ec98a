"""The logits processors, in the order of docs/semantics.md, and the steps every row takes.

`PROCESSORS` is the fixed pipeline of per-request processors (steps 3-5), each one file that
holds its per-slot state, its torch op and its kernel, and is skipped when no row of the batch
uses it (its flag bit). A processor is an object with:
- `name`: its flag's name (`state.columns.Layout.bits`);
- `f32` / `i64`: the dense per-slot columns it reads, name -> the value that means "off";
- `tables`: its padded per-slot lists, name -> (dtype, fill, minimum capacity or None for
  ceil(V/32) bitmask words);
- `stage(params, prompt, vocab_size, eos_token_id)`: at `add_request`, the request's column
  values and lists by name, or None when the request does not use it (pure: no state changes);
- `rows(ctx, r_np, r_d)`: at each step, what it needs of the rows that use it (`state.rows.
  RowContext`; host row indices r_np and their device copy r_d), or None for none;
- `apply(l, rows, col_start)`: its edit of the working rows l ([rows, cols] fp32, global columns
  [col_start, col_start + cols): a full row or a vocab shard), in place, column-local.
Banning before the penalties gives the semantics' row (penalties before bad words): every
penalty keeps -inf at -inf.

The steps without per-request state live here too: the NaN count (1), the grammar mask (2)
and the temperature (6).
"""
from __future__ import annotations

import torch

from ..numerics import NEG_INF, temperature_divisor
from .allowed import AllowedIds
from .bad_words import BadWords
from .dry import Dry
from .keys import mask_nans_kernel
from .logit_bias import LogitBias
from .min_tokens import MinTokens
from .penalties import Penalties
from .scatter import keep_bits

PROCESSORS = (AllowedIds(), LogitBias(), MinTokens(), BadWords(), Penalties(), Dry())


def apply_processors(l: torch.Tensor, b, col_start: int) -> None:
    """Steps 3-5 on the rows that use each processor (`RowBatch.processors`); callers skip the
    call for a batch without any (`RowBatch.uses_processors`)."""
    for proc in PROCESSORS:
        rows = b.processors.get(proc.name)
        if rows is not None:
            proc.apply(l, rows, col_start)


def apply_bitmask(l: torch.Tensor, bitmask: torch.Tensor, col_start: int) -> None:
    """Packed int32 grammar bitmask [rows, ceil(V/32)], bit = 1 allowed: other tokens -> -inf."""
    keep_bits(l, None, bitmask.to(l.device, non_blocking=True), col_start)


def apply_temperature(l: torch.Tensor, temperature: torch.Tensor) -> None:
    """l / T for sampled rows; greedy rows (T == 0) stay as they are."""
    l.div_(temperature_divisor(temperature, l.device).unsqueeze(1))


def mask_nans(l: torch.Tensor, chunks) -> torch.Tensor:
    """NaN -> -inf in place, chunk by chunk; returns the per-row NaN counts [rows] int64.
    On a kernel device one streaming kernel does it (no temporaries, one launch)."""
    if l.stride(1) == 1 and l.dtype == torch.float32:
        kernel = mask_nans_kernel(l.device)
        if kernel is not None:
            return kernel(l)
    counts = torch.zeros(l.shape[0], dtype=torch.int64, device=l.device)
    for s, t in chunks:
        nan_mask = torch.isnan(l[s:t])
        counts[s:t] = nan_mask.sum(dim=1)
        l[s:t].masked_fill_(nan_mask, NEG_INF)
    return counts


