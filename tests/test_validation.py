"""Bad input raises ValueError naming the field (and the allowed range) before anything runs.

DESIGN.md section 2 "Validation" and STYLE.md: SamplingParams checks every field at
construction; checks that need V or the sampler's limits run in `add_request`; `plan` and
`sample` check request ids, drafts, bitmasks and tensor shapes. A rejected call changes nothing.
"""
from __future__ import annotations

import pytest
import torch

import tpsample
from tpsample import SamplingParams as SP

V = 100
NAN, INF = float("nan"), float("inf")

PARAM_ERRORS = [
    ("temperature", -0.1), ("temperature", NAN), ("temperature", INF), ("temperature", "1"), ("temperature", True),
    ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.0001), ("top_p", NAN),
    ("top_k", -2), ("top_k", 2.5), ("top_k", True), ("top_k", "5"),
    ("min_p", -0.01), ("min_p", 1.01), ("min_p", NAN),
    ("seed", 1.5), ("seed", "7"), ("seed", True),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", INF),
    ("frequency_penalty", 2.01), ("frequency_penalty", -2.01), ("frequency_penalty", NAN),
    ("presence_penalty", 2.01), ("presence_penalty", -2.01), ("presence_penalty", INF),
    ("min_tokens", -1), ("min_tokens", 1.5),
    ("max_tokens", 0), ("max_tokens", 2.0),
    ("logprobs", -1), ("logprobs", 1.5),
    ("logprobs_mode", "logits"), ("logprobs_mode", None),
    ("logit_bias", [(1, 2.0)]), ("logit_bias", {-1: 1.0}), ("logit_bias", {"a": 1.0}), ("logit_bias", {1: NAN}),
    ("logit_bias", {1: INF}), ("logit_bias", {t: 1.0 for t in range(1025)}),
    ("allowed_token_ids", []), ("allowed_token_ids", [-1]), ("allowed_token_ids", [1.5]), ("allowed_token_ids", 5),
    ("stop_token_ids", [-1]), ("stop_token_ids", ["a"]), ("stop_token_ids", 5),
    ("bad_words_token_ids", [[]]), ("bad_words_token_ids", [[-1]]), ("bad_words_token_ids", [1, 2]),
    ("bad_words_token_ids", [[1]] * 129), ("bad_words_token_ids", [[1] * 1025]), ("bad_words_token_ids", 5),
]


@pytest.mark.parametrize("field,value", PARAM_ERRORS, ids=[f"{f}={str(v)[:12]}" for f, v in PARAM_ERRORS])
def test_sampling_params_rejects_each_bad_value_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be"):
        SP(**{field: value})


def test_sampling_params_accepts_every_bound():
    for kw in ({"temperature": 0.0}, {"top_p": 1.0}, {"top_p": 1e-9}, {"top_k": -1}, {"top_k": 0}, {"top_k": 1},
               {"min_p": 0.0}, {"min_p": 1.0}, {"repetition_penalty": 1e-6}, {"frequency_penalty": 2.0},
               {"frequency_penalty": -2.0}, {"presence_penalty": 2}, {"presence_penalty": -2}, {"min_tokens": 0},
               {"max_tokens": 1}, {"logprobs": 0}, {"seed": -(2**70)}, {"logprobs_mode": "processed"},
               {"logit_bias": {t: -100.0 for t in range(1024)}}, {"allowed_token_ids": [0]},
               {"bad_words_token_ids": [list(range(1024))] * 128}, {"stop_token_ids": []}):
        SP(**kw)


def test_sampling_params_is_frozen():
    p = SP()
    with pytest.raises(AttributeError):
        p.temperature = 0.5


def sampler(**kw) -> tpsample.Sampler:
    kw.setdefault("max_num_reqs", 4)
    return tpsample.Sampler(V, strategy="replicated", seed=0, max_logprobs=5, max_num_logits_per_req=3, **kw)


@pytest.mark.parametrize("field,params", [
    ("logit_bias", SP(logit_bias={V: 1.0})),
    ("allowed_token_ids", SP(allowed_token_ids=[0, V])),
    ("allowed_token_ids", SP(allowed_token_ids=[0] * (V + 1))),
    ("stop_token_ids", SP(stop_token_ids=[V + 5])),
    ("bad_words_token_ids", SP(bad_words_token_ids=[[1, V]])),
    ("logprobs", SP(logprobs=6)),
])
def test_add_request_rejects_params_outside_the_vocab_or_limits(field, params):
    s = sampler()
    with pytest.raises(ValueError, match=field):
        s.add_request("a", params, [1])
    assert s.add_request("a", SP(), [1]) == 0                      # nothing was taken


@pytest.mark.parametrize("prompt", [[V], [-1], [1, 2.0], "abc", (1, None)])
def test_add_request_rejects_prompt_token_ids_out_of_range(prompt):
    with pytest.raises(ValueError, match="prompt_token_ids"):
        sampler().add_request("a", SP(), prompt)


