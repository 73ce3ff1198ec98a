"""The top-p band's shard passes (`kernels.shard_band`) against `topp_band.local_histogram` and
`topp_band.local_partials`, under Triton's interpreter on CPU with several splits a row: the
histogram's main bins bit for bit and its last bin within one fp32 ulp, the partials bit for bit.
The interpreter's exp / log are numpy's, which may differ from torch's CPU ones in the last ulp,
so the torch references run with numpy's exp / log (on a GPU both sides use libdevice's). And
vocab_parallel at TP = 2 over gloo with the kernels on gives the TP = 1 tokens for top-p rows."""
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from tpsample import noise
from tpsample.kernels.launcher import KernelConfig
from tpsample.numerics import mass_shift
from tpsample.sampling.rounds import topp_band as tb

pytestmark = [pytest.mark.usefixtures("triton_interpreter"), pytest.mark.filterwarnings("ignore::RuntimeWarning")]
DEV = "cuda" if torch.cuda.is_available() else "cpu"
CFGS = [KernelConfig(splits=4, block=32), KernelConfig(splits=1, block=64)]


@pytest.fixture(scope="module")
def band(triton_interpreter):
    from tpsample.kernels import shard_band
    return shard_band


@contextmanager
def numpy_exp_log():
    """On CPU, torch.exp / torch.log as numpy's: the functions the interpreter's tl.exp / tl.log
    run (on CUDA torch's and the kernels' are libdevice's already)."""
    if DEV == "cuda":
        yield
        return
    with mock.patch.object(torch, "exp", lambda t: torch.from_numpy(np.exp(t.numpy()))), \
         mock.patch.object(torch, "log", lambda t: torch.from_numpy(np.log(t.numpy()))):
        yield


def band_rows(cols=700):
    """Working rows: peaked, flat (a wide band), with -inf entries, ties, an all -inf row and one
    whose crossing lies further than the grid reaches."""
    g = torch.Generator().manual_seed(5)
    l = torch.randn(7, cols, generator=g) * 3
    l[1] = torch.randn(cols, generator=g) * 0.3                    # flat: many tokens in the band
    l[2, ::3] = float("-inf")
    l[3] = (l[3] * 2).round() / 2                                  # ties
    l[4] = float("-inf")
    l[5] = torch.linspace(0, -40, cols)                            # mass spread far below the grid
    l[6] = -torch.log(torch.arange(1, cols + 1, dtype=torch.float32))   # Zipf-like
    return l.to(DEV)


ROWS = torch.tensor([6, 1, 0, 2, 3, 4, 5], device=DEV)


@pytest.mark.parametrize("cfg", CFGS, ids=["split", "one"])
def test_band_histogram_equals_the_torch_histogram_in_every_main_bin(band, cfg):
    l = band_rows()
    with numpy_exp_log():
        want = tb.local_histogram(l, ROWS)
    got = band.band_histogram(l, ROWS, tb.NUM_BINS, tb.BIN_SCALE, cfg)
    assert torch.equal(got[:, :-1], want[:, :-1])
    assert torch.allclose(got[:, -1], want[:, -1], rtol=2**-23, atol=0)
    assert bool((want[:, -1] > 0).any()) and bool((want[:, :-1] > 0).sum(dim=1).gt(20).any())   # bins were filled


def _brackets(l, rows, top_p, thr, hist, vocab):
    return tb.bracket(l[rows].amax(dim=1).unsqueeze(0), hist.unsqueeze(0), thr, top_p, mass_shift(vocab), vocab)


@pytest.mark.parametrize("cfg", CFGS, ids=["split", "one"])
def test_band_partials_equal_the_torch_partials_bit_for_bit(band, cfg):
    l = band_rows()
    n, vocab, start = ROWS.numel(), 5000, 130
    thr = torch.tensor([float("-inf"), -0.2, float("-inf"), 1.0, float("-inf"), float("-inf"), -3.0], device=DEV)
    top_p = torch.tensor([0.95, 0.9, 0.9, 0.8, 0.9, 0.99, 0.7], device=DEV)
    with numpy_exp_log():
        br = _brackets(l, ROWS, top_p, thr, tb.local_histogram(l, ROWS), vocab)
    seeds, pos = torch.arange(n, device=DEV) * 3 + 1, torch.arange(n, device=DEV) + 11
    with numpy_exp_log():
        want = tb.local_partials(l, None, ROWS, thr, br, seeds, pos, start, mass_shift(vocab), with_counts=True)
    k0, k1 = noise.row_keys(seeds, pos, noise.SALT_DRAW)
    got = band.band_partials(l, ROWS, thr, br.a.float(), br.b.float(), br.sub_scale(), br.m_safe, k0, k1, start,
                             mass_shift(vocab), tb.NUM_SUB, cfg)
    assert set(got) == {"total", "above", "mass", "count", "score", "id", "top"}
    for name, v in got.items():
        assert torch.equal(v.to(want[name].dtype), want[name]), name
    assert int(br.ok.sum()) >= 4 and int(want["count"].gt(0).sum(dim=1).max()) >= 16   # wide bands were tested


def test_band_partials_refuse_a_sub_bin_count_that_is_not_a_power_of_two(band):
    z = torch.zeros(1)
    with pytest.raises(ValueError, match="num_sub must be a power of two, got 24"):
        band.band_partials(torch.zeros(1, 8), torch.zeros(1, dtype=torch.int64), z, z, z, z, z, z.long(), z.long(),
                           0, 40, 24)


VOCAB = 1031
WORKLOADS = {"top_p": dict(temperature=1.0, top_p=0.9), "flat_top_p": dict(temperature=3.0, top_p=0.95),
             "top_p_logprobs": dict(temperature=0.7, top_p=0.8, logprobs=2)}


def _tokens(group):
    """Tokens and the logprob rows' token ids (their values may differ in the interpreter's last
    ulp of exp / log between TP = 1's kernels and the shard path) of each top-p workload over 2
    steps, and how often the band kernels ran."""
    from scenarios import shard_pass_run
    return shard_pass_run(group, VOCAB, WORKLOADS, ("band_histogram", "band_partials"))


@pytest.mark.skipif(DEV == "cuda", reason="gloo ranks on CPU tensors: the interpreter's case")
def test_vocab_parallel_on_the_band_kernels_gives_tp1_tokens_for_top_p_rows(monkeypatch):
    from tpsample.parallel.launch import spawn_ranks
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    want, _ = _tokens(None)
    for rank, (got, calls) in enumerate(spawn_ranks(_tokens, 2, timeout_s=300)):
        assert got == want, f"rank {rank}"
        assert min(calls.get(n, 0) for n in ("band_histogram", "band_partials")) > 0, calls
