"""Counter-based noise keyed by (request seed, position, global token id).

Contract:
- `row_keys(seeds, positions, salt)` mixes a request seed and an absolute position into two
  32-bit row keys (returned as int64 holding values in [0, 2**32)). It runs once per row.
- `uniform_bits(key0, key1, token_ids)` gives the full 32-bit value u for each (row, token).
  Same bits on every device: the torch version here uses int64 arithmetic masked to 32 bits
  (multiplications split in 16-bit halves so nothing overflows), the Triton twin in
  `tpsample.kernels.tlutil` uses native uint32 arithmetic.
- `gumbel_from_bits(u)` maps u to W = (u + 1/2) / 2**32 in fp32, which is dense near 0 where the
  Gumbel winner lives (W small means g large), and returns g = -log(-log1p(-W)) in fp32 (log1p via Goldberg's identity, see
  `neg_log1p_neg`, so the Triton twin computes the same formula).
  W is capped at 1 - 2**-24 so g is always finite.
- Streams are separated by salts: the draw, the spec-decode accept test, the residual draw and
  XTC's coin never share bits.

The noise never depends on the batch layout, the rank or the TP size: only on the key.
"""
from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
SALT_DRAW = 0x5EED0001
SALT_ACCEPT = 0x5EED0002
SALT_RESIDUAL = 0x5EED0003
SALT_XTC = 0x5EED0004            # XTC's per-(request, position) coin
GOLDEN = 0x9E3779B1
ROW_KEY1_SALT = 0x68E31DA4
W_MAX = 1.0 - 2.0**-24


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32) without int64 overflow."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """Murmur3's 32-bit finaliser: a bijection on [0, 2**32) with full avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit row keys per row.

    seeds: [rows] int64 holding a seed mod 2**64 reinterpreted as signed; positions: [rows] int64.
    Returns (key0, key1), each [rows] int64 in [0, 2**32).
    """
    seeds = seeds.to(torch.int64)
    positions = positions.to(torch.int64)
    seed_lo = seeds & MASK32
    seed_hi = (seeds >> 32) & MASK32
    h = fmix32(seed_lo ^ (salt & MASK32))
    h = fmix32(h ^ seed_hi)
    h = fmix32(h ^ (positions & MASK32))
    key0 = fmix32(h ^ ((positions >> 32) & MASK32))
    key1 = fmix32(key0 ^ ROW_KEY1_SALT)
    return key0, key1


def uniform_bits(key0: torch.Tensor, key1: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """u in [0, 2**32) as int64 for each (row, token).

    key0, key1: [rows] int64; token_ids: [cols] or [rows, cols] int64 global token ids.
    Returns [rows, cols] int64.
    """
    if token_ids.dim() == 1:
        token_ids = token_ids.unsqueeze(0)
    t = _mul32(token_ids.to(torch.int64) & MASK32, GOLDEN)
    x = fmix32(key0.unsqueeze(1) ^ t)
    return fmix32(x ^ key1.unsqueeze(1))


def gumbel_from_bits(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise in fp32 from 32-bit values (int64 tensor in [0, 2**32))."""
    w = (u.to(torch.float32) + 0.5) * (2.0**-32)
    w = torch.clamp(w, max=W_MAX)
    return -torch.log(neg_log1p_neg(w))


def neg_log1p_neg(w: torch.Tensor) -> torch.Tensor:
    """-log1p(-w) for w in (0, 1), accurate for tiny w, from log alone.

    Goldberg's identity log1p(x) = x * log(1 + x) / ((1 + x) - 1) cancels the rounding of 1 + x;
    it needs only `log`, which Triton (and its CPU interpreter) has, so both paths share it.
    """
    y = 1.0 - w
    d = 1.0 - y
    safe = torch.where(d == 0, torch.ones_like(d), d)
    return torch.where(d == 0, w, -torch.log(y) * (w / safe))


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, token_ids: torch.Tensor,
                 salt: int = SALT_DRAW) -> torch.Tensor:
    """g(seed, pos, id) for rows x token ids: [rows, cols] fp32."""
    key0, key1 = row_keys(seeds, positions, salt)
    return gumbel_from_bits(uniform_bits(key0, key1, token_ids.to(key0.device)))


def uniform01(seeds: torch.Tensor, positions: torch.Tensor, salt: int) -> torch.Tensor:
    """One uniform in [0, 1) per row, fp64, keyed by (seed, position) on the given salt stream."""
    key0, key1 = row_keys(seeds, positions, salt)
    zero = torch.zeros(1, dtype=torch.int64, device=key0.device)
    u = uniform_bits(key0, key1, zero)[:, 0]
    return u.to(torch.float64) * (2.0**-32)


def seed_to_int64(seed: int) -> int:
    """A seed mod 2**64 as a signed int64 value for tensor storage."""
    s = seed % (1 << 64)
    return s - (1 << 64) if s >= (1 << 63) else s
