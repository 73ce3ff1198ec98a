"""Logprobs without a [rows, V] logprob tensor (docs/semantics.md, step 11).

From a row (raw or processed, any column range): the row-wide log-sum-exp, the chosen token's
logprob, its rank (1 + number of tokens with a strictly larger logprob) and the top-n
(ties -> lower id). Each is a local reduction plus one reducer call. The layout helpers at the
end (`empty_logprobs`, `put_logprobs`, `padded_logprobs`, `blank_unasked`) are the one place that
pads and merges per-row logprob results, for every backend and strategy.
"""
from __future__ import annotations

import torch

from ..numerics import NEG_INF, order_key, row_chunks

_LOW31 = (1 << 31) - 1


def log_sum_exp(l: torch.Tensor, red) -> torch.Tensor:
    m = red.max(l.amax(dim=1)) if l.shape[1] else red.max(torch.full((l.shape[0],), NEG_INF))
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    se = torch.exp((l - m_safe.unsqueeze(1)).double()).sum(dim=1)
    return (m_safe.double() + torch.log(red.sum(se))).float()


def value_at(l: torch.Tensor, token_ids: torch.Tensor, col_start: int, red) -> torch.Tensor:
    """l[row, token] for a global token id per row, wherever its column lives."""
    cols = l.shape[1]
    local = (token_ids >= col_start) & (token_ids < col_start + cols)
    idx = (token_ids - col_start).clamp(0, max(cols - 1, 0))
    v = l.gather(1, idx.unsqueeze(1)).squeeze(1) if cols else torch.full_like(token_ids, 0, dtype=l.dtype)
    return red.max(torch.where(local, v, torch.full_like(v, NEG_INF)))


