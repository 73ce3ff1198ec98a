"""Column-local logits processors: steps 2-6 of the semantics (docs/semantics.md).

Each works in place on `l` ([rows, cols] fp32), which holds global columns
`[col_start, col_start + cols)` of the rows: a full row (col_start = 0) or a vocab shard.
Per-row token lists arrive as `PaddedRows` (global ids, -1 padded, only the rows that use
them); entries outside the column range are ignored, so the same code serves every strategy.
Sparse updates are gather -> compute -> scatter: every write to a position carries the value
computed from that position's original entry, so duplicates (a token seen twice, padding
redirected to a real entry) write identical values and the result is deterministic.
None of them communicates, and none reads the device to decide anything.
"""
from __future__ import annotations

import torch

from ..numerics import NEG_INF
from ..state.rowbatch import AllowedRows, PaddedRows, PenaltyRows
from .filters import row_chunks


def _targets(pairs: PaddedRows, col_start: int, cols: int):
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


def _unpack_bits(words: torch.Tensor, col_start: int, cols: int) -> torch.Tensor:
    """[m, ceil(V/32)] int32 bitmask words -> [m, cols] bool for global columns [col_start, +cols)."""
    ids = torch.arange(col_start, col_start + cols, device=words.device)
    w = words.index_select(1, ids // 32)
    return ((w >> (ids % 32).to(torch.int32)) & 1).bool()


def apply_bitmask(l: torch.Tensor, bitmask: torch.Tensor, col_start: int) -> None:
    """Packed int32 grammar bitmask [rows, ceil(V/32)], bit = 1 allowed: other tokens -> -inf."""
    bitmask = bitmask.to(l.device, non_blocking=True)
    for s, t in row_chunks(l.shape[0], l.shape[1], l.device):
        l[s:t].masked_fill_(~_unpack_bits(bitmask[s:t], col_start, l.shape[1]), NEG_INF)


def apply_allowed(l: torch.Tensor, allowed: AllowedRows | None, col_start: int) -> None:
    """Rows with an allowed set: every other token -> -inf."""
    if allowed is None:
        return
    m = allowed.rows.shape[0]
    for s, t in row_chunks(m, l.shape[1], l.device):
        rows = allowed.rows[s:t]
        keep = _unpack_bits(allowed.bitmask[s:t], col_start, l.shape[1])
        l.index_copy_(0, rows, l.index_select(0, rows).masked_fill_(~keep, NEG_INF))


def _skip(pairs: PaddedRows | None, l: torch.Tensor) -> bool:
    return pairs is None or l.shape[1] == 0 or pairs.tokens.shape[1] == 0


def apply_bias(l: torch.Tensor, bias: PaddedRows | None, col_start: int) -> None:
    if _skip(bias, l):
        return
    rows, col, src, live = _targets(bias, col_start, l.shape[1])
    old = l[rows, col]
    l[rows, col] = torch.where(live, old + bias.values.gather(1, src), old)


def apply_banned(l: torch.Tensor, banned: tuple[PaddedRows, ...] | None, col_start: int) -> None:
    """min_tokens stop ids / EOS and bad-word final tokens -> -inf."""
    if banned is None or l.shape[1] == 0:
        return
    for part in banned:
        if _skip(part, l):
            continue
        rows, col, _, live = _targets(part, col_start, l.shape[1])
        old = l[rows, col]
        l[rows, col] = torch.where(live, torch.full_like(old, NEG_INF), old)


def apply_penalties(l: torch.Tensor, pen: PenaltyRows | None, col_start: int) -> None:
    """Repetition on seen tokens (prompt set + outputs; l > 0: l / r, else l * r), then frequency
    and presence on outputs (l - f * count - p). One kernel on a kernel device, else torch."""
    if pen is None or l.shape[1] == 0:
        return
    if l.stride(1) == 1:
        from .keys import penalty_kernel
        kernel = penalty_kernel(l.device)
        if kernel is not None:
            if pen.ordered is not None:         # the slots' outputs, ascending, in place
                ordered, lengths = pen.ordered, pen.num_out
            else:
                ordered, lengths = torch.sort(pen.seq, dim=1).values, None
            kernel(l, col_start, pen.rows, pen.slots, ordered, pen.prompt_table, pen.prompt_width, pen.f32_table,
                   pen.columns, lengths)
            return
    rep, freq, pres = pen.values()
    seq = pen.outputs()
    seen = PaddedRows(pen.rows, torch.cat([pen.prompt(), seq], dim=1))
    if not _skip(seen, l):
        rows, col, _, live = _targets(seen, col_start, l.shape[1])
        v = l[rows, col]
        r = rep.unsqueeze(1)
        l[rows, col] = torch.where(live, torch.where(v > 0, v / r, v * r), v)
    out_tokens = PaddedRows(pen.rows, seq)
    if not _skip(out_tokens, l):
        tok = out_tokens.tokens
        ordered = torch.sort(tok, dim=1).values
        counts = (torch.searchsorted(ordered, tok, right=True) - torch.searchsorted(ordered, tok)).float()
        rows, col, src, live = _targets(out_tokens, col_start, l.shape[1])
        v = l[rows, col]
        c = counts.gather(1, src)
        new = v - freq.unsqueeze(1) * c
        new = new - pres.unsqueeze(1) * (c > 0).float()
        l[rows, col] = torch.where(live, new, v)


def apply_temperature(l: torch.Tensor, temperature: torch.Tensor) -> None:
    """l / T for sampled rows; greedy rows (T == 0) stay as they are."""
    t = temperature.to(l.device)
    t = torch.where(t == 0, torch.ones_like(t), t)
    l.div_(t.unsqueeze(1))


def mask_nans(l: torch.Tensor, chunks) -> torch.Tensor:
    """NaN -> -inf in place, chunk by chunk; returns the per-row NaN counts [rows] int64.
    On a kernel device one streaming kernel does it (no temporaries, one launch)."""
    if l.stride(1) == 1 and l.dtype == torch.float32:
        from .keys import mask_nans_kernel
        kernel = mask_nans_kernel(l.device)
        if kernel is not None:
            return kernel(l)
    counts = torch.zeros(l.shape[0], dtype=torch.int64, device=l.device)
    for s, t in chunks:
        nan_mask = torch.isnan(l[s:t])
        counts[s:t] = nan_mask.sum(dim=1)
        l[s:t].masked_fill_(nan_mask, NEG_INF)
    return counts


def apply_token_processors(l: torch.Tensor, b, col_start: int) -> None:
    """Steps 3-5: allowed ids, logit bias, banned ids (min_tokens, bad words), then penalties.
    Banning before the penalties gives the semantics' row (penalties before bad words): every
    penalty keeps -inf at -inf."""
    apply_allowed(l, b.allowed, col_start)
    apply_bias(l, b.bias, col_start)
    apply_banned(l, b.banned, col_start)
    apply_penalties(l, b.penalties, col_start)
