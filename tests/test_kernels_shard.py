"""The vocab-parallel shard passes (`kernels.shard`) against the torch functions whose contracts
they take, under Triton's interpreter on CPU: the same outputs bit for bit (Gumbel values to the
last ulp of `log`, see docs/kernels.md), on shards with ties, NaN, -inf rows, +inf, signed zeros,
a column start past 0 and bf16 input (on a GPU: the compiled kernels on CUDA tensors against the
torch functions on CPU); and, on CPU, vocab_parallel at TP = 2 over gloo with the kernels on gives
the TP = 1 tokens."""
import pytest
import torch

pytest.importorskip("triton")

from tpsample import noise
from tpsample.kernels.launcher import KernelConfig
from tpsample.numerics import row_chunks
from tpsample.sampling import processors as P
from tpsample.sampling.draw import local_argmax, local_gumbel_draw
from tpsample.sampling.rounds.rounds import _tie_counts
from tpsample.sampling.thresholds import local_top_values

pytestmark = [pytest.mark.usefixtures("triton_interpreter"), pytest.mark.filterwarnings("ignore::RuntimeWarning")]
DEV = "cuda" if torch.cuda.is_available() else "cpu"
SPLIT = KernelConfig(splits=4, block=32)       # several programs and blocks on a short row


@pytest.fixture(scope="module")
def shard(triton_interpreter):
    """The kernel modules as one namespace, imported once the interpreter is on (triton.jit
    decides at import)."""
    from types import SimpleNamespace

    from tpsample.kernels import shard
    return SimpleNamespace(front=shard.front, gumbel_draw=shard.gumbel_draw, top_values=shard.top_values,
                           tie_counts=shard.tie_counts)


T = torch.tensor([0.7, 0.0, 1.3, 1.0, 2.0, 0.9])
DTYPES = [torch.float32, torch.bfloat16]


def shard_rows(dtype=torch.float32, cols=300):
    x = torch.randn(6, cols, generator=torch.Generator().manual_seed(3)) * 3
    x[1] = (x[1] * 2).round() / 2                      # many ties
    x[2, ::3] = float("nan")
    x[2, 5], x[2, 8] = -0.0, 0.0
    x[3] = float("-inf")
    x[4, 7] = float("inf")
    x[5, 100:110] = x[5].max()                         # ties at the top
    return x.to(dtype)


def d(t):
    return None if t is None else t.to(DEV)


def working_row(x, temperature=None):
    """What the torch pipeline holds: fp32(x), NaN -> -inf, divided by T (apply_temperature)."""
    l = x.to(torch.float32, copy=True)
    P.mask_nans(l, row_chunks(l.shape[0], l.shape[1]))
    if temperature is not None:
        P.apply_temperature(l, temperature)
    return l


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("col_start", [0, 37])
def test_front_gives_the_nan_counts_argmax_and_working_copy_of_the_torch_front(shard, dtype, col_start):
    x = shard_rows(dtype)
    l = x.to(torch.float32, copy=True)
    want_nans = P.mask_nans(l, row_chunks(6, 300))
    want_v, want_i = local_argmax(l, col_start)
    copy = torch.empty(x.shape)
    copy = copy.to(DEV)
    nans, v, i = (t.cpu() for t in shard.front(x.to(DEV), col_start, copy, cfg=SPLIT))
    assert torch.equal(nans, want_nans) and torch.equal(v, want_v) and torch.equal(i, want_i)
    assert torch.equal(copy.cpu(), l)
    assert torch.equal(shard.front(x.to(DEV), col_start)[2].cpu(), want_i)     # no copy asked: the same answers


@pytest.mark.parametrize("dtype,tempered,c", [
    (torch.float32, False, 1), (torch.bfloat16, True, 1), (torch.float32, True, 7), (torch.bfloat16, False, 7),
    (torch.float32, False, 64), (torch.bfloat16, True, 64), (torch.float32, True, 305)])   # 305: more than the row
