"""Probe kernels of `tpsample.kernels.tlutil` helpers (and the scan's skip test) for
tests/test_kernels_fast_division.py, tests/test_interpreter_speedup.py,
tests/test_kernels_skip_test.py and tests/test_kernels_mass_search.py, imported inside the
tests, after the interpreter switch (triton.jit picks interpreted or compiled when this module
is imported)."""
import triton
import triton.language as tl

from tpsample.kernels.sample_hist import fast_division_ok
from tpsample.kernels.sample_scan import may_win_fast, win_bound
from tpsample.kernels.tlutil import bisection_steps, claim_slots, div_by, min_key_mass_below, min_key_mass_few


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
