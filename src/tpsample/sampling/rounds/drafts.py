"""Draft verification (speculative decoding) inside the vocab-parallel rounds; the rules are
`sampling/rejection.py`'s, computed with its arithmetic on the shard.

- Deterministic drafts (no draft distribution, a distribution one-hot at the draft, greedy
  rows) need no communication of their own: a row accepts iff its draft equals `main`, the
  token plain decoding emits (the winners round gives it), and emits `main` either way.
- Rows verifying against a draft distribution q (q(x) < 1) need the target p = softmax of the
  kept tokens. Round 1 (the summary, which such a batch always runs) gives the row max M and
  the threshold; round 2 (the winners) carries, per such row, the part's q(x) and l(x) (-inf
  where it does not hold x, so their max is the row's) and its fp64 sum of exp(l - M) over kept
  tokens. Every rank then has lse (rounded to fp32 like `logprobs.log_sum_exp`), p(x) and the
  accept test u q(x) < p(x). Round 3 draws the residual max(p - q, 0) (the residual salt): each
  part's Gumbel winner of log(max(exp(l - lse) - q, 0)) over its kept tokens, one gather.
Rows whose kept set is settled only in round 2 (band rows: top-p without top-k) cannot have
their lse by then; a batch where such a row verifies against a distribution is the torch
backend's (`handles`).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ...noise import SALT_ACCEPT, SALT_RESIDUAL, uniform01
from ...numerics import NEG_INF, kept_mask, row_chunks
from ..draw import local_gumbel_draw
from ..reducer import Packet, best_part, take


def handles(host, has_probs: bool) -> bool:
    """Whether the rounds verify this batch's drafts: every row verifying against a draft
    distribution has its kept set after round 1 (it is no band row)."""
    if not has_probs:
        return True
    band = (host.temperature > 0) & (host.top_p < 1) & (host.top_k <= 0)
    return not bool((band & host.has_draft).any())


def sampled_draft_rows(host, has_probs: bool) -> np.ndarray:
    """Host indices of the rows that may verify against a draft distribution (q(x) < 1 decides
    on the device): sampled rows with a draft, when the batch has draft distributions."""
    if not has_probs:
        return np.zeros(0, np.int64)
    return np.flatnonzero(host.has_draft & (host.temperature > 0))


class DraftRows:
    """The rows of a batch that verify against a draft distribution, across the rounds."""

    def __init__(self, rows: torch.Tensor, q: torch.Tensor, x: torch.Tensor):
        self.rows, self.q, self.x = rows, q, x      # [m] batch rows, [rows, cols] q, [m] drafts
        self.lse = self.accept = self.qx = self.vx_x = None

    @staticmethod
    def of(a) -> Optional["DraftRows"]:
        """The draft-distribution rows of `a` (recipe.SampleArgs), or None."""
        rows = sampled_draft_rows(a.batch.host, a.draft_probs is not None)
        if not len(rows):
            return None
        idx = torch.from_numpy(rows).to(a.x.device, non_blocking=True)
        return DraftRows(idx, a.draft_probs, a.batch.draft_tokens.to(a.x.device).index_select(0, idx))

    def add_local(self, packet: Packet, l, thr, row_max, col_start: int, lp) -> list:
        """Round 2's fields: [m, 2 (+1)] fp32 q(x), l(x) (, logprob-row value of x) and [m] fp64 sum-exp."""
        rows, x = self.rows, self.x
        cols = l.shape[1]
        local = (x >= col_start) & (x < col_start + cols)
        c = (x - col_start).clamp(0, max(cols - 1, 0)).unsqueeze(1)
        q = self.q.index_select(0, rows).float() if cols else torch.zeros((rows.numel(), 1), device=l.device)
        lx = l.index_select(0, rows) if cols else torch.full((rows.numel(), 1), NEG_INF, device=l.device)
        lx = lx.gather(1, c).squeeze(1)
        lx = torch.where(lx >= thr[rows], lx, NEG_INF)                     # a dropped draft has p(x) = 0
        qx = q.gather(1, c).squeeze(1) if cols else q[:, 0]
        vals = [torch.where(local, qx, NEG_INF), torch.where(local, lx, NEG_INF)]
        if lp is not None:
            vals.append(lp.at(rows, x.unsqueeze(1)).squeeze(1))
        m = row_max[rows]
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        return [packet.add(torch.stack(vals, dim=1)), packet.add(_sum_exp(l, rows, thr[rows], m_safe))]

    def settle(self, got: list, fields: list, b, row_max) -> None:
        """After round 2: lse, q(x), the accept test and x's logprob-row value."""
        vals = got[fields[0]].amax(dim=0)                                  # [m, 2 (+1)]
        m = row_max[self.rows]
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        self.lse = (m_safe.double() + torch.log(got[fields[1]].sum(dim=0))).float()
        self.qx = vals[:, 0].clamp(min=0)
        px = torch.exp((vals[:, 1] - self.lse).double())
        px = torch.where(torch.isfinite(self.lse), px, torch.zeros_like(px))
        u = uniform01(b.seeds[self.rows], b.positions[self.rows], SALT_ACCEPT).to(px.device)
        self.accept = u * self.qx.double() < px
        self.vx_x = vals[:, 2] if vals.shape[1] > 2 else None

    def residual(self, l, thr, b, col_start: int, red, lp) -> tuple:
        """Round 3: the residual draw's row-wide (token, logprob-row value or None); -1 where the
        residual is empty (p == q: probability zero, the caller then keeps main)."""
        rows = self.rows
        v, i = _local_residual(l, self.q, rows, thr[rows], self.lse, b.seeds[rows], b.positions[rows], col_start)
        p = Packet()
        cols = [v.view(torch.int32), i.to(torch.int32)]
        if lp is not None:
            cols.append(lp.at(rows, i.unsqueeze(1)).squeeze(1).view(torch.int32))
        field = p.add(torch.stack(cols, dim=1))
        g = p.gather(red)[field]                                            # [P, m, 2 (+1)]
        vals, ids = g[:, :, 0].contiguous().view(torch.float32), g[:, :, 1].to(torch.int64)
        win = best_part(vals, ids)
        tok = torch.where(take(vals, win) == NEG_INF, -1, take(ids, win))
        return tok, take(g[:, :, 2].contiguous().view(torch.float32), win) if lp is not None else None