def test_top_values_and_tie_counts_equal_the_torch_summary_functions(shard, dtype, tempered, c):
    x = shard_rows(dtype)
    t = T if tempered else None
    l = working_row(x, t)
    want = local_top_values(l, c)
    xd, td, last = x.to(DEV), d(t), want[:, -1].to(DEV)
    assert torch.equal(shard.top_values(xd, c, td).cpu(), want)
    assert torch.equal(shard.top_values(xd, c, td, cfg=SPLIT).cpu(), want)
    ties = _tie_counts(l, want[:, -1], c)
    assert torch.equal(shard.tie_counts(xd, last, c, td, cfg=SPLIT).cpu(), ties)
    assert torch.equal(shard.tie_counts(xd, last, c, td).cpu(), ties)
    assert bool(ties.gt(0).any()) == (c < 300)                 # ties beyond c were there to count


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", [KernelConfig(), SPLIT], ids=["one", "split"])
def test_gumbel_draw_picks_the_torch_draws_winner(shard, dtype, cfg):
    """Temperature-only rows (thr = -inf: every block may be skipped by the bound tests), filtered
    rows, an all -inf row, a +inf entry; the kernel reads x and divides by T itself."""
    x = shard_rows(dtype, cols=2000)
    thr = torch.tensor([float("-inf"), 1.0, float("-inf"), 0.0, 2.0, float("-inf")])
    seeds, pos = torch.arange(6) * 7, torch.arange(6) + 9
    k0, k1 = noise.row_keys(seeds, pos, noise.SALT_DRAW)
    want_v, want_i = local_gumbel_draw(working_row(x, T), thr, seeds, pos, 500)
    got_v, got_i = (t.cpu() for t in shard.gumbel_draw(x.to(DEV), d(thr), d(k0), d(k1), 500, d(T), cfg=cfg))
    assert torch.equal(got_i, want_i)
    assert torch.allclose(got_v, want_v, rtol=1e-6) and got_v[3] == float("-inf") and got_i[3] == 500


SMALL_BLOCKS = KernelConfig(splits=4, block=8)      # blocks of 8 columns: many block maxima on a short row


@pytest.mark.parametrize("cfg", [SPLIT, SMALL_BLOCKS], ids=["split", "small_blocks"])
@pytest.mark.parametrize("c", [3, 7, 40])
def test_top_values_count_every_tie_at_the_bound(shard, cfg, c):
    """Rows of a few distinct values (the c-th largest block maximum, the bound, is tied many
    times over, inside and across blocks), a constant row and a row whose top values are one
    repeated value: the ties at the bound fill the list up to c exactly."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 4, (5, 300), generator=g).float()
    x[1] = 2.5
    x[2, ::7] = 9.0
    x[3] = torch.randint(0, 2, (300,), generator=g).float() * 2 - 1
    x[4, :150] = float("-inf")
    assert torch.equal(shard.top_values(x.to(DEV), c, cfg=cfg).cpu(), local_top_values(x, c))


@pytest.mark.parametrize("c", [119, 120, 121])
def test_top_values_of_c_near_the_row_length_hold_every_entry_of_the_row(shard, c):
    """The last, partial block and step of each split are read: with c around the row's length
    every entry (the last column's too) is in the list, then -inf."""
    x = shard_rows(cols=120)
    x[:, -1] = 50.0
    l = working_row(x)
    for cfg in (SPLIT, SMALL_BLOCKS):
        assert torch.equal(shard.top_values(x.to(DEV), c, cfg=cfg).cpu(), local_top_values(l, c))


@pytest.mark.parametrize("dtype,tempered", [(torch.float32, False), (torch.bfloat16, True)])
def test_top_values_are_exact_when_the_candidates_outnumber_one_sort_block(shard, dtype, tempered):
    """The largest values bunched in the last blocks (an ascending row, a row with a high
    plateau): more entries lie above the bound than the values kernel sorts at once, so the
    radix select over the candidates picks the c largest."""
    x = torch.arange(2000, dtype=torch.float32).repeat(3, 1) / 7
    x[1, 1500:] = 400.0
    x[1, 1700:1710] = 500.0
    x[2] = x[2].flip(0)
    x = x.to(dtype)
    t = torch.tensor([0.7, 1.3, 0.0]) if tempered else None
    for c in (7, 33):
        want = local_top_values(working_row(x, t), c)
        assert torch.equal(shard.top_values(x.to(DEV), c, d(t), cfg=SPLIT).cpu(), want)


def test_an_empty_shard_gives_what_the_torch_functions_give(shard):
    x = torch.zeros(2, 0)
    nans, v, i = shard.front(x.to(DEV), 9)
    assert nans.tolist() == [0, 0] and v.tolist() == [float("-inf")] * 2 and i.tolist() == [9, 9]
    assert torch.equal(shard.top_values(x.to(DEV), 3).cpu(), local_top_values(x, 3))


@pytest.mark.parametrize("call,match", [
    (lambda k: k.top_values(torch.zeros(2, 8), 0), r"c \(values per row\) must be in \[1, 2048\], got 0"),
    (lambda k: k.top_values(torch.zeros(2, 8), 4096), "got 4096"),
    (lambda k: k.front(torch.zeros(8, 2).t(), 0), "x must be a .* unit column stride"),
    (lambda k: k.front(torch.zeros(2, 8, dtype=torch.float64), 0), "fp32, bf16 or fp16, got torch.float64"),
    (lambda k: k.front(torch.zeros(2, 8), 0, torch.zeros(2, 8, dtype=torch.bfloat16)), "copy must be an fp32"),
])
def test_bad_shard_input_is_refused_naming_the_field(shard, call, match):
    with pytest.raises(ValueError, match=match):
        call(shard)


WORKLOADS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.8),
    "top_k": dict(temperature=0.8, top_k=20),
    "min_p": dict(temperature=1.0, min_p=0.05),
    "top_k_top_p": dict(temperature=0.9, top_k=30, top_p=0.8),
}
VOCAB = 1031


