"""The keyed noise (`tpsample.noise`, docs/semantics.md "Noise"), checked statistically.

Every statistical test uses fixed keys (so it is deterministic) and states its level: chi-square
tests reject at alpha = 0.001, correlation tests at |r| * sqrt(n) > 3.29 (two-sided alpha = 0.001),
the tail test at |z| >= 3 (the bound the noise is specified to meet). Everything is vectorised
over keys and token ids.

The Triton twin (`tpsample.kernels.tlutil`) must produce these same bits; that equality is
held by tests/test_kernels_rng.py (GPU or TRITON_INTERPRET), not here.
"""
from __future__ import annotations

import math

import pytest
import reference as ref
import torch

from tpsample.noise import (
    SALT_ACCEPT,
    SALT_DRAW,
    SALT_RESIDUAL,
    W_MAX,
    gumbel_from_bits,
    gumbel_noise,
    row_keys,
    seed_to_int64,
    uniform01,
    uniform_bits,
)

ALPHA = 1e-3
Z_CORR = 3.29           # two-sided normal quantile for alpha = 0.001
NUM_KEY_ROWS = 1000
NUM_TOKENS = 10_000     # 1000 x 10000 = 1e7 draws


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Upper-tail p-value of Pearson's chi-square statistic (df = bins - 1)."""
    observed, expected = observed.double(), expected.double()
    stat = ((observed - expected) ** 2 / expected).sum()
    df = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


def keys(num_rows: int, salt: int = SALT_DRAW, seed_base: int = 0, pos_base: int = 0):
    seeds = torch.arange(num_rows, dtype=torch.int64) * 7919 + seed_base
    positions = torch.arange(num_rows, dtype=torch.int64) % 97 + pos_base
    return row_keys(seeds, positions, salt)


@pytest.fixture(scope="module")
def bits() -> torch.Tensor:
    """1e7 values u: 1000 (seed, position) keys x 10000 token ids, [rows, tokens] int64."""
    k0, k1 = keys(NUM_KEY_ROWS)
    return uniform_bits(k0, k1, torch.arange(NUM_TOKENS))


def test_uniform_bits_are_32_bit_values(bits):
    assert bits.dtype == torch.int64
    assert int(bits.min()) >= 0 and int(bits.max()) < 2**32
    assert int(bits.max()) >= 2**32 - 2**12 and int(bits.min()) < 2**12     # the whole range is used


@pytest.mark.parametrize("field", ["high_10_bits", "middle_10_bits", "low_10_bits"])
def test_uniform_bits_pass_chi_square_on_1e7_draws(bits, field):
    """Each 10-bit field of u is uniform over 1024 bins (chi-square, alpha = 0.001, 1e7 draws).

    The low bits matter: W maps small u to the noise winners, so truncated bits would show here.
    """
    shift = {"high_10_bits": 22, "middle_10_bits": 11, "low_10_bits": 0}[field]
    counts = torch.bincount(((bits >> shift) & 1023).flatten(), minlength=1024)
    expected = torch.full((1024,), bits.numel() / 1024)
    assert chi2_pvalue(counts, expected) > ALPHA


def test_gumbel_tail_frequencies_match_exact_probabilities(bits):
    """P(g > t) = 1 - exp(-exp(-t)) for t in {0, 3, 6, 10}: |z| < 3.29 per t over 1e7 draws.

    t = 10 has probability 4.5e-5 (about 450 hits): it needs the dense small-W end of the map.
    """
    g = gumbel_from_bits(bits)
    n = g.numel()
    for t in (0.0, 3.0, 6.0, 10.0):
        p = -math.expm1(-math.exp(-t))
        hits = int((g > t).sum())
        z = (hits - n * p) / math.sqrt(n * p * (1 - p))
        assert abs(z) < Z_CORR, (t, hits, n * p, z)
    mean = float(g.double().mean())
    euler_gamma = 0.5772156649015329
    assert abs(mean - euler_gamma) < Z_CORR * (math.pi / math.sqrt(6)) / math.sqrt(n)


def test_uniform01_streams_are_uniform():
    """One uniform per (seed, position) row, each salt stream: chi-square over 256 bins, 1e6 rows."""
    rows = 1_000_000
    seeds = torch.arange(rows, dtype=torch.int64) // 100
    positions = torch.arange(rows, dtype=torch.int64) % 100
    for salt in (SALT_ACCEPT, SALT_RESIDUAL):
        u = uniform01(seeds, positions, salt)
        assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
        counts = torch.bincount((u * 256).long(), minlength=256)
        assert chi2_pvalue(counts, torch.full((256,), rows / 256)) > ALPHA


