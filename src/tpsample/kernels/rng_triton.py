"""Triton twin of `tpsample.noise`: the same noise bits, computed in uint32.

Contract: for key0/key1 (uint32) and global token ids, `uniform_bits` returns exactly the u of
`rng.uniform_bits` (native uint32 arithmetic wraps mod 2**32, which is what the torch version
emulates with 16-bit halves), and `gumbel_from_bits` evaluates the same fp32 formula
g = -log(-log1p(-W)), W = min((u + 1/2) * 2**-32, 1 - 2**-24), with log1p by Goldberg's identity
and IEEE round-to-nearest divisions (`tl.div_rn`, never the approximate `/`).

Bits: u is identical everywhere. g is identical wherever `log` is: on NVIDIA GPUs `tl.log`
lowers to libdevice `__nv_logf`, the same routine torch's CUDA `log` calls; the CPU paths
(torch on CPU, the Triton interpreter's numpy) may differ from it in the last ulp.
Only core `tl` ops are used here, so the interpreter (`TRITON_INTERPRET=1`) runs it.
"""
import triton
import triton.language as tl

GOLDEN = tl.constexpr(0x9E3779B1)
W_MAX = tl.constexpr(0.99999994039535522)  # 1 - 2**-24, exact in fp32
TWO_POW_M32 = tl.constexpr(2.3283064365386963e-10)  # 2**-32, exact in fp32


@triton.jit
def fmix32(x):
    """Murmur3's 32-bit finaliser on uint32 (multiplications wrap mod 2**32)."""
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def uniform_bits(key0, key1, token_ids):
    """u (uint32) for row keys key0, key1 (uint32) and global token ids (any int type)."""
    return uniform_bits_spread(key0, key1, token_ids.to(tl.uint32) * GOLDEN)


@triton.jit
def uniform_bits_spread(key0, key1, spread):
    """`uniform_bits` given spread = token id * GOLDEN (uint32, mod 2**32): a streaming pass
    forms it as (step's first id) * GOLDEN + (lane offset * GOLDEN, loop-invariant), one add
    an entry, since the product distributes over the sum mod 2**32."""
    x = fmix32(key0 ^ spread)
    return fmix32(x ^ key1)


@triton.jit
def neg_log1p_neg(w):
    """-log1p(-w) for w in (0, 1): Goldberg's identity, exactly as `rng.neg_log1p_neg`."""
    y = 1.0 - w
    d = 1.0 - y
    safe = tl.where(d == 0.0, 1.0, d)
    return tl.where(d == 0.0, w, -tl.log(y) * tl.div_rn(w, safe))


@triton.jit
def gumbel_from_bits(u):
    """Standard Gumbel noise (fp32) from uint32 bits, the formula of `rng.gumbel_from_bits`."""
    w = (u.to(tl.float32) + 0.5) * TWO_POW_M32
    w = tl.minimum(w, W_MAX)
    return -tl.log(neg_log1p_neg(w))


@triton.jit
def gumbel(key0, key1, token_ids):
    """g(key, id): the draw noise for global token ids."""
    return gumbel_from_bits(uniform_bits(key0, key1, token_ids))


@triton.jit
def _rng_probe_kernel(key0_ptr, key1_ptr, ids_ptr, u_ptr, g_ptr, num_ids, BLOCK: tl.constexpr):
    """Test hook: u and g for row `program_id(0)` and num_ids token ids ([rows, num_ids] out)."""
    row = tl.program_id(0)
    k0 = tl.load(key0_ptr + row).to(tl.uint32)
    k1 = tl.load(key1_ptr + row).to(tl.uint32)
    for start in range(0, num_ids, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < num_ids
        ids = tl.load(ids_ptr + offs, mask=mask, other=0)
        u = uniform_bits(k0, k1, ids)
        tl.store(u_ptr + row * num_ids + offs, u.to(tl.int64), mask=mask)
        tl.store(g_ptr + row * num_ids + offs, gumbel_from_bits(u), mask=mask)


def probe(key0, key1, token_ids):
    """(u [rows, n] int64, g [rows, n] fp32) computed by the Triton twin (test helper)."""
    import torch
    rows, n = key0.shape[0], token_ids.shape[0]
    u = torch.empty((rows, n), dtype=torch.int64, device=key0.device)
    g = torch.empty((rows, n), dtype=torch.float32, device=key0.device)
    _rng_probe_kernel[(rows,)](key0, key1, token_ids.to(torch.int64), u, g, n, BLOCK=256)
    return u, g


@triton.jit
def _gumbel_bits_kernel(u_ptr, g_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    u = tl.load(u_ptr + offs, mask=offs < n, other=0).to(tl.uint32)
    tl.store(g_ptr + offs, gumbel_from_bits(u), mask=offs < n)


def gumbel_probe_bits(u):
    """g for given 32-bit values u (int64 tensor), computed by the Triton twin (test helper)."""
    import torch
    g = torch.empty(u.shape, dtype=torch.float32, device=u.device)
    _gumbel_bits_kernel[(triton.cdiv(u.numel(), 256),)](u, g, u.numel(), BLOCK=256)
    return g
