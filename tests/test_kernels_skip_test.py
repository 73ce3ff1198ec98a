"""The temperature-only scan's skip test (`sample_scan.may_win_fast`, the margin taken once a
step) never rejects an entry that can reach the best so far: for noise bits u and a best value b,
an entry whose fp32(l + g(u)) >= b passes for every la within 3 ulp of l (la = x * (1 / T) stands
for l = x / T), at magnitudes from 1e-3 to 2e4; and it rejects almost every entry that cannot
win, or the scan would compute the noise everywhere. Compiled PTX (ex2.approx) on CUDA, the
interpreter's exp2 elsewhere."""
import math

import pytest
import torch

pytest.importorskip("triton")

from tpsample import noise as rng

pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]   # numpy's inf - inf for a best of +inf
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def probes():
    import tlutil_probes
    return tlutil_probes


def passes(probes, la, u, best):
    n = la.numel()
    out = torch.empty(n, dtype=torch.int32, device=DEV)
    probes.skip_test[(math.ceil(n / 1024),)](la.to(DEV), u.to(DEV), best.to(DEV), out, n,
                                             PTX=DEV == "cuda", BLOCK=1024)
    return out.cpu().bool()


def ulps(x, k):
    """x moved by k fp32 ulps (k may be negative)."""
    step = torch.full_like(x, math.inf if k > 0 else -math.inf)
    for _ in range(abs(k)):
        x = torch.nextafter(x, step)
    return x


def test_an_entry_that_reaches_the_best_so_far_always_passes(probes):
    gen = torch.Generator().manual_seed(5)
    n = 4096
    u = torch.randint(0, 2**32, (n,), generator=gen, dtype=torch.int64)
    g = rng.gumbel_from_bits(u)                                     # fp32, as the kernels compute it
    best = torch.tensor([-2e4, -317.25, -12.5, -1e-3, 0.0, 1e-3, 2.75, 17.3, 96.0, 2e4])
    best = best.repeat_interleave(n // best.numel() + 1)[:n].float()
    l = best - g                                                    # then up to the first l with l + g >= b
    for _ in range(4):
        l = torch.where(l + g < best, torch.nextafter(l, torch.full_like(l, math.inf)), l)
    assert bool(((l + g) >= best).all())
    for k in (-3, -1, 0, 1, 3):
        assert bool(passes(probes, ulps(l, k), u, best).all()), k


def test_it_rejects_almost_every_entry_that_cannot_win(probes):
    gen = torch.Generator().manual_seed(6)
    n = 1 << 16
    u = torch.randint(0, 2**32, (n,), generator=gen, dtype=torch.int64)
    best = torch.full((n,), 18.0)
    l = 18.0 - 5.0 - 25.0 * torch.rand(n, generator=gen)          # 5 to 30 below the best
    got = passes(probes, l, u, best)
    g = rng.gumbel_from_bits(u)
    assert not bool(((l + g) >= best)[~got].any())
    assert got.float().mean() < 0.01                                # exp(-5) of W's range at most


def test_special_values_pass_or_fail_as_the_scan_needs(probes):
    u = torch.tensor([12345, 2**31, 2**32 - 1, 7], dtype=torch.int64)
    inf, nan = math.inf, math.nan
    # NaN never passes; +inf always does; nothing found yet (-inf) lets every finite entry pass;
    # a best of +inf (an earlier column) lets nothing pass
    assert passes(probes, torch.tensor([nan, inf, 3.0, -1e30]), u, torch.tensor([0.0, 5.0, -inf, -inf])).tolist() \
        == [False, True, True, True]
    assert passes(probes, torch.tensor([1e30, 3.0, -2.0, inf]), u, torch.full((4,), inf)).tolist() == [False] * 4