def local_top_n(l: torch.Tensor, n: int, col_start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-n (value desc, id asc) of the local columns, padded with (-inf, -1); no host read:
    torch.topk over an int64 key (the value's order key, then the reversed column)."""
    rows, cols = l.shape
    vals = torch.full((rows, n), NEG_INF, device=l.device)
    ids = torch.full((rows, n), -1, dtype=torch.int64, device=l.device)
    k = min(n, cols)
    if k == 0:
        return vals, ids
    rev = _LOW31 - torch.arange(cols, device=l.device)
    for s, t in row_chunks(rows, cols, l.device):
        key = (order_key(l[s:t]) << 31) | rev
        c = _LOW31 - (torch.topk(key, k, dim=1).values & _LOW31)
        vals[s:t, :k], ids[s:t, :k] = l[s:t].gather(1, c), c + col_start
    return vals, ids


def sort_value_desc_id_asc(vals: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Order by value descending, then id ascending; padding (id -1) after every real token."""
    key = torch.where(ids < 0, torch.full_like(ids, torch.iinfo(torch.int64).max), ids)
    by_id = torch.argsort(key, dim=1, stable=True)
    vals, ids = vals.gather(1, by_id), ids.gather(1, by_id)
    by_val = torch.argsort(vals, dim=1, descending=True, stable=True)
    return vals.gather(1, by_val), ids.gather(1, by_val)


def row_logprobs(l: torch.Tensor, tokens: torch.Tensor, n_top: int, col_start: int, red, as_logits=None):
    """(ids [rows, 1+n], logprobs [rows, 1+n] fp32, ranks [rows]) for chosen tokens of rows l.

    Two reducer calls: one gather of each part's (max, sum-exp relative to it, value of the
    chosen token, top-n values and ids), then one sum of the strictly-greater counts.
    as_logits: optional [rows] bool: those rows give the values of l themselves (vLLM's
    "*_logits" modes; the same ids and ranks), not their log-softmax.
    """
    rows, cols = l.shape
    m = l.amax(dim=1) if cols else torch.full((rows,), NEG_INF, device=l.device)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    se = torch.exp((l - m_safe.unsqueeze(1)).double()).sum(dim=1)
    local = (tokens >= col_start) & (tokens < col_start + cols)
    idx = (tokens - col_start).clamp(0, max(cols - 1, 0))
    vx = l.gather(1, idx.unsqueeze(1)).squeeze(1) if cols else torch.full((rows,), NEG_INF, device=l.device)
    vx = torch.where(local, vx, torch.full_like(vx, NEG_INF))
    top_v, top_i = local_top_n(l, n_top, col_start)
    packed = torch.cat([torch.stack([m_safe.double(), se, vx.double()], dim=1), top_v.double(), top_i.double()], dim=1)
    parts = red.gather(packed)                                    # [rows, parts, 3 + 2n]
    big_m = parts[:, :, 0].amax(dim=1)
    lse = big_m + torch.log((parts[:, :, 1] * torch.exp(parts[:, :, 0] - big_m.unsqueeze(1))).sum(dim=1))
    vx = parts[:, :, 2].amax(dim=1).to(l.dtype)
    rank = 1 + red.sum((l > vx.unsqueeze(1)).sum(dim=1))
    top_v = parts[:, :, 3:3 + n_top].reshape(rows, -1).to(l.dtype)
    top_i = parts[:, :, 3 + n_top:].reshape(rows, -1).to(torch.int64)
    top_v, top_i = sort_value_desc_id_asc(top_v, top_i)
    top_v, top_i = top_v[:, :n_top], top_i[:, :n_top]
    ids = torch.cat([tokens.unsqueeze(1), top_i], dim=1)
    if as_logits is not None:
        lse = torch.where(as_logits, torch.zeros_like(lse), lse)
    return ids, finite_logprobs(ids, torch.cat([vx.unsqueeze(1), top_v], dim=1), lse), rank


def finite_logprobs(ids: torch.Tensor, values: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """values - lse as fp32 logprobs, never NaN: padding (id -1) and rows with nothing finite give
    -inf; in a row with +inf logits, +inf tokens get 0 (the whole mass) and the others -inf."""
    lse = lse.to(torch.float64).unsqueeze(1)
    values = values.to(torch.float64)
    vals = values - lse
    inf_row = lse == float("inf")
    vals = torch.where(inf_row, torch.where(values == float("inf"), 0.0, NEG_INF), vals)
    ok = (ids >= 0) & (lse > NEG_INF)
    return torch.where(ok, vals, torch.full_like(vals, NEG_INF)).float()


def empty_logprobs(rows: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [rows, width] -1, logprobs [rows, width] -inf, ranks [rows] 0): rows without logprobs."""
    return (torch.full((rows, width), -1, dtype=torch.int64, device=device),
            torch.full((rows, width), NEG_INF, device=device),
            torch.zeros(rows, dtype=torch.int64, device=device))


def put_logprobs(dst: tuple, rows, src: tuple) -> None:
    """dst's rows `rows` (all when None) take src's logprobs (ids, logprobs, ranks), in src's
    first columns."""
    width = src[0].shape[1]
    if rows is None:
        dst[0][:, :width], dst[1][:, :width], dst[2][:] = src
    else:
        dst[0][rows, :width], dst[1][rows, :width], dst[2][rows] = src


def padded_logprobs(lp: tuple, rows: int, width: int, device) -> tuple:
    """Logprobs (ids, logprobs, ranks; all None: none) padded to `width` columns."""
    if lp[0] is not None and lp[0].shape[1] == width:
        return lp
    out = empty_logprobs(rows, width, device)
    if lp[0] is not None:
        put_logprobs(out, None, lp)
    return out


def blank_unasked(lp: tuple, num_logprobs: torch.Tensor) -> tuple:
    """Rows asking fewer top entries than the width holds: their extra columns blanked, in place."""
    ids, vals, _ = lp
    extra = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) > \
        num_logprobs.to(ids.device).clamp(min=0).unsqueeze(1)
    ids.masked_fill_(extra, -1)
    vals.masked_fill_(extra, NEG_INF)
    return lp
