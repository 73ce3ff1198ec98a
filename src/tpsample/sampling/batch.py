"""RowBatch: the per-step, per-row view of requests that the sampling pipeline consumes.

Built on the host from request states by a pure function, for any subset of the step's rows
(batch_sharded builds it for the rows a rank owns). Row j of request r is the target row for
position `next_position + j`; its history includes the request's drafts before j (if they are
accepted, they are outputs). Sparse per-row token lists (bias, allowed, banned, penalties) are
stored as flat (row, token) pairs in global token ids; processors select their column range.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .params import SamplingParams
from .rng import seed_to_int64
from .state import RequestState


@dataclass(frozen=True)
class RowSpec:
    """One logits row: which request, which draft offset, which draft token it verifies."""
    request: RequestState
    offset: int                 # 0..num_drafts; the last row of a request is its bonus row
    draft_token: int            # token this row verifies, -1 for a bonus / non-spec row
    history_extra: tuple        # drafts before this row (count as outputs for this row)


@dataclass(frozen=True)
class SparseRows:
    rows: torch.Tensor          # [nnz] int64 row index within the batch
    tokens: torch.Tensor        # [nnz] int64 global token id
    values: Optional[torch.Tensor] = None   # [nnz] fp32 (bias) or counts


@dataclass(frozen=True)
class RowBatch:
    num_rows: int
    vocab_size: int
    seeds: torch.Tensor          # [n] int64
    positions: torch.Tensor      # [n] int64
    temperature: torch.Tensor    # [n] fp32 (0 = greedy)
    top_k: torch.Tensor          # [n] int64 (0 = off)
    top_p: torch.Tensor          # [n] fp32 (1 = off); thresholds use float64(float32(p)), as the kernels
    min_p: torch.Tensor          # [n] fp32 (0 = off)
    rep: torch.Tensor            # [n] fp32
    freq: torch.Tensor           # [n] fp32
    pres: torch.Tensor           # [n] fp32
    num_logprobs: torch.Tensor   # [n] int64 (-1 = none)
    processed_logprobs: torch.Tensor  # [n] bool
    draft_tokens: torch.Tensor   # [n] int64 (-1 = bonus / no draft)
    bias: Optional[SparseRows]
    allowed: Optional[SparseRows]
    banned: Optional[SparseRows]         # min_tokens stops and bad words
    seen: Optional[SparseRows]           # prompt+output tokens (for repetition)
    out_counts: Optional[SparseRows]     # output token counts (frequency/presence)
    sample_any: bool
    top_k_max: int
    top_p_any: bool
    min_p_any: bool
    logprobs_max: int            # -1 when no row wants logprobs

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature == 0


def _pairs(rows: list[int], toks: list[int], vals=None, dtype=torch.float32) -> Optional[SparseRows]:
    if not rows:
        return None
    v = None if vals is None else torch.tensor(vals, dtype=dtype)
    return SparseRows(torch.tensor(rows, dtype=torch.int64), torch.tensor(toks, dtype=torch.int64), v)


def _banned_tokens(p: SamplingParams, st: RequestState, extra: tuple, eos: Optional[int]) -> list[int]:
    out = list(st.output_token_ids) + list(extra)
    banned = []
    if len(out) < p.min_tokens:
        banned += list(p.stop_token_ids or [])
        if eos is not None and not p.ignore_eos:
            banned.append(eos)
    for w in p.bad_words_token_ids or ():
        n = len(w) - 1
        if n == 0 or (len(out) >= n and out[len(out) - n:] == list(w[:-1])):
            banned.append(w[-1])
    return sorted(set(banned))


def build_row_batch(specs: list[RowSpec], vocab_size: int, eos_token_id: Optional[int]) -> RowBatch:
    """Per-row tensors (on CPU) for the given rows, in the given order."""
    n = len(specs)
    cols = {k: [] for k in ("seed", "pos", "t", "k", "p", "minp", "rep", "freq", "pres", "lp", "mode", "draft")}
    bias, allowed, banned, seen, outc = ([], [], []), ([], []), ([], []), ([], []), ([], [], [])
    for i, s in enumerate(specs):
        p, st = s.request.params, s.request
        greedy = p.temperature == 0
        cols["seed"].append(seed_to_int64(st.seed))
        cols["pos"].append(st.next_position + s.offset)
        cols["t"].append(float(p.temperature))
        cols["k"].append(0 if (greedy or p.top_k <= 0) else p.top_k)
        cols["p"].append(1.0 if greedy else float(p.top_p))
        cols["minp"].append(0.0 if greedy else float(p.min_p))
        cols["rep"].append(p.repetition_penalty)
        cols["freq"].append(p.frequency_penalty)
        cols["pres"].append(p.presence_penalty)
        cols["lp"].append(-1 if p.logprobs is None else p.logprobs)
        cols["mode"].append(p.logprobs_mode == "processed")
        cols["draft"].append(s.draft_token)
        for tok, b in (p.logit_bias or {}).items():
            bias[0].append(i), bias[1].append(tok), bias[2].append(b)
        if p.allowed_token_ids is not None:
            for tok in sorted(set(p.allowed_token_ids)):
                allowed[0].append(i), allowed[1].append(tok)
        for tok in _banned_tokens(p, st, s.history_extra, eos_token_id):
            banned[0].append(i), banned[1].append(tok)
        _penalty_pairs(i, p, st, s.history_extra, seen, outc)
    f32, i64 = torch.float32, torch.int64
    top_k = torch.tensor(cols["k"], dtype=i64)
    top_p = torch.tensor(cols["p"], dtype=torch.float32)
    min_p = torch.tensor(cols["minp"], dtype=f32)
    temp = torch.tensor(cols["t"], dtype=f32)
    lp = torch.tensor(cols["lp"], dtype=i64)
    return RowBatch(
        num_rows=n, vocab_size=vocab_size,
        seeds=torch.tensor(cols["seed"], dtype=i64), positions=torch.tensor(cols["pos"], dtype=i64),
        temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
        rep=torch.tensor(cols["rep"], dtype=f32), freq=torch.tensor(cols["freq"], dtype=f32),
        pres=torch.tensor(cols["pres"], dtype=f32), num_logprobs=lp,
        processed_logprobs=torch.tensor(cols["mode"], dtype=torch.bool),
        draft_tokens=torch.tensor(cols["draft"], dtype=i64),
        bias=_pairs(*bias), allowed=_pairs(*allowed), banned=_pairs(*banned),
        seen=_pairs(*seen), out_counts=_pairs(*outc, dtype=f32),
        sample_any=bool((temp > 0).any()),
        top_k_max=int(top_k.max()) if n else 0, top_p_any=bool((top_p < 1).any()),
        min_p_any=bool((min_p > 0).any()), logprobs_max=int(lp.max()) if n else -1,
    )


def _penalty_pairs(i, p: SamplingParams, st: RequestState, extra: tuple, seen, outc) -> None:
    """(row, token) pairs of tokens seen (prompt + output) and output counts, if penalties apply."""
    if p.repetition_penalty != 1.0:
        toks = sorted(st.seen_tokens(extra))
        seen[0].extend([i] * len(toks))
        seen[1].extend(toks)
    if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
        counts = dict(st.output_counts())
        for tok in extra:
            counts[tok] = counts.get(tok, 0) + 1
        for tok in sorted(counts):
            outc[0].append(i), outc[1].append(tok), outc[2].append(float(counts[tok]))
