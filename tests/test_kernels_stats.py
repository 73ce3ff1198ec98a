"""Logprob statistics and the vocab-parallel Gumbel partial of `kernels.sample` match the
reference: counts, ids and Gumbel winners exactly, log-sum-exps to 1e-5."""
import pytest
import torch

pytest.importorskip("triton")

import kernels_torch_ref as torch_ref

from tpsample import noise as rng
from tpsample.kernels import sample as dispatch
from tpsample.kernels.sample import KernelConfig

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.usefixtures("triton_interpreter"), pytest.mark.filterwarnings("ignore::RuntimeWarning")]
V_GLOBAL = 151_936
SPLIT = KernelConfig(splits=4, block=32)


def rows(gen, r=5, v=300):
    x = torch.randn(r, v, generator=gen) * 3
    x[1] = (x[1] * 2).round() / 2                       # ties
    x[2, ::2] = float("nan")
    x[2, 5], x[2, 7] = -0.0, 0.0
    x[3] = float("-inf")
    x[4, 7] = float("inf")
    return x


def d(t):
    return None if t is None else t.to(DEV)


@pytest.mark.parametrize("cfg", [KernelConfig(), SPLIT], ids=["one", "split"])
@pytest.mark.parametrize("transform", ["raw", "temperature", "processed"])
def test_logprob_stats_and_counts_match_reference(cfg, transform):
    gen = torch.Generator().manual_seed(0)
    x = rows(gen)
    t = torch.tensor([0.7, 0.0, 1.3, 1.0, 1.0]) if transform != "raw" else None
    thr = torch.tensor([1.0, -1.0, 0.0, 0.0, 2.0]) if transform == "processed" else None
    got = dispatch.logprob_stats(x.to(DEV), temperature=d(t), threshold=d(thr), n=5, col_offset=3, cfg=cfg)
    want = torch_ref.logprob_stats(x, temperature=t, threshold=thr, n=5, col_offset=3)
    assert torch.equal(got[0].cpu(), want[0])
    assert torch.allclose(got[1].cpu(), want[1], atol=1e-5, rtol=1e-6, equal_nan=True)
    assert torch.equal(got[2].cpu(), want[2]) and torch.equal(got[3].cpu(), want[3])
    if transform == "raw":             # the sampled-token form: the count above a value (its rank - 1)
        values = want[2][:, 2]
        lse, tv, ti, count = dispatch.token_logprob_stats(x.to(DEV), values.to(DEV), 5, col_offset=3, cfg=cfg)
        assert torch.equal(count.cpu(), torch_ref.count_greater(x, values))
        assert torch.equal(ti.cpu(), want[3]) and torch.allclose(lse.cpu(), want[1], atol=1e-5, rtol=1e-6,
                                                                  equal_nan=True)
        # the token form: the kernel reads the value at each row's global token id (NaN as -inf)
        tokens = torch.tensor([3 + x.shape[1] - 1, 4, 3, 10, 3 + 7])             # row 2: a NaN, row 4: +inf
        vals = torch.nan_to_num(x.gather(1, (tokens - 3).unsqueeze(1)).squeeze(1), nan=float("-inf"),
                                posinf=float("inf"), neginf=float("-inf"))
        *_, count_t = dispatch.token_logprob_stats(x.to(DEV), None, 5, col_offset=3, cfg=cfg, tokens=tokens.to(DEV))
        assert torch.equal(count_t.cpu(), torch_ref.count_greater(x, vals))


def test_top_n_longer_than_the_row_pads_with_minus_one():
    x = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, float("-inf")]])
    _, _, v, i = dispatch.logprob_stats(x.to(DEV), n=4)
    assert i.cpu().tolist() == [[1, 2, 0, -1], [0, 1, 2, -1]]
    assert v.cpu()[0, :3].tolist() == [3.0, 2.0, 1.0]


@pytest.mark.parametrize("cfg", [KernelConfig(), SPLIT], ids=["one", "split"])
def test_shard_gumbel_winner_matches_reference(cfg):
    gen = torch.Generator().manual_seed(1)
    x = rows(gen)[:4]
    t = torch.tensor([0.7, 0.0, 1.3, 1.0])
    thr = torch.tensor([1.0, float("-inf"), 0.0, 2.0])
    x, t, thr = x.to(DEV), t.to(DEV), thr.to(DEV)             # the reference on the same device
    k0, k1 = rng.row_keys(torch.arange(4), torch.arange(4) + 9, rng.SALT_DRAW)
    gv, gi = dispatch.shard_gumbel_argmax(x, t, thr, k0.to(DEV), k1.to(DEV), col_offset=5, cfg=cfg)
    wv, wi = torch_ref.shard_gumbel_argmax(x, t, thr, k0.to(DEV), k1.to(DEV), col_offset=5)
    assert torch.equal(gi, wi)
    assert torch.allclose(gv, wv, rtol=1e-6)
