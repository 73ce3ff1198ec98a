"""XTC (docs/semantics.md step 9, after top-p) against the float64 reference (`reference.xtc_row`),
through every strategy at TP = 1, the kernels' split (interpreter on CPU) and vocab shards at
TP 2 and 3 (gloo), where the removed set must be the full row's; the coin is keyed by
(seed, position) and comes up at the rate asked."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from scenarios import kernels_beside_torch
from test_semantics_reference import STRATEGIES, V, add_all, kept_sets, new_sampler, randn_logits, run_steps

from tpsample import SamplingParams as SP
from tpsample.parallel.launch import spawn_ranks


def _params(i: int) -> SP:
    return SP(xtc_probability=(1.0, 0.5, 0.0)[i % 3], xtc_threshold=(0.02, 0.1, 0.3, 0.0)[i % 4],
              temperature=(0.5, 1.0, 2.0)[i % 3], seed=i, top_k=(-1, 5, 60)[i % 3], top_p=(1.0, 0.9)[i % 2],
              top_n_sigma=(-1.0, -1.0, 2.0)[i % 3], logprobs=(None, 3)[i % 2],
              logprobs_mode=("raw", "processed")[(i // 2) % 2])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_xtc_with_the_other_filters_matches_the_reference(strategy):
    sampler = new_sampler(strategy=strategy)
    run_steps(sampler, add_all(sampler, [_params(i) for i in range(60)]), 3)


def test_every_qualifying_token_but_the_least_probable_is_removed():
    sampler = new_sampler()
    logits = torch.full((3, V), -30.0)
    logits[:, :5] = torch.log(torch.tensor([0.4, 0.3, 0.15, 0.15, 0.0001]))
    params = [SP(xtc_probability=1.0, xtc_threshold=0.12), SP(xtc_probability=1.0, xtc_threshold=0.35),
              SP(xtc_probability=1.0, xtc_threshold=0.12, top_k=2)]
    got = kept_sets(sampler, params, logits)
    # 0.4, 0.3 and the two tied 0.15 qualify: the ties stay (keep l <= v_min), so do the rest
    assert got[0] == set(range(2, V))
    assert got[1] == set(range(V))             # one token qualifies: nothing removed
    assert got[2] == {1}                       # after top-k 2: 0.4 / 0.7 and 0.3 / 0.7 qualify


def test_the_coin_comes_up_at_the_rate_asked_and_only_from_seed_and_position():
    """4000 rows with two dominant tokens: XTC removes the top one with probability 0.3."""
    n = 4000
    logits = torch.full((n, V), -20.0)
    logits[:, 0], logits[:, 1] = 2.0, 1.0
    params = [SP(xtc_probability=0.3, xtc_threshold=0.1, seed=i) for i in range(n)]
    first = _tokens(new_sampler(max_num_reqs=n), params, logits)
    fired = sum(t == 1 for t in first) / n            # token 1 is drawn when XTC removed token 0 (or by chance)
    p1 = math.exp(1) / (math.exp(1) + math.exp(2))
    want = 0.3 + 0.7 * p1
    assert abs(fired - want) < 4 * math.sqrt(want * (1 - want) / n)      # |z| < 4
    order = list(range(n))[::-1]                      # another batch order, another sampler: the same tokens
    again = _tokens(new_sampler(strategy="vocab_parallel", max_num_reqs=n), [params[i] for i in order], logits[order])
    assert again[::-1] == first


def _tokens(sampler, params, logits) -> list[int]:
    ids = add_all(sampler, params, prompts=[[0]] * len(params))
    plan = sampler.plan(ids)
    return [t[0] for t in sampler.sample(logits[plan.logits_order].clone(), plan).token_lists()]


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_kernels_draw_xtc_rows_themselves_with_the_torch_backends_tokens(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    filters = [{}, {"top_k": 30, "top_p": 0.95}, {"min_p": 0.05}, {"top_p": 0.8}, {"top_n_sigma": 2.0},
               {"temperature": 0.0}]
    params = [SP(**{"temperature": 1.0, **filters[i % 6]}, xtc_probability=(1.0, 0.5)[i % 2],
                 xtc_threshold=(0.01, 0.05, 0.15, 0.3)[i % 4], seed=i) for i in range(24)]
    params[1] = SP(top_k=5, seed=2)                            # a row without XTC
    logits = randn_logits(len(params), 3) * 3
    slow, mixed, alone = kernels_beside_torch(params, logits)
    assert slow == []                                          # no row is left to the torch backend
    assert torch.equal(mixed.emitted, alone.emitted) and torch.equal(mixed.fallback, alone.fallback)
    plain = [dataclasses.replace(p, xtc_probability=0.0) for p in params]
    assert not torch.equal(kernels_beside_torch(plain, logits)[1].emitted, mixed.emitted)    # XTC changed some


class _Rows:
    """What xtc_upper_bound reads of a RowBatch, for 16 rows."""
    vocab_size = 997
    seeds, positions = torch.arange(16), torch.full((16,), 5)

    def column(self, name):
        return {"xtc_threshold": torch.tensor([0.0, 0.01, 0.05, 0.2] * 4),
                "xtc_probability": torch.tensor([1.0] * 15 + [0.0])}[name]


def _bounds(x: torch.Tensor, red) -> list[float]:
    from tpsample.sampling.xtc import xtc_upper_bound
    thr = torch.tensor([-float("inf"), 1.0, 2.0, 3.0] * 4)
    return xtc_upper_bound(x, thr, _Rows(), red).tolist()


def _shard_bounds(group, vocab: int):
    from tpsample.parallel.collectives import Collectives
    from tpsample.parallel.group import TPGroup
    from tpsample.parallel.shard import vocab_shard
    from tpsample.parallel.strategies import ShardReducer
    g = TPGroup.resolve(group, 60)
    start, end = vocab_shard(vocab, g.size, g.rank)
    return _bounds(_rows(vocab)[:, start:end].contiguous(), ShardReducer(Collectives(g)))


def _rows(vocab: int) -> torch.Tensor:
    x = torch.randn(16, vocab, generator=torch.Generator().manual_seed(4)) * 2
    x[:, vocab - 3:] = 7.0                       # three tied top tokens in the last shard
    return x


@pytest.mark.parametrize("tp", [2, 3])
def test_upper_bound_on_vocab_shards_is_bitwise_the_full_rows(tp):
    from tpsample.sampling.reducer import LocalRows
    want = _bounds(_rows(997), LocalRows())
    for got in spawn_ranks(_shard_bounds, tp, 997, timeout_s=120):
        assert got == want
    assert want[15] == float("inf") and len({v for v in want[:15] if v < float("inf")}) > 3


@pytest.mark.parametrize("field,value", [("xtc_threshold", -0.1), ("xtc_threshold", 1.5), ("xtc_probability", 2.0),
                                         ("xtc_probability", float("nan"))])
def test_bad_xtc_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field} must be"):
        SP(**{field: value})