def _masked(l, rows, thr) -> torch.Tensor:
    """l[rows] with dropped tokens at -inf (a copy)."""
    x = l.index_select(0, rows)
    return x.masked_fill_(~kept_mask(x, thr), NEG_INF)


def _sum_exp(l, rows, thr, m_safe) -> torch.Tensor:
    """[m] fp64 sum of exp(l - M) over kept tokens (`logprobs.log_sum_exp`'s arithmetic)."""
    out = torch.zeros(rows.numel(), dtype=torch.float64, device=l.device)
    for s, t in row_chunks(rows.numel(), l.shape[1], l.device):
        x = _masked(l, rows[s:t], thr[s:t])
        out[s:t] = torch.exp((x - m_safe[s:t].unsqueeze(1)).double()).sum(dim=1)
    return out


def _local_residual(l, q, rows, thr, lse, seeds, positions, col_start) -> tuple:
    """This part's Gumbel winner (value, id) of log(max(exp(l - lse) - q, 0)) over kept tokens."""
    n = rows.numel()
    best_v = torch.full((n,), NEG_INF, device=l.device)
    best_i = torch.full((n,), col_start, dtype=torch.int64, device=l.device)
    none = torch.full((n,), NEG_INF, device=l.device)
    for s, t in row_chunks(n, l.shape[1], l.device):
        x = _masked(l, rows[s:t], thr[s:t])
        if not x.shape[1]:
            continue
        resid = (torch.exp(x - lse[s:t].unsqueeze(1)) - q.index_select(0, rows[s:t]).float()).clamp_(min=0)
        best_v[s:t], best_i[s:t] = local_gumbel_draw(x, none[s:t], seeds[s:t], positions[s:t], col_start,
                                                     salt=SALT_RESIDUAL, log_weights=torch.log(resid))
    return best_v, best_i


def verdict(dr: Optional[DraftRows], b, main: torch.Tensor, fallback: torch.Tensor, residual) -> tuple:
    """(emitted, accepted, vx) for every row by torch_backend.TorchSteps.guard's rule:
    deterministic drafts accept iff draft == main and emit main; rows verified against q emit
    x when accepted, else the residual draw (main where it is empty). vx: None, or for dr's rows
    the emitted token's logprob-row value where it is not main's ([m], nan where it is main's)."""
    dev = main.device
    drafts = b.draft_tokens.to(dev)
    accepted = (drafts >= 0) & (drafts == main)
    emitted, vx = main, None
    if dr is not None:
        rows, drafted = dr.rows, dr.qx < 1
        res_tok, res_vx = residual
        took_x, took_res = drafted & dr.accept, drafted & ~dr.accept & (res_tok >= 0)
        accepted = accepted.index_put((rows,), torch.where(drafted, dr.accept, accepted[rows]))
        emitted = emitted.index_put((rows,), torch.where(took_x, dr.x, torch.where(took_res, res_tok, main[rows])))
        if dr.vx_x is not None:
            nan = torch.full_like(dr.vx_x, float("nan"))
            vx = torch.where(took_x, dr.vx_x, torch.where(took_res, res_vx, nan))
    accepted &= ~fallback
    return torch.where(fallback, main, emitted), accepted, vx
