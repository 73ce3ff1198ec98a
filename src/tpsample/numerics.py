"""Shared numerics: the -inf sentinel, fixed-point masses, order keys of fp32, powers of two; the
model dtypes by name and the release of cached device memory, which every layer above may use.

A leaf module: the sampling pipeline, the vocab-parallel reductions and the kernels' torch twin
all use these definitions, so a threshold computed by any of them is the same number.

- Masses (top-p): e_i = trunc(exp(l_i - m) * 2**shift) as int64, with exp(0) taken as exactly 1
  and shift = 62 - max(1, ceil(log2 V)), so a sum of V masses <= 1 fits in int64 with headroom.
  Integer sums are order-independent: any split of a row gives the same totals.
- Order keys: an order-preserving map of fp32 to [0, 2**32) as int64 (larger float, larger key),
  -0.0 keyed as +0.0 so key order is exactly value order.
"""
from __future__ import annotations

import gc
import math

import torch

NEG_INF = float("-inf")
ROW_CHUNK_ELEMS = 1 << 17         # bound on [rows, cols] temporaries on CPU (~3 MiB at 22 B each)
ROW_CHUNK_ELEMS_CUDA = 1 << 20    # GPUs want fewer, larger launches (4 MiB per fp32 temporary)
# the model's weight and activation dtypes by name (the CLI's --dtype offers the first names)
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
DTYPE_NAMES = tuple(dict.fromkeys(str(d).removeprefix("torch.") for d in DTYPES.values()))  # float32, ...
# per element of a row chunk: noise bits (int64), noise (fp32), masses (int64), masks (bool),
# int64 hashing intermediates
CHUNK_BYTES_PER_ELEM = 8 + 4 + 8 + 2 + 16


def row_chunks(num_rows: int, cols: int, device=None):
    """Row ranges whose [rows, cols] temporaries stay under the device's chunk size."""
    limit = ROW_CHUNK_ELEMS_CUDA if device is not None and torch.device(device).type == "cuda" else ROW_CHUNK_ELEMS
    step = max(1, limit // max(cols, 1))
    for s in range(0, num_rows, step):
        yield s, min(num_rows, s + step)


def note_memory(meter, front) -> None:
    """Count a step's working row (when a copy), raw-logprob rows and largest chunk temporaries
    (`front`: the torch backend's `Front`) in the memory meter, if any."""
    if meter is not None:
        l, raw = front.l, front.raw
        chunk = min(l.numel(), ROW_CHUNK_ELEMS) * CHUNK_BYTES_PER_ELEM
        meter.note((l.numel() * 4 if front.copy else 0) + (raw[1].numel() * 4 if raw is not None else 0) + chunk)


def release_device_memory() -> None:
    """Collect what reference cycles still hold, then hand the allocator's cached blocks back to
    the driver (a next engine sizes its KV cache from the driver's free memory; a next benchmark
    starts from the same free memory)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), for host ints (launch shapes, padded sizes)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def mass_shift(vocab_size: int) -> int:
    """Fixed-point bits so that a sum of vocab_size masses <= 1 fits in int64 with headroom."""
    return 62 - max(1, math.ceil(math.log2(max(vocab_size, 1))))


def sigma_bits(vocab_size: int) -> int:
    """B of top-n-sigma's grid (sampling/top_n_sigma.py): V values below 2**B have a sum of
    squares below 2**62."""
    return mass_shift(vocab_size) // 2


def fixed_point_masses(l: torch.Tensor, m: torch.Tensor, shift: int) -> torch.Tensor:
    """e = trunc(exp(l - m) * 2**shift) as int64 per entry of rows l, m the row max [rows]."""
    d = l - m.unsqueeze(-1)
    e = torch.where(l == m.unsqueeze(-1), torch.ones_like(d), torch.exp(d))
    return (e * float(2**shift)).to(torch.int64)


def temperature_divisor(temperature: torch.Tensor, device) -> torch.Tensor:
    """[rows] what step 6 divides each row by: T, or 1 for greedy rows (T == 0)."""
    t = temperature.to(device)
    return torch.where(t == 0, torch.ones_like(t), t)


def kept_mask(l: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
    """Entries a filter keeps: l >= thr (per row) and l > -inf."""
    return (l >= thr.unsqueeze(1)) & (l > NEG_INF)


def order_key(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving map of fp32 to [0, 2**32) as int64; -0.0 keyed as +0.0."""
    bits = (x.float() + 0.0).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    neg = bits >= 0x80000000
    return torch.where(neg, (~bits) & 0xFFFFFFFF, bits ^ 0x80000000)


def key_to_float(key: torch.Tensor) -> torch.Tensor:
    """The fp32 value of an order key (inverse of `order_key`, +0.0 for the zero key)."""
    neg = key < 0x80000000
    bits = torch.where(neg, (~key) & 0xFFFFFFFF, key ^ 0x80000000)
    bits = torch.where(bits >= 0x80000000, bits - (1 << 32), bits)
    return bits.to(torch.int32).view(torch.float32)
