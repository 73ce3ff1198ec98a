"""DRY, "don't repeat yourself" (step 4 of docs/semantics.md, with the penalties): llama.cpp's
`llama_sampler_dry_apply`, computed on the device for every row at once.

Definition (per row). The context is the prompt, the outputs and the drafts before the row; its
window is its last `dry_penalty_last_n` tokens (-1: all of it). Read backwards from the end,
the most recent sequence breaker cuts it: `rep_limit` is the number of tokens after the first
breaker occurrence found from the end (a breaker is a head token and a tail that follows it;
among breakers with that head the longest match counts), else the window's length. For each
earlier end position of the window, `n` is the length of the longest common suffix of the
context and the window up to there (the earlier copy must lie inside the window), capped at
`rep_limit`; the token that followed that earlier copy would extend the repeat. Each such token
c whose longest `n` is at least `dry_allowed_length`, and that is not a one-token breaker, gets
`l[c] -= multiplier * base ** min(n - allowed_length, max_exponent)` (llama.cpp's cap:
`max_exponent = int(88.7228391f / logf(base))` when base > 1.000001; the power in float64,
the penalty rounded to fp32 as llama.cpp's `float penalty`).

State: per slot, the four parameters and the exponent cap (columns), the prompt's last
`dry_penalty_last_n` tokens (the history on the device holds outputs only), the one-token
breakers ascending and the longer breakers padded to `MAX_DRY_BREAKER_LEN` tokens (padded
tables). Each step the rows' repeat lengths come from tensor ops: the longest common prefix of
the reversed window with each of its shifts, by prefix doubling (block ranks of length 2**t,
then binary lifting: O(L log L) for a window of L tokens, no host read; rows go a few at a
time so the rank tables stay within the row-chunk bound). The edit is a sparse subtraction by
token id, column-local, so it runs on a vocab shard unchanged.
"""
from __future__ import annotations

import numpy as np
import torch

from ..numerics import row_chunks
from ..params import MAX_DRY_BREAKER_LEN
from .scatter import PaddedRows, skip, targets

FLOAT_MAX_LOG = np.float32(88.7228391)      # llama.cpp's bound on the exponent: base**exp < FLT_MAX
_ABSENT = 1 << 31                           # sorts after every token id (padding of the sorted lists)


def max_exponent(base: float) -> int:
    """llama.cpp's cap on the exponent: int(88.7228391f / logf(base)), 0 (no cap) for base <= 1.000001."""
    b = np.float32(base)
    if not b > np.float32(1.000001):
        return 0
    return int(np.float32(FLOAT_MAX_LOG / np.log(b)))


