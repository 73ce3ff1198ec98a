"""Logprobs of split rows in one round, after the winners are known (step 11 of the semantics).

The winners gather carries, with each local winner, its value in the row's logprob row (raw or
processed), so after it every rank knows v_x, the emitted token's value. One more gather then
sends per logprob row: the part's max and fp64 sum-exp relative to it (log-sum-exp), the count of
its values strictly above v_x (the rank), and its top-n as (value, id) with ties -> lower id.
The local top-n (logprobs.local_top_n) needs no host read.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...numerics import NEG_INF
from ..logprobs import blank_unasked, empty_logprobs, finite_logprobs, local_top_n, put_logprobs, sort_value_desc_id_asc
from ..reducer import Packet
from . import topp_band_lp


class LpRows:
    """Where each row's logprob row lives: the raw copy (raw mode) or the processed rows `l`."""

    def __init__(self, l: torch.Tensor, raw: Optional[tuple], proc_rows: Optional[torch.Tensor], col_start: int):
        n, dev = l.shape[0], l.device
        self.l, self.col_start = l, col_start
        self.raw_rows, self.raw = (raw[0], raw[1]) if raw is not None else (None, None)
        self.proc_rows = proc_rows
        self.pos = torch.full((n,), -1, dtype=torch.int64, device=dev)       # row in the raw copy
        if self.raw is not None:
            self.pos[self.raw_rows] = torch.arange(self.raw_rows.numel(), device=dev)
        self.proc = torch.zeros(n, dtype=torch.bool, device=dev)
        if proc_rows is not None:
            self.proc[proc_rows] = True

    def at(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[n, k] logprob-row values at global ids [n, k] of rows [n] (-inf: not here / no logprobs)."""
        cols = self.l.shape[1]
        local = (ids >= self.col_start) & (ids < self.col_start + cols)
        c = (ids - self.col_start).clamp(0, max(cols - 1, 0))
        out = torch.full(ids.shape, NEG_INF, device=ids.device)
        if cols == 0:
            return out
        if self.raw is not None:
            p = self.pos[rows]
            v = self.raw[p.clamp(min=0).unsqueeze(1), c]
            out = torch.where((p >= 0).unsqueeze(1), v, out)
        if self.proc_rows is not None:
            v = self.l[rows.unsqueeze(1), c]
            out = torch.where(self.proc[rows].unsqueeze(1), v, out)
        return torch.where(local, out, torch.full_like(out, NEG_INF))

    def blocks(self):
        """(rows, block) pairs of the logprob rows: the raw copy, the processed rows."""
        if self.raw is not None:
            yield self.raw_rows, self.raw
        if self.proc_rows is not None:
            yield self.proc_rows, self.l.index_select(0, self.proc_rows)


def logprob_round(lp: LpRows, emitted: torch.Tensor, vx: torch.Tensor, num_logprobs: torch.Tensor,
                  n: int, red, band_lp=None, shift: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [rows, 1+n], logprobs [rows, 1+n] fp32, ranks [rows]) with one gather.

    emitted [rows] the emitted tokens, vx [rows] their logprob-row values (row-wide).
    band_lp: band rows with processed logprobs (topp_band_lp.BandLp) or None."""
    dev, rows_total = emitted.device, emitted.shape[0]
    blocks = list(lp.blocks())
    band_at = None
    if band_lp is not None:                # their processed rows: only the certainly kept tokens
        proc_rows, block = blocks[-1]
        pos = torch.full((rows_total,), -1, dtype=torch.int64, device=dev)
        pos[proc_rows] = torch.arange(proc_rows.numel(), device=dev)
        at = pos[band_lp.rows]
        block[at] = torch.where(band_lp.active.unsqueeze(1), topp_band_lp.certain_rows(lp.l, band_lp), block[at])
        band_at = at + (blocks[0][0].numel() if len(blocks) == 2 else 0)
    idx, m_all, se_all, cnt_all, tv_all, ti_all = [], [], [], [], [], []
    for rows, block in blocks:
        m = block.amax(dim=1) if block.shape[1] else torch.full((block.shape[0],), NEG_INF, device=dev)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        se = torch.exp((block - m_safe.unsqueeze(1)).double()).sum(dim=1)
        cnt = (block > vx[rows].unsqueeze(1)).sum(dim=1)
        tv, ti = local_top_n(block, n, lp.col_start)
        idx.append(rows), m_all.append(m_safe.double()), se_all.append(se), cnt_all.append(cnt)
        tv_all.append(tv), ti_all.append(ti.to(torch.int32))
    rows = torch.cat(idx)
    p = Packet()
    f = [p.add(torch.cat(x)) for x in (m_all, se_all, cnt_all, tv_all, ti_all)]
    if band_lp is not None:
        f += [p.add(t) for t in topp_band_lp.j_star_tokens(lp.l, band_lp, lp.col_start)]
    got = p.gather(red)
    pm, pse, pcnt, ptv, pti = (got[i] for i in f[:5])              # [P, m, ...]
    big_m = pm.amax(dim=0)
    lse = big_m + torch.log((pse * torch.exp(pm - big_m.unsqueeze(0))).sum(dim=0))
    ranks_m = 1 + pcnt.sum(dim=0)
    m_rows = rows.numel()
    top_v = ptv.permute(1, 0, 2).reshape(m_rows, -1)
    top_i = pti.permute(1, 0, 2).reshape(m_rows, -1).to(torch.int64)
    if band_lp is not None:               # v* from j*'s tokens; kept ones join the sum and the top-n
        lse_b, tv_b, ti_b = topp_band_lp.settle(band_lp, pm[:, band_at], pse[:, band_at], top_v[band_at],
                                                top_i[band_at], got[f[5]], got[f[6]], shift)
        act = band_lp.active
    top_v, top_i = sort_value_desc_id_asc(top_v, top_i)
    if band_lp is not None:
        lse[band_at] = torch.where(act, lse_b, lse[band_at])
        top_v[band_at, :n] = torch.where(act.unsqueeze(1), tv_b[:, :n], top_v[band_at, :n])
        top_i[band_at, :n] = torch.where(act.unsqueeze(1), ti_b[:, :n], top_i[band_at, :n])
    tok = emitted[rows]
    ids_m = torch.cat([tok.unsqueeze(1), top_i[:, :n]], dim=1)
    vals_m = finite_logprobs(ids_m, torch.cat([vx[rows].unsqueeze(1), top_v[:, :n]], dim=1), lse)
    out = empty_logprobs(rows_total, 1 + n, dev)
    put_logprobs(out, rows, (ids_m, vals_m, ranks_m))
    return blank_unasked(out, num_logprobs)