def _tokens(group):
    """Tokens of each workload (2 steps, bf16 logits) and how often each shard pass ran."""
    from scenarios import shard_pass_run
    return shard_pass_run(group, VOCAB, WORKLOADS, ("front", "top_values", "tie_counts", "gumbel_draw"),
                          torch.bfloat16)


@pytest.mark.skipif(DEV == "cuda", reason="gloo ranks on CPU tensors: the interpreter's case")
def test_vocab_parallel_on_the_shard_kernels_gives_tp1_tokens_without_a_working_copy(monkeypatch):
    """The kernels read the bf16 shard itself (temperature divided on the fly): no fp32 copy."""
    from tpsample.parallel.launch import spawn_ranks
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    want, _ = _tokens(None)
    for rank, (got, calls) in enumerate(spawn_ranks(_tokens, 2, timeout_s=300)):
        assert got == want, f"rank {rank}"
        assert min(calls.get(n, 0) for n in ("front", "top_values", "tie_counts", "gumbel_draw")) > 0, calls
        assert calls.get("working_copies", 0) == 0, calls


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="needs CUDA")
def test_full_size_shard_passes_match_the_torch_functions_on_gpu(shard):
    """Rank 1's shard of 151,936 at TP = 2, bf16, 64 rows: the compiled passes on the GPU against
    the torch functions on CPU (top-k 50's summary and the largest c the kernel takes)."""
    cols, start = 75_968, 75_968
    x = (torch.randn(64, cols, generator=torch.Generator().manual_seed(8)) * 3).bfloat16()
    t = torch.full((64,), 0.8)
    l = working_row(x, t)
    for c in (51, 1025):
        want = local_top_values(l, c)
        assert torch.equal(shard.top_values(x.to(DEV), c, d(t)).cpu(), want)
        assert torch.equal(shard.tie_counts(x.to(DEV), want[:, -1].to(DEV), c, d(t)).cpu(),
                           _tie_counts(l, want[:, -1], c))
    nans, v, i = (r.cpu() for r in shard.front(x.to(DEV), start))
    assert not nans.any() and torch.equal(v, x.float().max(dim=1).values)
    assert torch.equal(i, local_argmax(x.float(), start)[1])
    seeds, pos = torch.arange(64), torch.arange(64) + 3
    thr = torch.where(torch.arange(64) % 2 == 0, float("-inf"), local_top_values(l, 51)[:, -1])
    k0, k1 = noise.row_keys(seeds, pos, noise.SALT_DRAW)
    want_v, want_i = local_gumbel_draw(l, thr, seeds, pos, start)
    got_v, got_i = (r.cpu() for r in shard.gumbel_draw(x.to(DEV), d(thr), d(k0), d(k1), start, d(t)))
    assert torch.equal(got_i, want_i) and torch.allclose(got_v, want_v, rtol=1e-6)


def test_the_torch_passes_given_a_temperature_equal_the_passes_on_the_divided_row():
    """Without kernels (CPU tensors), top values, tie counts and the draw given T equal the same
    functions on the row step 6 divided (greedy rows divide by 1)."""
    x = torch.randn(6, 300, generator=torch.Generator().manual_seed(3)) * 3
    l = x.clone()
    P.apply_temperature(l, T)
    assert torch.equal(local_top_values(x, 9, temperature=T), local_top_values(l, 9))
    last = local_top_values(l, 9)[:, -1]
    assert torch.equal(_tie_counts(x, last, 9, T), _tie_counts(l, last, 9))
    seeds, pos, thr = torch.arange(6), torch.arange(6) + 5, last
    got = local_gumbel_draw(x, thr, seeds, pos, 40, temperature=T)
    want = local_gumbel_draw(l, thr, seeds, pos, 40)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_shard_kernel_switch_keeps_the_shard_on_the_torch_passes(monkeypatch):
    """TPSAMPLE_SHARD_KERNELS=0: no shard kernel for a tensor the kernels would take."""
    from tpsample.sampling.keys import shard_passes
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    x = torch.zeros(2, 8, device=DEV)
    assert shard_passes(x) is not None
    monkeypatch.setenv("TPSAMPLE_SHARD_KERNELS", "0")
    assert shard_passes(x) is None
