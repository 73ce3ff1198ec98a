"""Inputs that used to take the process down or change results silently now get a clear error or
a defined result: huge limits, +inf logits with logprobs, mutated params, ranks that disagree."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tpsample
from tpsample import SamplingParams as SP
from tpsample.parallel.launch import spawn_ranks

V = 101


def held_bytes(root) -> int:
    """Bytes of every tensor and numpy array reachable from `root` through tpsample objects and
    containers (each storage counted once)."""
    seen, storages, total, todo = set(), set(), 0, [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, np.ndarray):
            total += obj.nbytes if obj.base is None else 0
        elif isinstance(obj, dict):
            todo += list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif type(obj).__module__.startswith("tpsample"):
            todo += list(getattr(obj, "__dict__", {}).values())
            todo += [getattr(obj, n) for n in getattr(type(obj), "__slots__", ()) if hasattr(obj, n)]
    return total


def test_huge_max_num_reqs_costs_nothing_up_front():
    small = tpsample.Sampler(V, max_num_reqs=8, seed=0)
    s = tpsample.Sampler(V, max_num_reqs=1 << 24, seed=0)
    for sampler in (small, s):
        sampler.add_request("a", SP(seed=1), [1])
        out = sampler.sample(torch.randn(1, V), sampler.plan(["a"]))
        assert 0 <= out.tokens(0)[0] < V
    assert s.store.f32.host.shape[1] <= 64                       # tables follow the slots in use
    assert held_bytes(s) <= 2 * held_bytes(small), (held_bytes(s), held_bytes(small))
    with pytest.raises(ValueError, match="max_num_reqs must be an integer in"):
        tpsample.Sampler(V, max_num_reqs=10**9)


def test_huge_max_logprobs_is_rejected():
    with pytest.raises(ValueError, match="max_logprobs must be an integer in"):
        tpsample.Sampler(V, max_logprobs=10**9)
    with pytest.raises(ValueError, match="logprobs"):
        tpsample.Sampler(V, max_logprobs=5).add_request("a", SP(logprobs=6), [1])


@pytest.mark.parametrize("strategy", ["replicated", "batch_sharded", "vocab_parallel"])
def test_positive_inf_logits_give_logprobs_without_nan(strategy):
    s = tpsample.Sampler(V, seed=0, strategy=strategy, max_logprobs=V)
    s.add_request("raw", SP(seed=1, logprobs=3), [1])
    s.add_request("proc", SP(seed=2, logprobs=3, logprobs_mode="processed"), [1])
    x = torch.randn(2, V)
    x[:, 7] = float("inf")
    x[:, 9] = float("inf")
    out = s.sample(x, s.plan(["raw", "proc"]))
    lp = out.logprobs.logprobs
    assert not torch.isnan(lp).any()
    assert out.sampled_token_ids[:, 0].tolist() == [7, 7]         # the lowest +inf id, flagged
    assert out.num_fallback.tolist() == [1, 1]
    assert lp[:, 0].tolist() == [0.0, 0.0]                        # +inf tokens hold the mass
    assert out.logprobs.token_ids[0, 1:3].tolist() == [7, 9]
    assert lp[0, 3].item() == -math.inf


def test_changing_params_lists_after_add_request_has_no_effect():
    allowed = [3, 4]
    bias = {3: 50.0}
    s = tpsample.Sampler(V, seed=0)
    s.add_request("a", SP(seed=1, allowed_token_ids=allowed, logit_bias=bias), [1])
    allowed.append(99)
    bias[99] = 1e4
    for _ in range(3):
        assert s.sample(torch.randn(1, V), s.plan(["a"])).tokens(0) == [3]


def _agree_then_disagree(group):
    """One process group, two steps: the same plan on both ranks, then a shuffled one."""
    s = tpsample.Sampler(V, group=group, seed=0, strategy="batch_sharded")
    for r in ("a", "b", "c"):
        s.add_request(r, SP(seed=1), [1])
    results = []
    for shuffled in (False, True):
        ids = ["c", "a", "b"] if (shuffled and group.rank() == 1) else ["a", "b", "c"]
        try:
            s.sample(torch.randn(3, s.col_end - s.col_start), s.plan(ids))
            results.append("ok")
        except ValueError as exc:
            results.append(str(exc))
    return results


def test_ranks_that_disagree_on_the_step_get_a_clear_error():
    ranks = spawn_ranks(_agree_then_disagree, 2, timeout_s=60)
    assert [r[0] for r in ranks] == ["ok", "ok"]
    assert all("TP ranks disagree" in r[1] for r in ranks), ranks
