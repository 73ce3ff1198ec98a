"""Processed logprobs of band rows (top-p without top-k) inside the one logprob round.

Processed logprobs need the kept set itself, i.e. v*, which the band method leaves inside the
crossing sub-bin j* (topp_band.py). After round 2 every rank knows j*, the exact kept mass above
it (C_j*) and the target p * S. In the logprob round each part then sends, for such a row:
- the usual statistics (max, sum-exp, count above the emitted token, top-n) over its CERTAINLY
  kept tokens (>= b, or in a sub-bin above j*): every token above the emitted one is among them
  (the emitted token is kept: it is certain, or j*'s max value), so the count is exact;
- its tokens of sub-bin j* (value, id), at most JSTAR_LEN (more: the row took the exact path
  after round 2, from the sub-bins' token counts).
Every rank then finds v* exactly (the walk of thresholds.py from C_j* over the gathered j* tokens'
integer masses) and adds the kept j* tokens to the log-sum-exp and to the top-n. Top-n entries
of -inf (rows keeping fewer than n tokens) are the lowest ids among dropped tokens: each part's
-inf entries are its lowest-id not-certain tokens; kept j* tokens among them are replaced by
their values, and the rest still holds enough of its lowest dropped ids.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...numerics import NEG_INF, fixed_point_masses, kept_mask
from ..logprobs import sort_value_desc_id_asc
from ..thresholds import threshold_from_sorted
from . import topp_band

JSTAR_LEN = 64


@dataclass
class BandLp:
    """Band rows with processed logprobs (all on the device; rows not `active` took the exact path)."""
    rows: torch.Tensor         # [m] batch rows
    thr: torch.Tensor          # [m] fp32 min-p threshold
    a: torch.Tensor            # [m] fp32 bracket
    b: torch.Tensor
    inv: torch.Tensor          # [m] fp32 sub-bins per unit of value
    j_star: torch.Tensor       # [m] int64
    above_j: torch.Tensor      # [m] int64 exact kept mass above sub-bin j*
    target: torch.Tensor       # [m] fp64
    m_safe: torch.Tensor       # [m] fp32 global max (masses are relative to it)
    active: torch.Tensor       # [m] bool: decided in round 2 (else the exact path masked the row)


def certain_rows(l: torch.Tensor, bl: BandLp) -> torch.Tensor:
    """[m, cols] the rows with every token not certainly kept at -inf."""
    x = l.index_select(0, bl.rows)
    kept = kept_mask(x, bl.thr)
    hi = x >= bl.b.unsqueeze(1)
    j = topp_band._sub_bin(x, bl.b, bl.inv)
    above = (x >= bl.a.unsqueeze(1)) & (j < bl.j_star.unsqueeze(1))
    return x.masked_fill_(~(kept & (hi | above)), NEG_INF)


def j_star_tokens(l: torch.Tensor, bl: BandLp, col_start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This part's kept tokens of sub-bin j*: (values [m, JSTAR_LEN] desc, -inf padded; global ids
    int32, -1 padded). A row with more of them took the exact path (round 2's counts)."""
    x = l.index_select(0, bl.rows)
    j = topp_band._sub_bin(x, bl.b, bl.inv)
    inside = kept_mask(x, bl.thr) & (x >= bl.a.unsqueeze(1)) & (x < bl.b.unsqueeze(1)) & (j == bl.j_star.unsqueeze(1))
    x.masked_fill_(~inside, NEG_INF)
    k = min(JSTAR_LEN, x.shape[1])
    vals = torch.full((x.shape[0], JSTAR_LEN), NEG_INF, device=x.device)
    ids = torch.full((x.shape[0], JSTAR_LEN), -1, dtype=torch.int32, device=x.device)
    if k:
        top, pos = torch.topk(x, k, dim=1)
        vals[:, :k] = top
        ids[:, :k] = torch.where(top > NEG_INF, pos + col_start, torch.full_like(pos, -1)).to(torch.int32)
    return vals, ids


def settle(bl: BandLp, parts_m, parts_se, top_v, top_i, jv, ji, shift: int):
    """(lse [m], top_v, top_i) of these rows after the gather.

    parts_m / parts_se [P, m]: the parts' max and sum-exp over certain tokens; top_v / top_i
    [m, P x n]: the parts' top-n candidates; jv / ji [P, m, JSTAR_LEN]: the j* tokens."""
    m_rows = jv.shape[1]
    jv = jv.permute(1, 0, 2).reshape(m_rows, -1)
    ji = ji.permute(1, 0, 2).reshape(m_rows, -1).to(torch.int64)
    real = jv > NEG_INF
    e = fixed_point_masses(jv, bl.m_safe, shift).masked_fill_(~real, 0)
    e_sorted_input = torch.cat([torch.zeros_like(e[:, :1]) + bl.above_j.unsqueeze(1), e], dim=1)
    v_in = torch.cat([torch.full_like(jv[:, :1], float("inf")), jv], dim=1)   # the mass above j* first
    v_star, _ = threshold_from_sorted(v_in, e_sorted_input, bl.target, torch.full_like(bl.thr, NEG_INF))
    smallest = jv.masked_fill(~real, float("inf")).amin(dim=1)
    v_star = torch.where(v_star == float("inf"), smallest, v_star)     # nothing crosses: all kept
    v_star = torch.where(v_star == NEG_INF, smallest, v_star)
    keep = real & (jv >= v_star.unsqueeze(1))
    kv = jv.masked_fill(~keep, NEG_INF)
    big = torch.maximum(parts_m.amax(dim=0), kv.amax(dim=1))
    big = torch.where(torch.isfinite(big), big, torch.zeros_like(big)).double()
    s = (parts_se * torch.exp(parts_m - big.unsqueeze(0))).sum(dim=0) + torch.exp(kv.double() - big.unsqueeze(1)).sum(1)
    lse = big + torch.log(s)
    dup = (top_v == NEG_INF).unsqueeze(2) & (top_i.unsqueeze(2) == torch.where(keep, ji, -2).unsqueeze(1))
    top_i = torch.where(dup.any(dim=2), torch.full_like(top_i, -1), top_i)
    cand_v = torch.cat([top_v, kv], dim=1)
    cand_i = torch.cat([top_i, torch.where(keep, ji, torch.full_like(ji, -1))], dim=1)
    top_v, top_i = sort_value_desc_id_asc(cand_v, cand_i)
    return lse, top_v, top_i