def _u01(k: tuple[torch.Tensor, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    return uniform_bits(k[0], k[1], tokens).double().flatten() / 2**32


@pytest.mark.parametrize("neighbour", ["next_token", "next_position", "next_seed", "seed_high_word",
                                       "accept_salt", "residual_salt"])
def test_noise_is_uncorrelated_across_neighbouring_keys(neighbour):
    """u and its neighbour key's u: |Pearson r| * sqrt(n) < 3.29 (alpha = 0.001), n = 1e6 pairs,
    for raw u and for the Gumbel values (which weight the winning tail)."""
    rows, toks = 1000, torch.arange(1000)
    base_seeds = torch.arange(rows, dtype=torch.int64) * 31
    positions = torch.arange(rows, dtype=torch.int64) * 3
    a_keys = row_keys(base_seeds, positions, SALT_DRAW)
    seeds, pos, salt, other_toks = base_seeds, positions, SALT_DRAW, toks
    if neighbour == "next_token":
        other_toks = toks + 1
    elif neighbour == "next_position":
        pos = positions + 1
    elif neighbour == "next_seed":
        seeds = base_seeds + 1
    elif neighbour == "seed_high_word":
        seeds = base_seeds + (1 << 32)
    else:
        salt = SALT_ACCEPT if neighbour == "accept_salt" else SALT_RESIDUAL
    b_keys = row_keys(seeds, pos, salt)
    a, b = _u01(a_keys, toks), _u01(b_keys, other_toks)
    n = a.numel()
    for x, y in ((a, b), (-torch.log(-torch.log1p(-a.clamp(1e-12, 1 - 1e-12))),
                          -torch.log(-torch.log1p(-b.clamp(1e-12, 1 - 1e-12))))):
        r = float(torch.corrcoef(torch.stack([x, y]))[0, 1])
        assert abs(r) * math.sqrt(n) < Z_CORR, (neighbour, r)


def test_noise_depends_only_on_key_not_on_column_split():
    """Bits for a vocab shard equal the matching columns of the full row, in any token order."""
    k0, k1 = keys(8)
    full = uniform_bits(k0, k1, torch.arange(1000))
    for start, end in ((0, 333), (333, 667), (667, 1000)):
        assert torch.equal(uniform_bits(k0, k1, torch.arange(start, end)), full[:, start:end])
    perm = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(uniform_bits(k0, k1, perm), full[:, perm])
    per_row_ids = torch.stack([torch.roll(torch.arange(1000), r) for r in range(8)])
    assert torch.equal(uniform_bits(k0, k1, per_row_ids), full.gather(1, per_row_ids))


def test_gumbel_noise_matches_float64_reference_on_the_dense_end():
    """The fp32 noise equals the reference's float64 g within 1e-5 wherever W <= 1/2
    (the end where winners live; near W = 1 fp32 rounding of u is coarse and harmless)."""
    seed, pos, vocab = 123456789, 17, 4096
    g32 = gumbel_noise(torch.tensor([seed_to_int64(seed)]), torch.tensor([pos]), torch.arange(vocab))[0]
    g64 = torch.tensor(ref.gumbel64(seed, pos, vocab), dtype=torch.float64)
    dense = g64 > -math.log(math.log(2.0))
    assert int(dense.sum()) > vocab // 3
    assert torch.allclose(g32.double()[dense], g64[dense], atol=1e-5, rtol=0)
    assert float((g32.double() - g64).abs().max()) < 0.05


def test_gumbel_is_finite_and_monotone_at_32_bit_extremes():
    extremes = torch.tensor([0, 1, 2, 2**24, 2**31, 2**32 - 2**8, 2**32 - 2, 2**32 - 1], dtype=torch.int64)
    g = gumbel_from_bits(extremes)
    assert g.dtype == torch.float32 and bool(torch.isfinite(g).all())
    assert bool((g[:-1] >= g[1:]).all())                         # larger u, smaller noise
    assert float(g[0]) == pytest.approx(-math.log(-math.log1p(-2.0**-33)), rel=1e-6)   # about 22.9
    assert float(g[-1]) == pytest.approx(-math.log(-math.log1p(-W_MAX)), rel=1e-5)     # W capped < 1
    for u in (0, 2**32 - 1):
        w = min((u + 0.5) * 2.0**-32, W_MAX)
        assert math.isfinite(-math.log(-math.log1p(-w)))            # the reference's formula too


def test_gumbel_is_strictly_decreasing_where_the_winner_lives():
    """Every one of the smallest 2**16 values of u gives a distinct noise value (no truncation)."""
    g = gumbel_from_bits(torch.arange(2**16, dtype=torch.int64))
    assert bool((g[:-1] > g[1:]).all())


def test_gumbel_max_hits_the_exact_tail_mass_of_a_long_tailed_row():
    """Tail test: Gumbel-max over a Zipf row (V = 1024, s = 1.1) for 1e5 (seed, pos) keys.

    The frequency of the top 1% of tokens (and of the top 10% and of the bottom half, the long
    tail) matches the exact softmax mass: |z| < 3 for each.
    """
    vocab, draws, chunk = 1024, 100_000, 1000
    logits = -1.1 * torch.log1p(torch.arange(vocab, dtype=torch.float32))
    probs = torch.softmax(logits.double(), dim=0)
    ids = torch.arange(vocab)
    winners = torch.empty(draws, dtype=torch.int64)
    for s in range(0, draws, chunk):
        key = torch.arange(s, s + chunk, dtype=torch.int64)
        g = gumbel_noise(key * 1_000_003 + 11, key % 4099, ids)      # [chunk, vocab]
        winners[s:s + chunk] = g.add_(logits).argmax(dim=1)
    for name, lo, hi in (("top 1%", 0, vocab // 100), ("top 10%", 0, vocab // 10),
                         ("bottom half", vocab // 2, vocab)):
        p = float(probs[lo:hi].sum())
        hits = int(((winners >= lo) & (winners < hi)).sum())
        z = (hits - draws * p) / math.sqrt(draws * p * (1 - p))
        assert abs(z) < 3, (name, hits, draws * p, z)
