"""Slow, obviously correct torch reference of every kernel entry point in `tpsample.kernels.sample`.

Same inputs, same outputs, same semantics (see the contract at the top of that module); rows are
processed one at a time with sorts, so it is simple rather than fast. Tests compare the Triton
kernels (under `TRITON_INTERPRET=1` on CPU, or on a GPU) against it token for token.
Must not import Triton.
"""
from __future__ import annotations

import torch

from tpsample.noise import gumbel_from_bits, uniform_bits
from tpsample.numerics import NEG_INF, mass_shift  # noqa: F401  (mass_shift: part of this module's interface)
from tpsample.numerics import fixed_point_masses as masses


def transform(x: torch.Tensor, temperature: torch.Tensor | None = None,
              threshold: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 row transform: x / T (rows with T == 0 or no T: x), NaN -> -inf, l < threshold -> -inf."""
    l = x.float()
    if temperature is not None:
        t = temperature.to(l.device).float()
        l = l / torch.where(t == 0, torch.ones_like(t), t).unsqueeze(1)
    l = torch.where(torch.isnan(l), torch.full_like(l, NEG_INF), l)
    if threshold is not None:
        l = torch.where(l < threshold.to(l.device).float().unsqueeze(1), torch.full_like(l, NEG_INF), l)
    return l


def first_argmax(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, first index of it) along the last dim; v must hold no NaN."""
    i = torch.argmax(v, dim=-1)
    return v.gather(-1, i.unsqueeze(-1)).squeeze(-1), i


def _kth_largest(l: torch.Tensor, k: int) -> float:
    if k <= 0 or k > l.numel():
        return NEG_INF
    return float(torch.sort(l, descending=True).values[k - 1])


def _top_p_threshold(l: torch.Tensor, kept: torch.Tensor, p: float, shift: int) -> float:
    """v*: the smallest kept value whose strictly-larger kept mass is < p * S (exact ints)."""
    vals = l[kept]
    m = vals.max()
    e = masses(vals, m, shift)
    target = float(torch.tensor(p, dtype=torch.float32).double()) * float(e.sum())
    v, order = torch.sort(vals, descending=True)
    e = e[order]
    excl = torch.cumsum(e, 0) - e
    ok = excl.double() < target
    return float(v[int(ok.nonzero().max())])


def sample_row(x_row, t, k, p, lmp, key0, key1, col_offset, shift, n_sigma=0.0, vocab=None):
    """(local column, valid) of one row: the semantics of kernels.sample.sample_rows (top-n-sigma's
    threshold from the sampler's own `top_n_sigma_threshold` over `vocab` tokens)."""
    raw = transform(x_row.unsqueeze(0))[0]
    raw_v, raw_i = first_argmax(raw)
    if t == 0:
        return int(raw_i), bool(raw_v > NEG_INF)
    l, kept = kept_row(x_row, t, k, p, lmp, shift, n_sigma, vocab)
    if not bool(kept.any()):
        return int(raw_i), False
    return draw(l, kept, key0, key1, col_offset), True


def draw(l, kept, key0, key1, col_offset) -> int:
    """The local column of the Gumbel argmax over the kept entries of l (ties -> lowest)."""
    dev = l.device
    ids = torch.arange(l.numel(), dtype=torch.int64, device=dev) + col_offset
    g = gumbel_from_bits(uniform_bits(torch.tensor([key0], device=dev), torch.tensor([key1], device=dev), ids))[0]
    score = torch.where(kept, l + g, torch.full_like(l, NEG_INF))
    return int(first_argmax(score)[1])


def kept_row(x_row, t, k, p, lmp, shift, n_sigma=0.0, vocab=None):
    """(l, kept [V] bool) of a sampled row (t > 0): its values after the temperature and the
    entries its min-p, top-n-sigma, top-k and top-p keep."""
    l = transform(x_row.unsqueeze(0), torch.tensor([t], dtype=torch.float32))[0]
    m = l.max()
    thr = NEG_INF
    if lmp != NEG_INF:
        thr = float(m + torch.tensor(lmp, dtype=torch.float32))
    if n_sigma > 0:
        from tpsample.sampling.reducer import LocalRows
        from tpsample.sampling.top_n_sigma import top_n_sigma_threshold
        thr = max(thr, float(top_n_sigma_threshold(l.unsqueeze(0), torch.tensor([n_sigma]), LocalRows(), vocab)[0]))
    thr = max(thr, _kth_largest(l, k))
    kept = (l >= thr) & (l > NEG_INF)
    if p < 1 and bool(kept.any()) and bool(torch.isfinite(m)):
        thr = max(thr, _top_p_threshold(l, kept, p, shift))
        kept = (l >= thr) & (l > NEG_INF)
    return l, kept


def xtc_row(l, kept, xtc_threshold: float, shift: int):
    """XTC's upper bound of a row whose coin came up (+inf: none): the smallest kept value whose
    mass relative to the kept max reaches xtc_threshold of the kept mass, when two or more do."""
    if not bool(kept.any()):
        return float("inf")
    e = masses(l, l[kept].max(), shift).masked_fill(~kept, 0)
    top = e.double() >= float(torch.tensor(xtc_threshold, dtype=torch.float32).double()) * float(e.sum())
    top &= kept
    return float(l[top].min()) if int(top.sum()) >= 2 else float("inf")


def sample_rows(x, temperature, top_k, top_p, log_min_p, key0, key1, *, col_offset=0,
                vocab_size_global=None, n_sigma=None):
    """Reference of kernels.sample.sample_rows: (global token ids [R] int64, valid [R] bool), on x's device."""
    shift = mass_shift(vocab_size_global or x.shape[1])
    toks, valid = [], []
    for r in range(x.shape[0]):
        tok, ok = sample_row(x[r], float(temperature[r]), int(top_k[r]), float(top_p[r]),
                             float(log_min_p[r]), int(key0[r]), int(key1[r]), col_offset, shift,
                             0.0 if n_sigma is None else float(n_sigma[r]), vocab_size_global or x.shape[1])
        toks.append(tok + col_offset)
        valid.append(ok)
    return (torch.tensor(toks, dtype=torch.int64, device=x.device),
            torch.tensor(valid, dtype=torch.bool, device=x.device))


def logprob_stats(x, *, temperature=None, threshold=None, n=0, col_offset=0):
    """Reference of kernels.sample.logprob_stats: (max, lse, top_vals [R, n], top_ids [R, n])."""
    l = transform(x, temperature, threshold)
    m = l.max(dim=1).values
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    se = torch.exp((l - m_safe.unsqueeze(1)).double()).sum(dim=1)
    lse = (m_safe.double() + torch.log(se)).float()
    rows, cols = l.shape
    top_v = torch.full((rows, n), NEG_INF, device=x.device)
    top_i = torch.full((rows, n), -1, dtype=torch.int64, device=x.device)
    c = min(n, cols)
    if c:
        v, i = torch.sort(l, dim=1, descending=True, stable=True)   # stable: ties keep lower id first
        top_v[:, :c], top_i[:, :c] = v[:, :c], i[:, :c] + col_offset
    return m, lse, top_v, top_i


def count_greater(x, values, *, temperature=None, threshold=None):
    """[R] int64 count of transformed entries > values (the rank of a token whose value is
    `values` is 1 + it): the reference of the count `kernels.sample.token_logprob_stats` returns."""
    l = transform(x, temperature, threshold)
    return (l > values.to(l.device).float().unsqueeze(1)).sum(dim=1)


def shard_gumbel_argmax(x, temperature, thr, key0, key1, *, col_offset=0):
    """(max over kept of l + g, its global id; -inf and col_offset when nothing is kept)."""
    l = transform(x, temperature)
    kept = (l >= thr.float().unsqueeze(1)) & (l > NEG_INF)
    ids = torch.arange(x.shape[1], dtype=torch.int64, device=l.device) + col_offset
    g = gumbel_from_bits(uniform_bits(key0.to(l.device), key1.to(l.device), ids))
    score = torch.where(kept, l + g, torch.full_like(l, NEG_INF))
    v, i = first_argmax(score)
    return v, i + col_offset
