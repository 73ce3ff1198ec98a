"""Probe kernels of `tpsample.kernels` device helpers (`tlutil`, the noise twin included, the
key searches and the scan's skip test) for tests/test_kernels_fast_division.py,
tests/test_interpreter_speedup.py, tests/test_kernels_skip_test.py,
tests/test_kernels_mass_search.py and tests/test_kernels_rng.py, imported inside the tests, after
the interpreter switch (triton.jit picks interpreted or compiled when this module is imported)."""
import torch
import triton
import triton.language as tl

from tpsample.kernels.sample.lists import fast_division_ok
from tpsample.kernels.sample.scan import may_win_fast, win_bound
from tpsample.kernels.tlutil import (
    bisection_steps,
    claim_slots,
    div_by,
    gumbel_from_bits,
    min_key_mass_below,
    min_key_mass_few,
    uniform_bits,
)


@triton.jit
def divide(x_ptr, out_ptr, n, t, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, div_by(x, t, tl.div_rn(1.0, t)), mask=offs < n)


@triton.jit
def guard(t_ptr, m_ptr, tlo_ptr, out_ptr):
    i = tl.program_id(0)
    ok = fast_division_ok(tl.load(t_ptr + i), tl.load(m_ptr + i), tl.load(tlo_ptr + i))
    tl.store(out_ptr + i, ok.to(tl.int32))


@triton.jit
def steps_of(d_ptr, out_ptr, n):
    for i in range(n):       # one scalar at a time, as the bisections use it
        tl.store(out_ptr + i, bisection_steps(tl.load(d_ptr + i)))


@triton.jit
def claims(sel_ptr, line_ptr, slot_ptr, n, LG: tl.constexpr, GROUP_WORDS: tl.constexpr, BLOCK: tl.constexpr):
    """claim_slots over n selection flags, one block of BLOCK per program: the slots and the counters."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    sel = tl.load(sel_ptr + offs, mask=offs < n, other=0)
    tl.store(slot_ptr + offs, claim_slots(line_ptr, sel, LG, GROUP_WORDS), mask=offs < n)


@triton.jit
def skip_test(la_ptr, u_ptr, best_ptr, out_ptr, n, PTX: tl.constexpr, BLOCK: tl.constexpr):
    """may_win_fast(la, u, win_bound(best)) elementwise (u as int64 holding a uint32)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    la = tl.load(la_ptr + offs, mask=m, other=0.0)
    u = tl.load(u_ptr + offs, mask=m, other=0).to(tl.uint32)
    ok = may_win_fast(la, u, win_bound(tl.load(best_ptr + offs, mask=m, other=0.0)), PTX)
    tl.store(out_ptr + offs, ok.to(tl.int32), mask=m)


@triton.jit
def mass_searches(keys_ptr, e_ptr, args_ptr, target_ptr, out_ptr, scratch_ptr, N: tl.constexpr, FEW: tl.constexpr,
                  PTX: tl.constexpr):
    """Case program_id(0): kappa by `min_key_mass_below` and by `min_key_mass_few` (keys and e
    int64 [N] a case, -1 / 0 where absent; args (base, lo, hi) int64; target float64)."""
    c = tl.program_id(0)
    idx = tl.arange(0, N)
    keys = tl.load(keys_ptr + c * N + idx)
    e = tl.load(e_ptr + c * N + idx)
    base = tl.load(args_ptr + c * 3)
    lo = tl.load(args_ptr + c * 3 + 1)
    hi = tl.load(args_ptr + c * 3 + 2)
    target = tl.load(target_ptr + c)
    tl.store(out_ptr + c * 2, min_key_mass_below(keys, e, base, target, lo, hi))
    n_lo = tl.sum((keys > lo).to(tl.int32), axis=0)
    tl.store(out_ptr + c * 2 + 1, min_key_mass_few(keys, e, base, target, lo, hi, n_lo,
                                                   scratch_ptr + c * (2 * FEW + 1), FEW, PTX))


@triton.jit
def _rng_probe_kernel(key0_ptr, key1_ptr, ids_ptr, u_ptr, g_ptr, num_ids, BLOCK: tl.constexpr):
    """u and g for row `program_id(0)` and num_ids token ids ([rows, num_ids] out)."""
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
    """(u [rows, n] int64, g [rows, n] fp32) computed by the Triton twin of the noise."""
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
    """g for given 32-bit values u (int64 tensor), computed by the Triton twin of the noise."""
    g = torch.empty(u.shape, dtype=torch.float32, device=u.device)
    _gumbel_bits_kernel[(triton.cdiv(u.numel(), 256),)](u, g, u.numel(), BLOCK=256)
    return g