class Dry:
    name = "dry"
    f32 = {"dry_multiplier": 0.0, "dry_base": 1.75}
    i64 = {"dry_allowed_length": 2, "dry_penalty_last_n": -1, "dry_max_exponent": 0}
    tables = {"dry_prompt": (torch.int32, -1, 8), "dry_single": (torch.int32, -1, 8),
              "dry_multi": (torch.int32, -1, MAX_DRY_BREAKER_LEN)}

    def stage(self, p, prompt, vocab_size: int, eos_token_id):
        if not p.dry_enabled:
            return None
        last_n = p.dry_penalty_last_n
        breakers = p.dry_sequence_breakers or ()
        multi = [list(w) + [-1] * (MAX_DRY_BREAKER_LEN - len(w)) for w in breakers if len(w) > 1]
        return {"dry_multiplier": p.dry_multiplier, "dry_base": p.dry_base,
                "dry_allowed_length": p.dry_allowed_length, "dry_penalty_last_n": last_n,
                "dry_max_exponent": max_exponent(p.dry_base),
                "dry_prompt": list(prompt[-last_n:] if last_n > 0 else prompt),
                "dry_single": sorted({w[0] for w in breakers if len(w) == 1}),
                "dry_multi": [t for w in multi for t in w]}

    def rows(self, ctx, r_np: np.ndarray, r_d: torch.Tensor) -> PaddedRows:
        """[m, L] the tokens that would extend a repeat (-1 none) and their penalties."""
        slots = ctx.slots_of(self.name, r_d)
        src = ctx.source
        column = lambda name: src.i64_table[src.layout.i64[name]].index_select(0, slots)  # noqa: E731
        f32 = lambda name: src.f32_table[src.layout.f32[name]].index_select(0, slots)  # noqa: E731
        seq, length = ctx.sequence(r_np, r_d)
        multi = _list(ctx, "dry_multi", r_np, slots)
        breakers = (_list(ctx, "dry_single", r_np, slots),
                    multi[:, : multi.shape[1] // MAX_DRY_BREAKER_LEN * MAX_DRY_BREAKER_LEN])
        tokens, values = dry_penalties(ctx.table("dry_prompt", r_np, slots).to(torch.int64), seq, length, breakers,
                                       column("dry_penalty_last_n"), column("dry_allowed_length"),
                                       column("dry_max_exponent"), f32("dry_multiplier"), f32("dry_base"))
        return PaddedRows(r_d, tokens, values)

    def apply(self, l: torch.Tensor, pen: PaddedRows, col_start: int) -> None:
        if skip(pen, l):
            return
        rows, col, src, live = targets(pen, col_start, l.shape[1])
        old = l[rows, col]
        l[rows, col] = torch.where(live, old - pen.values.gather(1, src), old)


def dry_penalties(prompt, seq, length, breakers, last_n, allowed, max_exp, multiplier, base):
    """([m, n] tokens, -1 none; [m, n] fp32 penalties) for rows whose context is prompt [m, P]
    (-1 padded at the end) then the first `length` [m] of seq [m, W]; breakers: (one-token
    breakers [m, S], longer ones [m, B * MAX_DRY_BREAKER_LEN]), -1 padded; the parameters [m]."""
    single, multi = _sorted_ids(breakers[0]), breakers[1].reshape(breakers[1].shape[0], -1, MAX_DRY_BREAKER_LEN)
    m, n = prompt.shape[0], prompt.shape[1] + max(seq.shape[1], 1)
    tokens = torch.full((m, n), -1, dtype=torch.int64, device=prompt.device)
    values = torch.zeros((m, n), device=prompt.device)
    # row chunks bound the prefix-doubling temporaries: ~log2(n) int64 [rows, n] rank tables
    for s, t in row_chunks(m, n * (n.bit_length() + 8), prompt.device):
        r, window = reversed_window(prompt[s:t], seq[s:t], length[s:t], last_n[s:t])
        limit = repeat_limit(r, window, single[s:t], multi[s:t])
        tok, lengths = extending_tokens(r, window, limit, allowed[s:t])
        tokens[s:t] = torch.where(_member(single[s:t], tok), torch.full_like(tok, -1), tok)
        values[s:t] = penalties(lengths, allowed[s:t], max_exp[s:t], multiplier[s:t], base[s:t])
    return tokens, values


def reversed_window(prompt: torch.Tensor, seq: torch.Tensor, length: torch.Tensor, last_n: torch.Tensor):
    """(r [m, P + W] int64, L [m]): r[j] is the context's (j + 1)-th token from the end for j < L,
    -1 beyond; the context is the prompt tail [m, P] (-1 padded) then seq [m, W] of which the
    first `length` are the outputs and drafts; L = min(context length, last_n) (-1: all)."""
    m = prompt.shape[0]
    if seq.shape[1] == 0:
        seq = seq.new_full((m, 1), -1)
    p_len = (prompt >= 0).sum(dim=1)
    total = p_len + length
    window = torch.where(last_n < 0, total, torch.minimum(last_n, total))
    j = torch.arange(prompt.shape[1] + seq.shape[1], device=prompt.device)
    q = total.unsqueeze(1) - 1 - j                                   # position in the context
    from_prompt = prompt.gather(1, q.clamp(0, max(prompt.shape[1] - 1, 0))) if prompt.shape[1] else None
    from_seq = seq.gather(1, (q - p_len.unsqueeze(1)).clamp(0, seq.shape[1] - 1))
    r = from_seq if from_prompt is None else torch.where(q < p_len.unsqueeze(1), from_prompt, from_seq)
    return torch.where(j < window.unsqueeze(1), r, torch.full_like(r, -1)), window


def repeat_limit(r: torch.Tensor, window: torch.Tensor, single: torch.Tensor, multi: torch.Tensor) -> torch.Tensor:
    """[m] llama.cpp's rep_limit: i - s for the smallest i where a breaker (head r[i], tail of s
    tokens r[i-1] ... r[i-s], s <= i; the longest such tail at that i) ends the scan, else L.
    single: [m, S] one-token breakers ascending; multi: [m, B, MAX_DRY_BREAKER_LEN] -1 padded."""
    m, n = r.shape
    j = torch.arange(n, device=r.device)
    longest = torch.where(_member(single, r), 0, -1)                  # [m, n]
    if multi.shape[1]:
        tail_len = (multi >= 0).sum(dim=2) - 1                        # [m, B]
        match = (r.unsqueeze(1) == multi[:, :, :1]) & (tail_len.unsqueeze(2) <= j)
        for o in range(min(int(multi.shape[2]) - 1, n)):
            prev = torch.cat([r.new_full((m, o + 1), -2), r[:, : n - o - 1]], dim=1)    # r[i - 1 - o]
            need = o < tail_len.unsqueeze(2)
            match &= ~need | (prev.unsqueeze(1) == multi[:, :, o + 1: o + 2])
        longest = torch.maximum(longest, torch.where(match, tail_len.unsqueeze(2), -1).amax(dim=1))
    hit = (longest >= 0) & (j < window.unsqueeze(1))
    first = torch.where(hit, j, n).amin(dim=1)
    at = longest.gather(1, first.clamp(max=n - 1).unsqueeze(1)).squeeze(1)
    return torch.where(first < n, first - at, window)


def extending_tokens(r: torch.Tensor, window: torch.Tensor, limit: torch.Tensor, allowed: torch.Tensor):
    """([m, n] tokens, [m, n] repeat lengths): per row each token that follows an earlier copy
    of the context's suffix of length >= allowed (capped at `limit`), once, with its longest
    length; -1 / 0 elsewhere."""
    m, n = r.shape
    k = torch.arange(n, device=r.device).expand(m, n)                 # the shift: copy ends k tokens back
    z = common_suffix(r, window)
    count = torch.minimum(z, limit.unsqueeze(1))
    ok = (k >= 1) & (k < window.unsqueeze(1)) & (count >= allowed.unsqueeze(1))
    token = torch.cat([r.new_full((m, 1), -1), r[:, :-1]], dim=1)     # r[k - 1]: what followed the copy
    key = torch.where(ok, token * (n + 1) + count, torch.full_like(token, _ABSENT * (n + 1)))
    key = torch.sort(key, dim=1).values
    tok, length = key // (n + 1), key % (n + 1)
    last = torch.cat([tok[:, 1:] != tok[:, :-1], torch.ones_like(tok[:, :1], dtype=torch.bool)], dim=1)
    keep = last & (tok < _ABSENT)
    return torch.where(keep, tok, -1), torch.where(keep, length, 0)


def common_suffix(r: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """[m, n] z[k] = the longest z with r[i] == r[k + i] for i < z and k + z <= L (z[0] = 0):
    prefix doubling (dense ranks of blocks of 2**t tokens) then binary lifting."""
    m, n = r.shape
    ranks = [r]
    while (1 << len(ranks)) <= n:
        h, prev = 1 << (len(ranks) - 1), ranks[-1]
        right = torch.cat([prev[:, h:], prev.new_full((m, h), -1)], dim=1)
        key, order = torch.sort(prev * (1 << 32) + (right + 1), dim=1)
        dense = torch.cat([key.new_zeros((m, 1)), (key[:, 1:] != key[:, :-1]).to(torch.int64).cumsum(dim=1)], dim=1)
        ranks.append(torch.empty_like(dense).scatter_(1, order, dense))
    k = torch.arange(n, device=r.device).expand(m, n)
    z = torch.zeros_like(k)
    for t in range(len(ranks) - 1, -1, -1):
        size = 1 << t
        fits = (k >= 1) & (k + z + size <= window.unsqueeze(1))
        at = ranks[t].gather(1, z.clamp(max=n - 1))
        there = ranks[t].gather(1, (k + z).clamp(max=n - 1))
        z = torch.where(fits & (at == there), z + size, z)
    return z


def penalties(lengths, allowed, max_exp, multiplier, base) -> torch.Tensor:
    """[m, n] fp32 multiplier * base ** min(len - allowed, max_exp) (max_exp 0: no cap), the power
    in float64 (llama.cpp's std::pow(float, int)), rounded to fp32."""
    exp = lengths - allowed.unsqueeze(1)
    cap = max_exp.unsqueeze(1)
    exp = torch.where((cap > 0) & (exp > cap), cap, exp).clamp(min=0)
    return (multiplier.double().unsqueeze(1) * torch.pow(base.double().unsqueeze(1), exp.double())).float()


def _list(ctx, name: str, r_np: np.ndarray, slots: torch.Tensor) -> torch.Tensor:
    """[m, longest] int64 rows of a breaker table ([m, 0] while no request has one: not allocated)."""
    if ctx.store.padded[name].table is None:
        return slots.new_full((slots.shape[0], 0), -1)
    return ctx.table(name, r_np, slots).to(torch.int64)


def _sorted_ids(table: torch.Tensor) -> torch.Tensor:
    """[m, S] ascending ids, -1 padding moved to the end as _ABSENT (searchsorted needs order)."""
    t = table.to(torch.int64)
    if t.shape[1] == 0:
        return t
    return torch.sort(torch.where(t < 0, _ABSENT, t), dim=1).values


def _member(ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[m, n] x[i, j] in row i of ids (ascending, _ABSENT padded)."""
    if ids.shape[1] == 0:
        return torch.zeros_like(x, dtype=torch.bool)
    at = torch.searchsorted(ids, x.contiguous()).clamp(max=ids.shape[1] - 1)
    return (ids.gather(1, at) == x) & (x >= 0)
