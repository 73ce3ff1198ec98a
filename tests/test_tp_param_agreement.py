"""TP ranks that were given different params (or prompts) for the same request get a ValueError
naming the request and the field, on every rank, before any strategy collective runs; ranks
that agree sample as before. Two gloo ranks, replicated and vocab_parallel (under replicated the
tokens would diverge silently, under vocab_parallel the ranks would agree on a token that is no
rank's request)."""
from __future__ import annotations

import pytest
import torch

import tpsample
from tpsample import SamplingParams as SP
from tpsample.parallel.launch import spawn_ranks

V = 67
BASE = {"temperature": 0.8, "seed": 3}
# field -> what rank 1 changes in request "a" (rank 0 keeps BASE)
CHANGES = {
    "temperature": {"temperature": 0.5},
    "seed": {"seed": 4},
    "top_k": {"top_k": 5},
    "top_p": {"top_p": 0.5},
    "min_p": {"min_p": 0.1},
    "allowed_token_ids": {"allowed_token_ids": [1, 2, 3]},
    "logit_bias": {"logit_bias": {3: 1.0}},
    "repetition_penalty": {"repetition_penalty": 1.2},
    "bad_words_token_ids": {"bad_words_token_ids": [[7]]},
    "logprobs": {"logprobs": 2},
    "temperature, top_k": {"temperature": 0.5, "top_k": 5},
}
STRATEGIES = ("replicated", "vocab_parallel")


def _step(group, strategy: str, rank1_params: dict, rank0_params: dict = BASE, rank1_prompt=(1, 2),
          rank1_detour: bool = False) -> str:
    """One step over requests "b" (equal on both ranks) and "a" (rank 1's may differ): "ok" or the error."""
    s = tpsample.Sampler(V, group=group, seed=0, strategy=strategy, max_logprobs=4, timeout_s=60)
    rank1 = group.rank() == 1
    if rank1 and rank1_detour:              # an add and remove only here: "a" derives another seed
        s.add_request("tmp", SP(), [1])
        s.remove_request("tmp")
    s.add_request("b", SP(**BASE), [5])
    s.add_request("a", SP(**(rank1_params if rank1 else rank0_params)), list(rank1_prompt if rank1 else (1, 2)))
    try:
        s.sample(torch.randn(2, s.col_end - s.col_start), s.plan(["b", "a"]))
        return "ok"
    except ValueError as exc:
        return str(exc)


def _all_cases(group) -> dict:
    out = {}
    for strategy in STRATEGIES:
        for field, change in CHANGES.items():
            out[(strategy, field)] = _step(group, strategy, {**BASE, **change})
        out[(strategy, "prompt_token_ids")] = _step(group, strategy, BASE, rank1_prompt=(1, 3))
        unseeded = {k: v for k, v in BASE.items() if k != "seed"}
        out[(strategy, "derived seed")] = _step(group, strategy, unseeded, unseeded, rank1_detour=True)
        out[(strategy, "equal")] = _step(group, strategy, BASE)        # the group still works after errors
        out[(strategy, "equal unseeded")] = _step(group, strategy, unseeded, unseeded)
    return out


@pytest.fixture(scope="module")
def ranks():
    return spawn_ranks(_all_cases, 2, timeout_s=240)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("field", list(CHANGES) + ["prompt_token_ids"])
def test_ranks_given_different_params_for_a_request_get_an_error_naming_the_field(ranks, strategy, field):
    verb = "differ" if "," in field else "differs"
    for rank, res in enumerate(ranks):
        assert res[(strategy, field)].startswith(f"TP ranks disagree on request 'a': {field} {verb}"), \
            (rank, res[(strategy, field)])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_derived_seed_that_differs_between_ranks_is_named(ranks, strategy):
    for res in ranks:
        assert res[(strategy, "derived seed")].startswith("TP ranks disagree on request 'a': seed differs"), res


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_ranks_with_equal_params_sample_without_error(ranks, strategy):
    for res in ranks:
        assert res[(strategy, "equal")] == "ok" and res[(strategy, "equal unseeded")] == "ok"


def test_params_that_sample_alike_give_equal_prints():
    """Digests are canonical: a top_k that keeps everything, id sets in any order, a seed mod 2**64."""
    from tpsample.state.digest import request_digests
    same = [(SP(top_k=-1), SP(top_k=0)), (SP(top_k=V), SP(top_k=-1)), (SP(seed=-1), SP(seed=2**64 - 1)),
            (SP(allowed_token_ids=[3, 1, 1]), SP(allowed_token_ids=[1, 3])),
            (SP(logit_bias={1: 1.0, 2: -1.0}), SP(logit_bias={2: -1.0, 1: 1.0}))]
    for a, b in same:
        da = request_digests("r", a, a.seed or 0, [1], V)
        assert (da == request_digests("r", b, b.seed or 0, [1], V)).all(), (a, b)
    assert (request_digests("r", SP(), 0, [1], V) != request_digests("r", SP(), 0, [1, 1], V)).any()
