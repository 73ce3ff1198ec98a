"""The per-step kernels (`tpsample.kernels.step_ops`) give the torch versions' results exactly:
row keys bit for bit, and the history append token for token.

Runs the kernels under TRITON_INTERPRET=1 on CPU, or compiled when CUDA is present.
"""
import pytest
import torch

pytest.importorskip("triton")

from tpsample import noise  # noqa: E402
from tpsample.state.history import History  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture(scope="module")
def step_ops(triton_interpreter):
    """Imported here, not at the top: triton.jit picks interpreted or compiled at import."""
    from tpsample.kernels import step_ops
    return step_ops


@pytest.mark.parametrize("salt", [noise.SALT_DRAW, noise.SALT_ACCEPT, noise.SALT_RESIDUAL])
def test_row_keys_kernel_equals_torch_bits(step_ops, salt):
    g = torch.Generator().manual_seed(salt)
    seeds = torch.randint(-2**63, 2**63 - 1, (300,), generator=g, dtype=torch.int64)
    seeds[:3] = torch.tensor([0, -1, noise.seed_to_int64(2**64 - 1)])
    positions = torch.randint(0, 2**40, (300,), generator=g, dtype=torch.int64)
    positions[:2] = torch.tensor([0, 2**33 + 5])
    want = noise.row_keys(seeds, positions, salt)
    got = step_ops.row_keys(seeds.to(DEV), positions.to(DEV), salt)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


def test_append_kernel_equals_torch_append_over_steps(step_ops):
    g = torch.Generator().manual_seed(0)
    a, b = History(), History()
    for h in (a, b):
        for slot in range(6):
            h.reset(slot)
        h.sync(DEV, 6, 64)
    for step in range(5):
        slots = torch.randperm(6, generator=g)[:4].to(DEV)
        width = 1 + step % 3
        tokens = torch.randint(0, 1000, (4, width), generator=g).to(DEV)
        counts = torch.randint(1, width + 1, (4,), generator=g).to(DEV)
        tokens[torch.arange(width, device=DEV).unsqueeze(0) >= counts.unsqueeze(1)] = -1
        block = torch.cat([tokens, counts.unsqueeze(1)], dim=1)      # strided views, as the sampler passes
        a.append(slots, block[:, :width], block[:, width])
        b.append(slots, block[:, :width], block[:, width], kernel=step_ops.append_history)
    assert torch.equal(a.num_out, b.num_out)
    assert torch.equal(a.tokens[:, :-1], b.tokens[:, :-1])        # the scratch column may differ
    assert int(a.num_out.sum()) > 0


def test_mask_nans_kernel_equals_torch_and_counts_per_row(step_ops):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 3000, generator=g)
    x[torch.rand(x.shape, generator=g) < 0.05] = float("nan")
    x[2] = float("nan")
    x[3, :10] = float("inf")
    ref = x.clone()
    ref_counts = torch.isnan(ref).sum(dim=1)
    ref[torch.isnan(ref)] = float("-inf")
    got = x.to(DEV).clone()
    counts = step_ops.mask_nans_(got)
    assert torch.equal(got.cpu(), ref) and torch.equal(counts.cpu(), ref_counts)
    assert int(ref_counts[2]) == 3000
