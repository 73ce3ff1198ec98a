"""The hist pass's division without a division (`tlutil.div_by`: x * (1 / T) and two FMAs) is
IEEE x / T bit for bit wherever `sample_hist.fast_division_ok` lets a row use it, and the
rows it refuses are those whose extreme entries could tell the two apart; and the bisections
of the top-k / top-p thresholds take as many steps as their interval needs.

The bit-for-bit check needs compiled code (FMA and the GPU's rounding): CUDA only. The guard's
bounds are checked anywhere, through the interpreter."""
import pytest
import torch

triton = pytest.importorskip("triton")

pytestmark = pytest.mark.usefixtures("triton_interpreter")
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def kernels(triton_interpreter):
    """Imported here, not at the top: triton.jit picks interpreted or compiled at import."""
    import tlutil_probes
    return tlutil_probes.divide, tlutil_probes.guard


def _patterns(n, gen):
    """Random fp32 bit patterns with 2**-100 <= |x| <= 2**100, and edge values of that range."""
    lo, hi = 0x0D800000, 0x71800000        # the bits of 2**-100 and 2**100
    bits = torch.randint(lo, hi + 1, (n,), generator=gen, dtype=torch.int64)
    bits |= torch.randint(0, 2, (n,), generator=gen, dtype=torch.int64) << 31
    x = bits.to(torch.int32).view(torch.float32)
    edges = torch.tensor([2.0 ** -100, 2.0 ** 100, 1.0, -1.0, 0.0, -0.0, 3.0, 1.0 - 2 ** -24, 1.0 + 2 ** -23,
                          16777215.0, 16777217.0, -2.0 ** -100, 7.0e-31, 1.2e30])
    return torch.cat([x, edges])


@pytest.mark.skipif(not CUDA, reason="bit-for-bit FMA rounding needs compiled CUDA code")
@pytest.mark.parametrize("t", [2.0 ** -20, 1e-3, 0.3, 0.7, 0.8, 1.0, 1.0 - 2 ** -24, 1.3, 1.9999999, 3.0, 7.77,
                               1e3, 2.0 ** 20, 0.1, 1.1])
def test_the_division_without_a_division_is_ieee_division_in_its_range(kernels, t):
    divide, _ = kernels
    gen = torch.Generator().manual_seed(int(t * 1e6) % 100003)
    x = _patterns(1 << 22, gen).cuda()
    got = torch.empty_like(x)
    divide[(triton.cdiv(x.numel(), 1024),)](x, got, x.numel(), t, BLOCK=1024)
    want = x / torch.tensor(t, dtype=torch.float32, device="cuda")
    bad = (got.view(torch.int32) != want.view(torch.int32)) & ~((got == 0) & (want == 0))
    assert int(bad.sum()) == 0, (t, x[bad][:5].tolist(), got[bad][:5].tolist(), want[bad][:5].tolist())


def test_the_fast_division_is_refused_where_extreme_entries_could_differ(kernels):
    _, guard = kernels
    ninf = float("-inf")
    cases = [  # (T, row max m, min-p's t_lo, allowed)
        (0.8, 17.0, ninf, True), (1.0, -3.5, -5.0, True), (2.0 ** -20, 1e12, ninf, True),
        (2.0 ** 20, 1e-10, ninf, True), (0.8, 2.0 ** 78, ninf, True), (0.8, -(2.0 ** -50), ninf, True),
        (2.0 ** -21, 17.0, ninf, False), (2.0 ** 21, 17.0, ninf, False), (1e-6 / 2, 17.0, ninf, False),
        (0.8, 0.0, ninf, False), (0.8, 2.0 ** -51, ninf, False), (0.8, 2.0 ** 79, ninf, False),
        (0.8, -1e36, ninf, False), (0.8, 1e-30, ninf, False), (0.8, 17.0, 1e-30, False),
        (0.8, 17.0, 0.0, False), (0.8, 3.0, 2.0 ** -70, True), (0.8, 3.0, -(2.0 ** -71), False),
    ]
    dev = torch.device("cuda" if CUDA else "cpu")
    t, m, tlo = (torch.tensor([c[i] for c in cases], dtype=torch.float32, device=dev) for i in range(3))
    out = torch.empty(len(cases), dtype=torch.int32, device=dev)
    guard[(len(cases),)](t, m, tlo, out)
    assert [bool(v) for v in out.tolist()] == [c[3] for c in cases]


def test_a_bisection_takes_the_bit_length_of_its_interval_in_steps(triton_interpreter):
    """`tlutil.bisection_steps`: the top-k and top-p bisections stop once their interval is one
    key wide, instead of always taking the whole key range's 33 steps."""
    import tlutil_probes
    dev = torch.device("cuda" if CUDA else "cpu")
    d = [1, 2, 3, 4, 5, 7, 8, 255, 256, 31000, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 1, 0, -5]
    want = [v.bit_length() if v >= 1 else 33 for v in d]
    out = torch.empty(len(d), dtype=torch.int32, device=dev)
    tlutil_probes.steps_of[(1,)](torch.tensor(d, dtype=torch.int64, device=dev), out, len(d))
    assert out.tolist() == want