def test_add_request_rejects_non_params_duplicates_and_a_full_table():
    s = sampler(max_num_reqs=2)
    with pytest.raises(ValueError, match="params"):
        s.add_request("a", {"temperature": 0.5}, [1])
    s.add_request("a", SP(), [1])
    with pytest.raises(ValueError, match="req_id 'a' is already active"):
        s.add_request("a", SP(), [1])
    s.add_request("b", SP(), [1])
    with pytest.raises(ValueError, match="max_num_reqs=2"):
        s.add_request("c", SP(), [1])
    s.remove_request("a")
    assert s.add_request("c", SP(), [1]) == 0
    with pytest.raises(ValueError, match="req_id 'zzz' is not active"):
        s.remove_request("zzz")


@pytest.mark.parametrize("field,kw", [
    ("vocab_size", {"vocab_size": 0}), ("vocab_size", {"vocab_size": "100"}),
    ("strategy", {"strategy": "sharded"}), ("max_num_logits_per_req", {"max_num_logits_per_req": 0}),
    ("max_logprobs", {"max_logprobs": -1}), ("eos_token_id", {"eos_token_id": V}),
    ("eos_token_id", {"eos_token_id": -1}), ("max_num_reqs", {"max_num_reqs": 0}),
])
def test_sampler_constructor_rejects_bad_arguments(field, kw):
    kw = {"vocab_size": V, **kw}
    with pytest.raises(ValueError, match=field):
        tpsample.Sampler(kw.pop("vocab_size"), **kw)


def two_requests() -> tpsample.Sampler:
    s = sampler()
    s.add_request("a", SP(seed=1), [1])
    s.add_request("b", SP(seed=2), [2])
    return s


WORDS = (V + 31) // 32


@pytest.mark.parametrize("field,ids,kw", [
    ("req_id 'c' is not active", ["a", "c"], {}),
    ("req_ids must be unique", ["a", "a"], {}),
    ("draft_token_ids", ["a", "b"], {"draft_token_ids": [[1, 2, 3], []]}),          # > max_num_logits_per_req - 1
    ("draft_token_ids", ["a", "b"], {"draft_token_ids": [[1]]}),                    # one list per request
    ("draft_token_ids", ["a", "b"], {"draft_token_ids": [[V], []]}),
    ("draft_token_ids", ["a", "b"], {"draft_token_ids": [[-1], []]}),
    ("grammar_bitmask", ["a", "b"], {"grammar_bitmask": torch.zeros(2, WORDS, dtype=torch.int64)}),
    ("grammar_bitmask", ["a", "b"], {"grammar_bitmask": torch.zeros(3, WORDS, dtype=torch.int32)}),
    ("grammar_bitmask", ["a", "b"], {"grammar_bitmask": torch.zeros(2, WORDS + 1, dtype=torch.int32)}),
    ("grammar_bitmask", ["a", "b"], {"grammar_bitmask": [[0] * WORDS] * 2}),
    ("grammar_bitmask", ["a", "b"], {"draft_token_ids": [[1], []],                  # rows count drafts
                                     "grammar_bitmask": torch.zeros(2, WORDS, dtype=torch.int32)}),
    ("strategy", ["a", "b"], {"strategy": "fast"}),
])
def test_plan_rejects_bad_requests_drafts_and_bitmasks(field, ids, kw):
    with pytest.raises(ValueError, match=field):
        two_requests().plan(ids, **kw)


@pytest.mark.parametrize("field,logits,probs", [
    ("local_logits", torch.zeros(3, V), None),
    ("local_logits", torch.zeros(2, V - 1), None),
    ("local_logits", torch.zeros(2 * V), None),
    ("local_logits", torch.zeros(2, V, dtype=torch.int32), None),
    ("local_logits", [[0.0] * V] * 2, None),
    ("draft_probs", torch.zeros(2, V), torch.zeros(2, V + 1)),
    ("draft_probs", torch.zeros(2, V), torch.zeros(1, V)),
    ("draft_probs", torch.zeros(2, V), torch.zeros(2, V, dtype=torch.int64)),
])
def test_sample_rejects_bad_logits_and_draft_probs_without_advancing(field, logits, probs):
    s = two_requests()
    plan = s.plan(["a", "b"])
    with pytest.raises(ValueError, match=field):
        s.sample(logits, plan, draft_probs=probs)
    x = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    fresh = two_requests()
    assert s.sample(x, plan).sampled_token_ids.tolist() == \
        fresh.sample(x, fresh.plan(["a", "b"])).sampled_token_ids.tolist()          # histories unchanged


def test_sample_rejects_a_plan_whose_request_was_removed():
    s = two_requests()
    plan = s.plan(["a", "b"])
    s.remove_request("b")
    with pytest.raises(ValueError, match="plan is stale"):
        s.sample(torch.zeros(2, V), plan)


def test_sample_rejects_a_stale_plan_after_remove_and_readd():
    s = two_requests()
    plan = s.plan(["a", "b"])
    s.remove_request("b")
    s.add_request("b", SP(seed=9), [1])                  # same id, same slot, another request
    with pytest.raises(ValueError, match="plan is stale"):
        s.sample(torch.zeros(2, V), plan)
    s.sample(torch.zeros(2, V), s.plan(["a", "b"]))      # a fresh plan works


def test_sample_rejects_a_plan_from_another_sampler_or_not_a_plan():
    s, other = two_requests(), two_requests()
    with pytest.raises(ValueError, match="another Sampler"):
        s.sample(torch.zeros(2, V), other.plan(["a", "b"]))
    with pytest.raises(ValueError, match="must be a SamplingPlan"):
        s.sample(torch.zeros(2, V), "plan")
