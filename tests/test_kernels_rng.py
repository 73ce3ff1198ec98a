"""The Triton noise twin (`tpsample.kernels.tlutil`) gives the bits of `sampling.rng`.

Runs the kernel under TRITON_INTERPRET=1 on CPU, or compiled when CUDA is present.
"""
import pytest
import torch

pytest.importorskip("triton")

from tpsample import noise as rng

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def rng_triton(triton_interpreter):
    """Imported here, not at the top: triton.jit picks interpreted or compiled at import."""
    import tlutil_probes as rng_triton
    return rng_triton


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units in the last place between same-sign fp32 values."""
    return (a.cpu().view(torch.int32).long() - b.cpu().view(torch.int32).long()).abs()


def keys(n: int, salt=rng.SALT_DRAW):
    seeds = torch.arange(n, dtype=torch.int64) * 1_000_003 - 5
    seeds[0] = rng.seed_to_int64(2**64 - 1)
    return rng.row_keys(seeds, torch.arange(n, dtype=torch.int64) * 7 + 2**33, salt)


def test_uniform_bits_identical_to_torch(rng_triton):
    k0, k1 = keys(16)
    ids = torch.cat([torch.arange(2000), torch.tensor([2**31 - 1, 2**32 - 1, 151_935, 10**9])])
    u, _ = rng_triton.probe(k0.to(DEV), k1.to(DEV), ids.to(DEV))
    assert torch.equal(u.cpu(), rng.uniform_bits(k0, k1, ids))


def test_gumbel_matches_torch_to_the_ulp_of_its_log(rng_triton):
    k0, k1 = keys(16)
    ids = torch.arange(4000)
    u, g = rng_triton.probe(k0.to(DEV), k1.to(DEV), ids.to(DEV))
    u = u.cpu()
    ref = rng.gumbel_from_bits(u)
    # g = -log(r), r = -log1p(-W): 1 ulp of r moves g by <= 2**-23 absolute (r >= ~2**-33).
    tol = torch.maximum(ref.abs() * 2**-22, torch.full_like(ref, 2**-22))
    assert bool(((g.cpu() - ref).abs() <= tol).all())
    assert float((g.cpu() == ref).float().mean()) > 0.5   # mostly bit-identical


def test_gumbel_extremes_are_finite_and_ordered(rng_triton):
    k0 = torch.zeros(1, dtype=torch.int64)
    u = torch.cat([torch.arange(64), 2**32 - 1 - torch.arange(64)]).to(torch.int64)
    g = rng_triton.gumbel_probe_bits(u.to(DEV)).cpu()
    ref = rng.gumbel_from_bits(u)
    assert bool(torch.isfinite(g).all())
    assert bool((ulps(g[:64], ref[:64]) <= 1).all())      # the dense end (the winners) is exact
    assert torch.equal(torch.sort(g[:64], descending=True).values, g[:64])
    del k0
