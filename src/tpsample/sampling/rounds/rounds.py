"""Rows split by vocabulary, sampled in rounds: the vocab-parallel backend of the sampling
recipe (`sampling/recipe.py`).

`ROUNDS`' steps give the same results as the torch backend on the full rows (the same
thresholds, noise and tie rules), but talk in a fixed number of rounds, each one `red.gather`
of a packed buffer (`reducer.Packet`):
1. summary (only when some row uses top-k, min-p, top-p or top-n-sigma, or a sampled row
   verifies against a draft distribution): per part its C = k_max + 1 largest values (C = 1
   without top-k), with top-k + top-p rows its tie counts beyond the C sent, for top-p rows
   without top-k (band rows) a mass histogram (topp_band.py), for top-n-sigma rows its integer
   sums (after one max all-reduce of the rows' ends). Every rank then derives the same
   thresholds (steps 7-9) and draws its columns locally:
   - the row max M (the union's largest value); min-p: M + log(min_p); top-n-sigma: M - n sigma;
   - top-k: the k-th largest of the union. Each part's top-k is inside its top-(k + 1), so the
     union holds the global top-k: exact, no second round;
   - top-p with top-k: every kept token is in the union except tokens tied with a part's C-th
     value when thr equals it; those are counted (the tie counts) and enter the walk as one
     entry of count x e(thr), so v* is exact from the summary alone.
2. winners: per part its guard / greedy / drawn (value, id) pairs, NaN counts, the winners'
   logprob-row values, the band rows' exact partials (topp_band.py) and the draft rows'
   statistics (drafts.py).
3. the residual draw, when a sampled row verifies against a draft distribution (drafts.py).
4. logprobs, when a row wants them (split_logprobs.py).
Greedy and temperature-only batches need round 2 only. A band row that round 2 cannot decide
(`ROUNDS_EXACT` sends every band row there, for tests) takes the exact path: a radix search for
v* (4 sums) and a re-draw (1 gather); deciding whether any row needs it is the one host read of
the step, and happens only when the batch has band rows. Which rows need what is decided from
host-side parameters only (`RowNeeds`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...numerics import (
    NEG_INF,
    fixed_point_masses,
    kept_mask,
    mass_shift,
    note_memory,
    row_chunks,
    temperature_divisor,
)
from .. import processors as P
from .. import top_n_sigma
from ..draw import emitted_tokens, local_gumbel_draw
from ..keys import shard_passes
from ..reducer import Packet, best_part, take
from ..thresholds import _radix_search, local_top_values, masses, threshold_from_sorted
from ..torch_backend import Front, front
from . import drafts, topp_band, topp_band_lp
from .split_logprobs import LpRows, logprob_round


@dataclass(frozen=True)
class RowNeeds:
    """Host-side decisions for one batch (numpy, from the rows' parameters)."""
    k_max: int                 # largest top-k (0: none)
    num_top: int               # values per part in the summary (C)
    min_p: bool                # some row uses min-p
    ties: bool                 # some row uses top-k and top-p: send tie counts
    band: np.ndarray           # rows with top-p and no top-k: the band method
    summary: bool              # round 1 runs
    sigma: bool = False        # some row uses top-n-sigma: its integer sums travel in round 1

    @staticmethod
    def of(b, row_max: bool = False) -> "RowNeeds":
        """row_max: round 1 runs for sampled rows even without filters (their max is wanted)."""
        h = b.host
        sampled = h.temperature > 0
        top_p = sampled & (h.top_p < 1)
        topk_p = np.flatnonzero(top_p & (h.top_k > 0))
        band = np.flatnonzero(top_p & (h.top_k <= 0))
        k_max = int(h.top_k.max()) if b.num_rows else 0
        min_p = bool((sampled & (h.min_p > 0)).any())
        sigma = bool(h.uses("top_n_sigma").any())
        need = bool(sampled.any()) and (k_max > 0 or min_p or len(band) > 0 or sigma or row_max)
        return RowNeeds(k_max, k_max + 1 if k_max > 0 else 1, min_p, len(topk_p) > 0, band, need, sigma)


def add_local(packet, l: torch.Tensor, needs: RowNeeds, band_rows, sigma_ends=None, vocab_size: int = 0,
              temperature=None) -> dict:
    """Queue this part's summary; returns the packet's field indices by name. sigma_ends: the
    rows' `top_n_sigma.Ends` when some row uses top-n-sigma (its local sums join the round).
    temperature: l is the input row, step 6 still to apply (no band or top-n-sigma rows then)."""
    top = local_top_values(l, needs.num_top, temperature=temperature)      # [rows, C] descending
    fields = {"top": packet.add(top)}
    if sigma_ends is not None:
        fields["sigma"] = packet.add(top_n_sigma.local_sums(l, sigma_ends, vocab_size))
    if needs.ties:
        fields["ties"] = packet.add(_tie_counts(l, top[:, -1], needs.num_top, temperature))
    if band_rows is not None:
        fields["hist"] = packet.add(topp_band.local_histogram(l, band_rows))
    return fields


def _tie_counts(l: torch.Tensor, last: torch.Tensor, c: int, temperature=None) -> torch.Tensor:
    """Per row: local values equal to `last` (the C-th largest) beyond the C sent (of l / T when
    temperature is given)."""
    if (passes := shard_passes(l)) is not None:
        return passes.tie_counts(l, last, c, temperature)
    div = None if temperature is None else temperature_divisor(temperature, l.device).unsqueeze(1)
    ge = torch.zeros(l.shape[0], dtype=torch.int64, device=l.device)
    for s, t in row_chunks(l.shape[0], l.shape[1], l.device):
        x = l[s:t] if div is None else l[s:t] / div[s:t]
        ge[s:t] = (x >= last[s:t].unsqueeze(1)).sum(dim=1)
    return torch.where(last > NEG_INF, ge - c, torch.zeros_like(ge)).clamp_(min=0)


@dataclass
class Thresholds:
    thr: torch.Tensor                  # [rows] fp32, exact for every row but band rows (min-p only there)
    row_max: torch.Tensor              # [rows] fp32
    bracket: topp_band.Bracket | None  # band rows


def derive(got: list, fields: dict, b, needs: RowNeeds, band_rows, sigma_ends=None) -> Thresholds:
    """The thresholds from the gathered summaries (identical on every rank)."""
    top = got[fields["top"]]                                    # [P, rows, C]
    parts, rows, c = top.shape
    vals = torch.sort(top.permute(1, 0, 2).reshape(rows, parts * c), dim=1, descending=True).values
    row_max = vals[:, 0]
    dev = vals.device
    thr = torch.full((rows,), NEG_INF, device=dev)
    if needs.k_max > 0:
        k = b.top_k.to(dev)
        kth = vals.gather(1, (k - 1).clamp(min=0, max=vals.shape[1] - 1).unsqueeze(1)).squeeze(1)
        thr = torch.maximum(thr, torch.where(k > 0, kth, torch.full_like(kth, NEG_INF)))
    if needs.min_p:
        thr = torch.maximum(thr, row_max + torch.log(b.min_p.to(dev)))
    if sigma_ends is not None:
        sums = got[fields["sigma"]].sum(dim=0)                  # [rows, 3] int64: exact
        thr = torch.maximum(thr, top_n_sigma.threshold(sigma_ends, sums, b.top_n_sigma.to(dev)))
    if needs.ties:        # every row (a few values each), kept where top-k and top-p apply: no index upload
        last = top[:, :, -1]                                    # [P, rows]
        bound = last.amax(dim=0)
        missing = torch.where(last == bound, got[fields["ties"]], torch.zeros_like(got[fields["ties"]])).sum(dim=0)
        top_p = b.top_p.to(dev)
        v_star = _topp_from_union(vals, thr, top_p, bound, missing, mass_shift(b.vocab_size))
        use = (b.top_k.to(dev) > 0) & (top_p < 1) & (b.temperature.to(dev) > 0)
        thr = torch.where(use, torch.maximum(v_star, thr), thr)
    br = None
    if band_rows is not None:
        br = topp_band.bracket(top[:, band_rows, 0], got[fields["hist"]], thr[band_rows],
                               b.top_p.to(dev)[band_rows], mass_shift(b.vocab_size), b.vocab_size)
    return Thresholds(thr, row_max, br)


def _topp_from_union(vals, thr, top_p, bound, missing, shift) -> torch.Tensor:
    """v* from a union holding every kept token, plus `missing` unseen ties at the value thr."""
    m = vals[:, 0]
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = masses(vals, thr, m_safe, shift)
    tie = (missing > 0) & (thr == bound) & torch.isfinite(thr)
    tie_e = fixed_point_masses(thr.unsqueeze(1), m_safe, shift).squeeze(1) * missing
    vals = torch.cat([vals, torch.where(tie, thr, torch.full_like(thr, NEG_INF)).unsqueeze(1)], dim=1)
    e = torch.cat([e, torch.where(tie, tie_e, torch.zeros_like(tie_e)).unsqueeze(1)], dim=1)
    target = top_p.to(torch.float64) * e.sum(dim=1).to(torch.float64)
    kept_vals = vals.masked_fill(~kept_mask(vals, thr), NEG_INF)
    v_star, _ = threshold_from_sorted(kept_vals, e, target, torch.full_like(m, NEG_INF))
    return v_star


class _Step:
    """One call's working state between the steps (see sampling/recipe.py)."""

    exact_rows = 0                  # rows sent to the exact path (set by the guard)

    def __init__(self, a):
        b, dev = a.batch, a.x.device
        self.a = a
        self.dr = drafts.DraftRows.of(a) if a.draft_probs is not None else None   # rows verifying against q
        self.needs = RowNeeds.of(b, row_max=self.dr is not None)
        self.band = torch.from_numpy(self.needs.band).to(dev, non_blocking=True) if len(self.needs.band) else None
        self.read_x = _reads_x(a, self.needs)                     # no working copy: step 6 on the fly
        self.f = None                                             # 1-5 (ShardRounds.front)
        self.th = None                                            # round 1's thresholds, when it runs
        self.thr = torch.full((b.num_rows,), NEG_INF, device=dev)
        self.lp = self.drawn = self.w = self.band_lp = None
        self.fallback = self.is_greedy = self.vx_draft = None


class ShardRounds:
    """The recipe's steps on a vocab shard, in rounds of packed collectives (module docstring)."""

    def __init__(self, force_exact: bool):
        self.force_exact = force_exact

    @staticmethod
    def takes(a) -> bool:
        """Whether the rounds sample these split rows: no row uses what only the torch backend
        computes on a shard, and every row verifying against a draft distribution has its kept
        set after round 1 (`drafts.handles`)."""
        return not a.batch.torch_only_any and (a.draft_probs is None or drafts.handles(a.batch.host, True))

    def front(self, a) -> _Step:
        """1-5. Where `_reads_x` holds, one shard kernel pass gives the NaN counts and the raw
        argmax (the guard's and, with no processor, the greedy rows' pair): the row is x itself."""
        st = _Step(a)
        if st.read_x:
            nans, *best = shard_passes(a.x).front(a.x, a.col_start, None)
            st.f = Front(a.x, False, nans, tuple(best), None, tuple(best))
        else:
            st.f = front(a)
        return st

    def draw(self, st: _Step) -> None:
        """6-10; the processed-logprob rows are masked here, before the draw's gather carries
        their statistics (round 2)."""
        a, f = st.a, st.f
        b, l = a.batch, f.l
        t = b.temperature if st.read_x else None      # step 6 inside the passes that read x
        if b.sample_any:
            if t is None:
                P.apply_temperature(l, b.temperature)                         # 6
            if st.needs.summary:                                              # round 1: 7-9
                ends = top_n_sigma.row_ends(l, a.red, b.vocab_size) if st.needs.sigma else None   # (+1 round)
                packet = Packet()
                fields = add_local(packet, l, st.needs, st.band, ends, b.vocab_size, t)
                st.th = derive(packet.gather(a.red), fields, b, st.needs, st.band, ends)
                st.thr = st.th.thr
        if b.lp_proc_rows is not None:              # processed logprob rows: after step 9
            _mask_rows(l, b.lp_proc_rows, st.thr)
        st.lp = LpRows(l, f.raw, b.lp_proc_rows, a.col_start) if b.logprobs_max >= 0 else None
        if b.sample_any:
            band, thr = st.band, st.thr
            t_draw = thr if band is None else thr.index_put((band,), torch.maximum(thr[band], st.th.bracket.b.float()))
            st.drawn = local_gumbel_draw(l, t_draw, b.seeds, b.positions, a.col_start, temperature=t)   # 10
        else:
            st.drawn = f.greedy

    def guard(self, st: _Step) -> tuple:
        a, f = st.a, st.f
        b, l, red, dev = a.batch, f.l, a.red, a.x.device
        st.w = w = _winners(red, l, [f.guard, f.greedy, st.drawn], f.nans, st.lp, b, st.band, st.th, a.col_start,
                            st.dr)
        if st.band is not None:
            st.exact_rows, st.band_lp = _settle_band(w, l, b, red, st.band, st.thr, st.th, st.lp, st.needs, a.col_start,
                                                  self.force_exact)
        st.is_greedy = b.greedy.to(dev)
        emitted, fallback = emitted_tokens(st.is_greedy, w.guard, w.greedy, w.drawn)    # 12
        st.fallback, accepted = fallback, torch.zeros_like(fallback)
        if b.drafts_any:                                                  # + round 3 for draft distributions
            residual = None if st.dr is None else st.dr.residual(l, st.thr, b, a.col_start, red, st.lp)
            emitted, accepted, st.vx_draft = drafts.verdict(st.dr, b, emitted, fallback, residual)
        note_memory(a.meter, f)
        return emitted, accepted, fallback, w.num_nans, None

    def logprobs(self, st: _Step, emitted: torch.Tensor) -> tuple:          # 11: round 3
        b, w = st.a.batch, st.w
        vx = torch.where(st.fallback, w.guard[2], torch.where(st.is_greedy, w.greedy[2], w.drawn[2]))
        if st.vx_draft is not None:       # rows that emitted their draft or the residual draw
            rows = st.dr.rows
            vx = vx.index_put((rows,), torch.where(st.fallback[rows] | st.vx_draft.isnan(), vx[rows], st.vx_draft))
        return logprob_round(st.lp, emitted, vx, b.num_logprobs, b.logprobs_max, st.a.red, st.band_lp,
                             mass_shift(b.vocab_size))


    def support(self, st: _Step, emitted: torch.Tensor):
        """No kept support here: a batch asking for one is the torch backend's (`recipe._backend`)."""
        return None


ROUNDS, ROUNDS_EXACT = ShardRounds(False), ShardRounds(True)


def _reads_x(a, needs: RowNeeds) -> bool:
    """Whether the step's passes may read the input shard itself, with no fp32 working copy: the
    shard kernels run on it (they read its dtype, take NaN as -inf and divide by T on the fly)
    and no step writes the row (no grammar mask, processor, logprobs, drafts, XTC, top-n-sigma
    or band rows, whose passes are torch ops on the working row)."""
    b = a.batch
    return (shard_passes(a.x) is not None and a.bitmask is None and a.draft_probs is None and not b.uses_processors
            and b.logprobs_max < 0 and not b.drafts_any and not b.xtc_any and not needs.sigma and not len(needs.band))


def _mask_rows(l: torch.Tensor, rows: torch.Tensor, thr: torch.Tensor) -> None:
    """l[rows] < thr[rows] -> -inf (the processed rows of logprobs)."""
    for s, t in row_chunks(rows.numel(), l.shape[1], l.device):
        r = rows[s:t]
        x = l.index_select(0, r)
        l.index_copy_(0, r, x.masked_fill_(x < thr.index_select(0, r).unsqueeze(1), NEG_INF))


class _Winners:
    """Row-wide (value, id, logprob-row value) of the guard, greedy and drawn pairs."""

    def __init__(self, guard, greedy, drawn, num_nans, band_parts=None):
        self.guard, self.greedy, self.drawn, self.num_nans = guard, greedy, drawn, num_nans
        self.band_parts = band_parts                         # band rows: the gathered partials


def _winners(red, l, pairs, nans, lp, b, band, th, col_start, dr=None) -> _Winners:
    """Round 2: one gather of the local pairs (+ logprob-row values), the band partials and the
    draft rows' statistics (drafts.DraftRows, settled here)."""
    n, dev = l.shape[0], l.device
    p = Packet()
    rows = torch.arange(n, device=dev)
    cols = [t for v, i in pairs for t in (v.float().view(torch.int32), i.to(torch.int32))]
    if lp is not None:
        ids = torch.stack([i for _, i in pairs], dim=1)
        cols += list(lp.at(rows, ids).view(torch.int32).unbind(1))
    f_pairs = p.add(torch.stack(cols + [nans.to(torch.int32)], dim=1))
    f_band = None
    if band is not None:
        part = topp_band.local_partials(l, None if lp is None else lp.at, band, th.thr[band], th.bracket,
                                        b.seeds[band], b.positions[band], col_start, mass_shift(b.vocab_size),
                                        with_counts=b.lp_proc_rows is not None)
        f_band = {k: p.add(v) for k, v in part.items()}
    f_draft = None if dr is None else dr.add_local(p, l, th.thr, th.row_max, col_start, lp)
    got = p.gather(red)
    if dr is not None:
        dr.settle(got, f_draft, b, th.row_max)
    g = got[f_pairs]                                                     # [P, n, 6 (+3) + 1]
    out = []
    for k in range(3):
        vals, ids = g[:, :, 2 * k].contiguous().view(torch.float32), g[:, :, 2 * k + 1].to(torch.int64)
        win = best_part(vals, ids)
        lpv = take(g[:, :, 6 + k].contiguous().view(torch.float32), win) if lp is not None else None
        out.append((take(vals, win), take(ids, win), lpv))
    num_nans = g[:, :, -1].to(torch.int64).sum(dim=0)
    band_parts = None if f_band is None else {k: got[i] for k, i in f_band.items()}
    return _Winners(*out, num_nans, band_parts)


def _settle_band(w: _Winners, l, b, red, band, thr, th, lp, needs, col_start, force_exact):
    """Band rows: their drawn winner from round 2, or the exact path for the undecided ones.
    Returns (rows sent to the exact path, BandLp of the rows with processed logprobs or None)."""
    dev = l.device
    certain = (w.drawn[0][band], w.drawn[1][band],
               w.drawn[2][band] if w.drawn[2] is not None else torch.full_like(w.drawn[0][band], NEG_INF))
    res = topp_band.resolve(w.band_parts, certain, b.top_p.to(dev)[band], th.bracket.ok)
    failed = res.failed
    proc = np.flatnonzero(np.isin(needs.band, _host_proc(b))) if b.lp_proc_rows is not None else np.zeros(0, np.int64)
    idx = torch.from_numpy(proc).to(dev, non_blocking=True) if len(proc) else None
    if idx is not None:    # processed logprobs finish in the logprob round, from at most JSTAR_LEN j* tokens
        counts = w.band_parts["count"][:, idx]                            # [P, m, NUM_SUB]
        at_j = counts.gather(2, res.j_star[idx].view(1, -1, 1).expand(counts.shape[0], -1, 1)).squeeze(2)
        failed = failed.index_put((idx,), failed[idx] | (at_j.amax(dim=0) > topp_band_lp.JSTAR_LEN))
    if force_exact:
        failed = torch.ones_like(failed)
    _put(w.drawn, band, (res.value, res.token, res.lp))
    band_lp = None
    if idx is not None:
        br, rows = th.bracket, band[idx]
        band_lp = topp_band_lp.BandLp(rows, thr[rows], br.a[idx].float(), br.b[idx].float(), br.sub_scale()[idx],
                                      res.j_star[idx], res.above_j[idx], res.target[idx], br.m_safe[idx],
                                      ~failed[idx])
    which = failed.nonzero().squeeze(1)       # the step's one host read (band rows only)
    if which.numel():
        _exact_path(w, l, b, red, band[which], thr, th.bracket.m_safe[which], res.target[which], lp, col_start)
    return int(which.numel()), band_lp


def _exact_path(w: _Winners, l, b, red, rows, thr, m_safe, target, lp, col_start) -> None:
    """v* of these rows by the radix search (4 sums), then their draw again (1 gather)."""
    v = _radix_search(l, rows, thr[rows], m_safe, target, mass_shift(b.vocab_size), red)
    new_thr = torch.maximum(v, thr[rows])
    thr[rows] = new_thr
    if b.lp_proc_rows is not None:
        _mask_rows(l, rows, thr)
    drawn_local = local_gumbel_draw(l.index_select(0, rows), new_thr, b.seeds[rows], b.positions[rows], col_start)
    p = Packet()
    cols = [drawn_local[0].view(torch.int32), drawn_local[1].to(torch.int32)]
    if lp is not None:
        cols.append(lp.at(rows, drawn_local[1].unsqueeze(1)).squeeze(1).view(torch.int32))
    f0 = p.add(torch.stack(cols, dim=1))
    g = p.gather(red)[f0]                                                 # [P, m, 2 (+1)]
    vals, ids = g[:, :, 0].contiguous().view(torch.float32), g[:, :, 1].to(torch.int64)
    win = best_part(vals, ids)
    lpv = take(g[:, :, 2].contiguous().view(torch.float32), win) if lp is not None else None
    _put(w.drawn, rows, (take(vals, win), take(ids, win), lpv))


def _put(pair, rows, new) -> None:
    for dst, src in zip(pair, new):
        if dst is not None and src is not None:
            dst[rows] = src.to(dst.dtype)


def _host_proc(b) -> np.ndarray:
    """Host row indices that want processed logprobs."""
    h = b.host
    return np.flatnonzero((h.num_logprobs >= 0) & h.processed)
