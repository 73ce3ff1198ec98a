"""Sparse edits of logits rows by global token id, the same on a full row and a vocab shard.

Rows `l` ([rows, cols] fp32, in place) hold global columns `[col_start, col_start + cols)`.
Per-row token lists arrive as `PaddedRows` (global ids, -1 padded, only the rows that use them);
entries outside the column range are ignored. Edits are gather -> compute -> scatter: every
write to a position carries the value computed from that position's original entry, so
duplicates (a token seen twice, padding redirected to a real entry) write identical values and
the result is deterministic. Nothing here communicates or reads the device to decide.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..numerics import NEG_INF, row_chunks


@dataclass(frozen=True)
class PaddedRows:
    """Token lists of some rows: rows [m] int64 batch rows; tokens [m, K] int64 global ids (-1 pad);
    values [m, K] fp32 when the list carries values (logit bias)."""
    rows: torch.Tensor
    tokens: torch.Tensor
    values: Optional[torch.Tensor] = None


def skip(pairs: Optional[PaddedRows], l: torch.Tensor) -> bool:
    """Nothing to edit: no rows, no columns here, or empty lists."""
    return pairs is None or l.shape[1] == 0 or pairs.tokens.shape[1] == 0


def targets(pairs: PaddedRows, col_start: int, cols: int):
    """(row index [m, K], local column [m, K], source entry [m, K], live [m, 1]) of a scatter.

    Entries outside the columns (or padding) take the column and the source entry of their row's
    first valid entry, so every write to a column computes the same value; rows with no valid
    entry write column 0 back unchanged (live False)."""
    tok = pairs.tokens
    local = tok - col_start
    valid = (tok >= 0) & (local >= 0) & (local < cols)
    k = torch.arange(tok.shape[1], device=tok.device).expand_as(tok)
    first = valid.to(torch.int32).argmax(dim=1, keepdim=True)
    src = torch.where(valid, k, first)
    live = valid.any(dim=1, keepdim=True)
    col = torch.where(live, local.gather(1, src), torch.zeros_like(local))
    rows = pairs.rows.unsqueeze(1).expand_as(col)
    return rows, col, src, live


def ban(l: torch.Tensor, pairs: Optional[PaddedRows], col_start: int) -> None:
    """The listed tokens of each row -> -inf."""
    if skip(pairs, l):
        return
    rows, col, _, live = targets(pairs, col_start, l.shape[1])
    old = l[rows, col]
    l[rows, col] = torch.where(live, torch.full_like(old, NEG_INF), old)


def unpack_bits(words: torch.Tensor, col_start: int, cols: int) -> torch.Tensor:
    """[m, ceil(V/32)] int32 bitmask words -> [m, cols] bool for global columns [col_start, +cols)."""
    ids = torch.arange(col_start, col_start + cols, device=words.device)
    w = words.index_select(1, ids // 32)
    return ((w >> (ids % 32).to(torch.int32)) & 1).bool()


def keep_bits(l: torch.Tensor, rows: Optional[torch.Tensor], words: torch.Tensor, col_start: int) -> None:
    """Rows `rows` of l (all rows when None) keep only the tokens whose bit is set in `words`
    [m, ceil(V/32)] int32 (bit = allowed); the others -> -inf."""
    m = l.shape[0] if rows is None else rows.shape[0]
    for s, t in row_chunks(m, l.shape[1], l.device):
        keep = unpack_bits(words[s:t], col_start, l.shape[1])
        if rows is None:
            l[s:t].masked_fill_(~keep, NEG_INF)
        else:
            r = rows[s:t]
            l.index_copy_(0, r, l.index_select(0, r).masked_fill_(~keep, NEG_INF))
