"""The draw (step 10 of docs/semantics.md), greedy argmax and the guard (step 12).

All three are a local argmax over the columns held, turned into a row-wide winner by the
reducer's `argmax_pair` (largest value, ties -> lowest global id). The noise depends only on
(seed, position, global token id), so the winner does not depend on how columns are split.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..noise import SALT_DRAW, gumbel_noise
from ..numerics import NEG_INF, kept_mask, row_chunks, temperature_divisor
from .keys import row_keys, shard_passes


def local_argmax(z: torch.Tensor, col_start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(max value, global id of its first occurrence) per row of z [rows, cols]."""
    if z.shape[1] == 0:
        n = z.shape[0]
        return (torch.full((n,), NEG_INF, device=z.device),
                torch.full((n,), col_start, dtype=torch.int64, device=z.device))
    idx = torch.argmax(z, dim=1)
    return z.gather(1, idx.unsqueeze(1)).squeeze(1), idx + col_start


def gumbel_draw(l: torch.Tensor, thr: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                col_start: int, red, salt: int = SALT_DRAW,
                log_weights: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wide `local_gumbel_draw`."""
    return red.argmax_pair(*local_gumbel_draw(l, thr, seeds, positions, col_start, salt, log_weights))


def local_gumbel_draw(l: torch.Tensor, thr: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                      col_start: int, salt: int = SALT_DRAW,
                      log_weights: Optional[torch.Tensor] = None,
                      temperature: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """argmax over kept local tokens of (score + g(seed, pos, id)): (value, global id) per row.

    Where the kernels run (`keys.shard_passes`) the plain draw is one streaming kernel with no
    temporaries, which hashes the noise only of entries that may win (`kernels.shard`).

    score is `l` (the processed logits), or `log_weights` when given (residual draws); with
    `temperature`, l / T (step 6 applied on the fly to an input row; not with log_weights).
    A row with no kept token returns value -inf.
    """
    n, cols = l.shape
    if log_weights is None and n and cols:
        passes = shard_passes(l)
        if passes is not None:
            k0, k1 = row_keys(seeds.to(l.device), positions.to(l.device), salt)
            return passes.gumbel_draw(l, thr, k0, k1, col_start, temperature)
    div = None if temperature is None else temperature_divisor(temperature, l.device).unsqueeze(1)
    best_v = torch.full((n,), NEG_INF, device=l.device)
    best_i = torch.zeros(n, dtype=torch.int64, device=l.device)
    ids_all = torch.arange(col_start, col_start + cols, device=l.device)
    for s, t in row_chunks(n, cols, l.device):
        x = l[s:t] if div is None else l[s:t] / div[s:t]
        score = x if log_weights is None else log_weights[s:t]
        g = gumbel_noise(seeds[s:t].to(l.device), positions[s:t].to(l.device), ids_all, salt)
        z = g.add_(score)
        keep = kept_mask(x, thr[s:t]) & (score > NEG_INF)
        z.masked_fill_(~keep, NEG_INF)
        best_v[s:t], best_i[s:t] = local_argmax(z, col_start)
        del x, z, g, keep
    return best_v, best_i


def guard_tokens(raw_max: torch.Tensor, raw_argmax: torch.Tensor) -> torch.Tensor:
    """Token for rows with nothing finite kept: the raw row's argmax, or 0 if nothing is finite."""
    return torch.where(torch.isfinite(raw_max) | (raw_max > 0), raw_argmax, torch.zeros_like(raw_argmax))


def emitted_tokens(is_greedy: torch.Tensor, guard, greedy, drawn) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [rows], fallback [rows] bool) from row-wide (value, id) winners (step 12): the
    greedy or drawn winner, or, where that winner is not finite (nothing finite kept), the
    guard's token."""
    main_v = torch.where(is_greedy, greedy[0], drawn[0])
    fallback = ~torch.isfinite(main_v)
    token = torch.where(fallback, guard_tokens(guard[0], guard[1]), torch.where(is_greedy, greedy[1], drawn[1]))
    return token, fallback
