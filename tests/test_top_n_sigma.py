"""top-n-sigma (docs/semantics.md step 7) against the float64 reference (`reference.top_n_sigma_threshold`:
the fixed-point definition in Python integers), through every strategy at TP = 1, the kernels'
split (interpreter on CPU), and vocab shards at TP 2 and 3 (gloo) where the threshold must be
bitwise the full row's."""
from __future__ import annotations

import numpy as np
import pytest
import reference as ref
import torch
from scenarios import kernels_beside_torch
from test_semantics_reference import STRATEGIES, V, add_all, kept_sets, new_sampler, randn_logits, run_steps

from tpsample import SamplingParams as SP
from tpsample.parallel.launch import spawn_ranks


def _params(i: int) -> SP:
    return SP(top_n_sigma=(0.3, 1.0, 2.0, 3.0, -1.0)[i % 5], temperature=(0.7, 1.0, 1.5)[i % 3], seed=i,
              top_k=(-1, 5, 50, -1)[i % 4], top_p=(1.0, 0.9)[i % 2], min_p=(0.0, 0.0, 0.05)[i % 3],
              logprobs=(None, 2)[i % 2], logprobs_mode=("raw", "processed")[(i // 2) % 2])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_top_n_sigma_with_the_other_filters_matches_the_reference(strategy):
    sampler = new_sampler(strategy=strategy)
    run_steps(sampler, add_all(sampler, [_params(i) for i in range(60)]), 3)


def test_kept_set_is_the_tokens_within_n_sigma_of_the_max():
    sampler = new_sampler()
    logits = randn_logits(40, 0) + torch.linspace(0, 4, V)       # spread rows: sigma cuts deep
    logits[::5, :50] = float("-inf")                            # -inf entries are not in the statistics
    params = [SP(top_n_sigma=(0.25, 0.5, 1.0, 2.0)[i % 4], temperature=(0.5, 1.0)[i % 2]) for i in range(40)]
    got = kept_sets(sampler, params, logits)
    sizes = []
    for i, p in enumerate(params):
        row = [v / p.temperature for v in logits[i].double().tolist()]
        cut = ref.top_n_sigma_threshold(row, p.top_n_sigma, V)
        assert got[i] == {t for t, v in enumerate(row) if v >= cut and v > -float("inf")}, i
        sizes.append(len(got[i]))
    assert max(sizes) < V - 50 and sum(s > 1 for s in sizes) > 20     # it cut, and often kept more than the max


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_kernels_sample_top_n_sigma_rows_themselves_with_the_torch_backends_tokens(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    params = [SP(top_n_sigma=0.5, seed=1), SP(top_k=5, seed=2), SP(top_n_sigma=1.0, top_p=0.8, seed=3),
              SP(temperature=0.0, top_n_sigma=1.0)] + [_params(i) for i in range(1, 40, 4)]   # raw logprobs
    x = randn_logits(len(params), 3) * 0.1          # flat rows: the threshold decides most tokens
    x[::3, :20] = float("-inf")
    slow, mixed, alone = kernels_beside_torch(params, x)
    assert slow == []                                          # no row left to torch
    assert torch.equal(mixed.emitted, alone.emitted) and torch.equal(mixed.fallback, alone.fallback)
    assert torch.equal(mixed.lp_ids, alone.lp_ids) and torch.allclose(mixed.lp_vals, alone.lp_vals, atol=1e-5)


def _shard_statistics(group, vocab: int):
    """Each rank's (threshold, M, sigma) from its vocab shard of the same rows (TP = the group's size)."""
    from tpsample.parallel.collectives import Collectives
    from tpsample.parallel.group import TPGroup
    from tpsample.parallel.shard import vocab_shard
    from tpsample.parallel.strategies import ShardReducer
    g = TPGroup.resolve(group, 60)
    start, end = vocab_shard(vocab, g.size, g.rank)
    return _statistics(_rows(vocab)[:, start:end].contiguous(), ShardReducer(Collectives(g)), vocab)


def _statistics(x: torch.Tensor, red, vocab: int):
    from tpsample.sampling.top_n_sigma import row_sigma, top_n_sigma_threshold
    n = torch.tensor([0.5, 1.0, 2.0, 3.0] * (x.shape[0] // 4))
    return (top_n_sigma_threshold(x, n, red, vocab).tolist(), *(t.tolist() for t in row_sigma(x, red, vocab)))


def _rows(vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(9)
    x = torch.randn(16, vocab, generator=g) * torch.tensor([0.01, 1.0, 30.0, 1e4]).repeat(4).unsqueeze(1)
    x[1::4, vocab // 3:] = float("-inf")         # a shard without a finite value
    x[3, :] = float("-inf")                      # a row without any
    return x


@pytest.mark.parametrize("tp", [2, 3])
def test_statistics_on_vocab_shards_and_permuted_rows_are_bitwise_the_full_rows(tp):
    """The deviation (float64) and the threshold do not depend on the split or the column order."""
    from tpsample.sampling.reducer import LocalRows
    vocab = 997
    x = _rows(vocab)
    want = _statistics(x, LocalRows(), vocab)
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(1))
    assert _statistics(x[:, perm].contiguous(), LocalRows(), vocab) == want
    for got in spawn_ranks(_shard_statistics, tp, vocab, timeout_s=120):
        assert got == want
    thr = want[0]
    assert thr[3] == -float("inf") and all(v > -float("inf") for i, v in enumerate(thr) if i != 3)


@pytest.mark.parametrize("value", [1e6 + 1, float("nan"), "1"])
def test_bad_top_n_sigma_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match="SamplingParams.top_n_sigma must be"):
        SP(top_n_sigma=value)


def _store_batch(params):
    from tpsample.sampling.processors import PROCESSORS
    from tpsample.state.rows import RowsView
    from tpsample.state.store import RequestStore
    store = RequestStore(V, len(params), None, PROCESSORS)
    for i, p in enumerate(params):
        store.add(str(i), p, [1], p.seed or 0)
    store.sync(torch.device("cpu"), 1)
    n = len(params)
    return store.row_batch(RowsView(np.arange(n), np.zeros(n, np.int64), np.full(n, -1, np.int64)), torch.device("cpu"))


def test_the_vocab_parallel_rounds_apply_it_as_the_torch_backend_does():
    """top-n-sigma inside the rounds' summary (band rows, top-k + top-p ties, min-p, processed
    logprobs; the band's exact path too) gives the torch backend's tokens and logprobs."""
    from tpsample.sampling.recipe import SampleArgs, sample_rows
    from tpsample.sampling.reducer import LocalRows
    from tpsample.sampling.rounds.rounds import ROUNDS, ROUNDS_EXACT
    from tpsample.sampling.torch_backend import TORCH
    b = _store_batch([_params(i) for i in range(40)])
    x = randn_logits(40, 2) + torch.linspace(0, 3, V)
    want = sample_rows(SampleArgs(x.clone(), 0, b, LocalRows()), backend=TORCH)
    for rounds in (ROUNDS, ROUNDS_EXACT):
        got = sample_rows(SampleArgs(x.clone(), 0, b, LocalRows()), backend=rounds)
        assert torch.equal(got.emitted, want.emitted)
        assert torch.equal(got.lp_ids, want.lp_ids) and torch.allclose(got.lp_vals, want.lp_vals, atol=1e-5)


def _vocab_parallel_tokens(group):
    from test_semantics_reference import EOS

    import tpsample
    sampler = tpsample.Sampler(V, strategy="vocab_parallel", group=group, seed=0, eos_token_id=EOS,
                               max_logprobs=V, max_num_reqs=64)
    start, end = tpsample.vocab_shard(V, sampler.tp_size, sampler.rank)
    ids = add_all(sampler, [_params(i) for i in range(40)])
    got = []
    for step in range(3):
        plan = sampler.plan(ids)
        out = sampler.sample(randn_logits(40, step)[plan.logits_order][:, start:end].contiguous(), plan)
        got.append((out.token_lists(), out.logprobs.token_ids.tolist(), sampler.last_stats.num_rounds))
    return got


@pytest.mark.parametrize("tp", [2, 3])
def test_vocab_parallel_at_tp_2_and_3_samples_tp1s_tokens_in_one_more_round(tp):
    want = _vocab_parallel_tokens(None)
    for got in spawn_ranks(_vocab_parallel_tokens, tp, timeout_s=120):
        assert [g[:2] for g in got] == [w[:2] for w in want]
        assert all(g[2] <= 4 for g in got)         # ends, summary, winners, logprobs: no torch fallback
