"""Bad input raises ValueError naming the field (and the allowed range) before anything runs.

SamplingParams checks every field at construction (ranges in docs/semantics.md, "Parameter
ranges"); checks that need V or the sampler's limits run in `add_request`; `plan` and `sample`
check request ids, drafts, bitmasks and tensor shapes. A rejected call changes nothing.
"""
from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch

import tpsample
from tpsample import SamplingParams as SP

V = 100
NAN, INF = float("nan"), float("inf")

PARAM_ERRORS = [
    ("temperature", -0.1), ("temperature", NAN), ("temperature", INF), ("temperature", "1"), ("temperature", True),
    ("temperature", 10**400), ("temperature", 1e-45), ("temperature", 1e-7), ("temperature", 2e6),
    ("temperature", np.bool_(True)),
    ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.0001), ("top_p", NAN), ("top_p", 1e-40),
    ("top_k", 1e30), ("top_k", np.float64(3.0)), ("min_p", 1e-40),
    ("top_k", -2), ("top_k", 2.5), ("top_k", True), ("top_k", "5"),
    ("min_p", -0.01), ("min_p", 1.01), ("min_p", NAN),
    ("seed", 1.5), ("seed", "7"), ("seed", True),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", INF),
    ("repetition_penalty", 1e-300), ("repetition_penalty", 0.009), ("repetition_penalty", 101.0),
    ("frequency_penalty", 2.01), ("frequency_penalty", -2.01), ("frequency_penalty", NAN),
    ("presence_penalty", 2.01), ("presence_penalty", -2.01), ("presence_penalty", INF),
    ("min_tokens", -1), ("min_tokens", 1.5),
    ("max_tokens", 0), ("max_tokens", 2.0),
    ("logprobs", -1), ("logprobs", 1.5),
    ("logprobs_mode", "logits"), ("logprobs_mode", None),
    ("logit_bias", [(1, 2.0)]), ("logit_bias", {-1: 1.0}), ("logit_bias", {"a": 1.0}), ("logit_bias", {1: NAN}),
    ("logit_bias", {1: INF}), ("logit_bias", {t: 1.0 for t in range(1025)}),
    ("logit_bias", {5: 1e308}), ("logit_bias", {5: 3e38}), ("logit_bias", {5: 100.5}), ("logit_bias", {5: -101}),
    ("logit_bias", {True: 1.0}), ("logit_bias", {5: 10**400}),
    ("allowed_token_ids", []), ("allowed_token_ids", [-1]), ("allowed_token_ids", [1.5]), ("allowed_token_ids", 5),
    ("stop_token_ids", [-1]), ("stop_token_ids", ["a"]), ("stop_token_ids", 5),
    ("bad_words_token_ids", [[]]), ("bad_words_token_ids", [[-1]]), ("bad_words_token_ids", [1, 2]),
    ("bad_words_token_ids", [[1]] * 129), ("bad_words_token_ids", [[1] * 1025]), ("bad_words_token_ids", 5),
    # integers that would not fit the int64 / int32 tables they reach
    ("min_tokens", 2**63), ("min_tokens", 10**30), ("min_tokens", np.uint64(2**64 - 1)), ("max_tokens", 2**63),
    ("logprobs", 2**16 + 1), ("logprobs", 2**70), ("stop_token_ids", [2**31]), ("allowed_token_ids", [1, 2**40]),
    ("logit_bias", {2**31: 1.0}), ("logit_bias", {10**30: 1.0}), ("bad_words_token_ids", [[1, 2**63]]),
]


@pytest.mark.parametrize("field,value", PARAM_ERRORS, ids=[f"{f}={str(v)[:12]}" for f, v in PARAM_ERRORS])
def test_sampling_params_rejects_each_bad_value_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be"):
        SP(**{field: value})


def test_sampling_params_accepts_every_bound():
    for kw in ({"temperature": 0.0}, {"temperature": 1e-6}, {"temperature": 1e6}, {"top_p": 1.0}, {"top_p": 1e-9},
               {"top_p": 2.0**-126}, {"top_k": -1}, {"top_k": 0}, {"top_k": 1}, {"top_k": 10**30},
               {"min_p": 0.0}, {"min_p": 1.0}, {"min_p": 2.0**-126}, {"repetition_penalty": 0.01},
               {"repetition_penalty": 100}, {"logit_bias": {1: 100.0, 2: -100}}, {"frequency_penalty": 2.0},
               {"frequency_penalty": -2.0}, {"presence_penalty": 2}, {"presence_penalty": -2}, {"min_tokens": 0},
               {"max_tokens": 1}, {"logprobs": 0}, {"seed": -(2**70)}, {"seed": 2**200}, {"logprobs_mode": "processed"},
               {"min_tokens": 2**63 - 1}, {"max_tokens": 2**63 - 1}, {"logprobs": 2**16}, {"stop_token_ids": [2**31 - 1]},
               {"logit_bias": {2**31 - 1: 1.0}}, {"allowed_token_ids": [2**31 - 1]},
               {"logit_bias": {t: -100.0 for t in range(1024)}}, {"allowed_token_ids": [0]},
               {"bad_words_token_ids": [list(range(1024))] * 128}, {"stop_token_ids": []}):
        SP(**kw)


@pytest.mark.parametrize("field,value,allowed", [
    ("min_tokens", 2**63, "[0, 2**63)"), ("max_tokens", 10**30, "[1, 2**63)"), ("logprobs", 2**70, "[0, 65536]"),
    ("stop_token_ids", [2**31], "[0, 2**31)"), ("allowed_token_ids", [2**31], "[0, 2**31)"),
    ("logit_bias", {2**31: 1.0}, "[0, 2**31)"), ("bad_words_token_ids", [[2**31]], "[0, 2**31)"),
    ("seed", 1.5, "any size: used mod 2**64"),
])
def test_integers_too_wide_for_their_table_are_refused_naming_the_range(field, value, allowed):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be .*{re.escape(allowed)}"):
        SP(**{field: value})


def test_seeds_of_any_size_sample_as_the_seed_mod_2_64():
    x = torch.randn(1, V, generator=torch.Generator().manual_seed(2))
    got = {}
    for seed in (5, 5 + 2**64, 5 - 2**64, 5 + 2**200):
        s = sampler()
        s.add_request("a", SP(seed=seed), [1])
        got[seed] = [s.sample(x, s.plan(["a"])).tokens(0)[0] for _ in range(4)]
    assert len({tuple(v) for v in got.values()}) == 1


def test_sampling_params_is_frozen():
    p = SP()
    with pytest.raises(AttributeError):
        p.temperature = 0.5


def test_numpy_and_other_real_scalars_are_accepted_and_stored_as_python_numbers():
    p = SP(temperature=np.float32(0.5), top_k=np.int64(5), top_p=np.float16(0.5), min_p=np.float64(0.1),
           seed=np.uint64(2**63 + 1), repetition_penalty=np.int32(2), max_tokens=np.int8(3),
           logprobs=np.int64(2), ignore_eos=np.bool_(True), logit_bias={np.int64(3): np.float32(-2.5)},
           allowed_token_ids=np.arange(4).tolist() + [np.int64(9)], stop_token_ids=(np.int16(1),),
           bad_words_token_ids=[[np.int64(1), 2]])
    assert p == SP(temperature=0.5, top_k=5, top_p=0.5, min_p=0.1, seed=2**63 + 1, repetition_penalty=2.0,
                   max_tokens=3, logprobs=2, ignore_eos=True, logit_bias={3: -2.5}, allowed_token_ids=[0, 1, 2, 3, 9],
                   stop_token_ids=[1], bad_words_token_ids=[[1, 2]])
    for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
        assert type(getattr(p, name)) is float, name
    for name in ("top_k", "seed", "max_tokens", "logprobs"):
        assert type(getattr(p, name)) is int, name
    assert type(p.ignore_eos) is bool and all(type(t) is int for t in p.allowed_token_ids)


def test_containers_are_copied_and_frozen_at_construction():
    allowed, bias, words, stops = [1, 2, 3], {4: 1.0}, [[5, 6]], [7]
    p = SP(allowed_token_ids=allowed, logit_bias=bias, bad_words_token_ids=words, stop_token_ids=stops)
    allowed.append(V + 10)
    bias[V + 10] = 50.0
    words[0].append(V + 10)
    stops.append(V + 10)
    assert p.allowed_token_ids == (1, 2, 3) and p.logit_bias == {4: 1.0}
    assert p.bad_words_token_ids == ((5, 6),) and p.stop_token_ids == (7,)
    with pytest.raises(TypeError):
        p.logit_bias[4] = 2.0
    assert pickle.loads(pickle.dumps(p)) == p and hash(p) == hash(SP(
        allowed_token_ids=(1, 2, 3), logit_bias={4: 1.0}, bad_words_token_ids=[(5, 6)], stop_token_ids=[7]))
    s = sampler()
    s.add_request("a", p, [1])                  # the caller's out-of-range additions are not seen
    out = s.sample(torch.zeros(1, V), s.plan(["a"]))
    assert out.tokens(0)[0] in (1, 2, 3)


def test_top_k_at_or_above_the_vocabulary_is_normalised_to_off():
    assert SP(top_k=10**30).validate_for_vocab(V, 5) == SP(top_k=-1)
    assert SP(top_k=V).validate_for_vocab(V, 5).top_k == -1
    assert SP(top_k=V - 1).validate_for_vocab(V, 5).top_k == V - 1
    p = SP(top_k=3)
    assert p.validate_for_vocab(V, 5) is p


def test_sampler_treats_a_huge_top_k_as_off():
    x = torch.randn(1, V, generator=torch.Generator().manual_seed(3))
    got = {}
    for k in (-1, V, 10**12, 10**30):
        s = sampler()
        s.add_request("a", SP(top_k=k, seed=4), [1])
        got[k] = s.sample(x, s.plan(["a"])).tokens(0)
    assert got[10**30] == got[10**12] == got[V] == got[-1]


def test_params_at_the_range_bounds_keep_large_logits_finite():
    """At every bound that scales logits, rows with |l| up to 1e29 never reach the guard."""
    from tpsample import params as P
    x = torch.randn(4, V, generator=torch.Generator().manual_seed(5)) * 1e29
    edge = [SP(temperature=P.TEMPERATURE_RANGE[0], seed=1, logit_bias={3: P.LOGIT_BIAS_BOUND}),
            SP(temperature=P.TEMPERATURE_RANGE[0], repetition_penalty=P.REPETITION_PENALTY_RANGE[0], seed=2),
            SP(temperature=P.TEMPERATURE_RANGE[0], repetition_penalty=P.REPETITION_PENALTY_RANGE[1], seed=3,
               top_p=2.0**-126, logit_bias={3: -P.LOGIT_BIAS_BOUND}),
            SP(temperature=P.TEMPERATURE_RANGE[1], min_p=2.0**-126, seed=4)]
    for strategy in ("replicated", "vocab_parallel"):
        s = tpsample.Sampler(V, strategy=strategy, seed=0, max_num_reqs=4)
        for i, p in enumerate(edge):
            s.add_request(f"r{i}", p, list(range(0, V, 2)))       # half the vocabulary was seen
        out = s.sample(x, s.plan([f"r{i}" for i in range(4)]))
        assert out.num_fallback.tolist() == [0, 0, 0, 0], strategy


def test_draft_probs_rows_must_be_probabilities():
    s = two_requests()
    plan = s.plan(["a", "b"])
    x = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    good = torch.softmax(x, dim=1)
    for row, value in ((1, -0.25), (0, NAN), (1, INF), (0, 1.5)):
        q = good.clone()
        q[row, 7] = value
        with pytest.raises(ValueError, match=f"draft_probs row {row} must hold probabilities"):
            s.sample(x, plan, draft_probs=q)
    assert s.sample(x, plan, draft_probs=good).num_sampled.tolist() == [1, 1]


def test_an_all_zero_draft_row_is_rejected_on_full_rows_only():
    from tpsample.validation import check_draft_probs
    q = torch.full((3, V), 1.0 / V)
    q[1] = 0.0
    with pytest.raises(ValueError, match="draft_probs row 1"):
        check_draft_probs(q, 3, V, draft_rows=[0, 1], full_rows=True)
    check_draft_probs(q, 3, V, draft_rows=[0, 1], full_rows=False)     # a vocab shard may hold no mass
    check_draft_probs(q, 3, V, draft_rows=[0, 2], full_rows=True)      # row 1 verifies no draft


def test_sample_refuses_an_all_zero_draft_row_but_not_a_zero_bonus_row():
    s = tpsample.Sampler(V, seed=0, max_num_logits_per_req=2)
    s.add_request("a", SP(seed=1), [1, 2])
    plan = s.plan(["a"], draft_token_ids=[[3]])                  # row 0 verifies draft 3; row 1 is the bonus
    x = torch.randn(plan.num_rows, V, generator=torch.Generator().manual_seed(0))
    q = torch.softmax(x, dim=1)
    q[1] = 0.0
    assert 1 <= s.sample(x, plan, draft_probs=q).num_sampled.tolist()[0] <= 2
    plan = s.plan(["a"], draft_token_ids=[[3]])
    q = torch.softmax(x, dim=1)
    q[0] = 0.0
    with pytest.raises(ValueError, match="draft_probs row 0 must hold probabilities"):
        s.sample(x, plan, draft_probs=q)


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
    ("device", {"device": "tpu"}), ("device", {"device": "meta"}), ("device", {"device": "cuda:4096"}),
    ("device", {"device": 1.5}), ("device", {"device": "cpu:x"}),
    ("timeout_s", {"timeout_s": -1}), ("timeout_s", {"timeout_s": 0}), ("timeout_s", {"timeout_s": NAN}),
    ("timeout_s", {"timeout_s": INF}), ("timeout_s", {"timeout_s": "60"}), ("timeout_s", {"timeout_s": True}),
    ("seed", {"seed": 1.5}), ("seed", {"seed": "7"}), ("group", {"group": 5}),
    ("inplace_logits", {"inplace_logits": 1}), ("profile_memory", {"profile_memory": None}),
    ("check_plans", {"check_plans": "yes"}),
])
def test_sampler_constructor_rejects_bad_arguments(field, kw):
    kw = {"vocab_size": V, **kw}
    with pytest.raises(ValueError, match=field):
        tpsample.Sampler(kw.pop("vocab_size"), **kw)


def test_sampler_constructor_accepts_the_devices_that_exist_here():
    for device in (None, "cpu", torch.device("cpu"), "cpu:0"):
        assert tpsample.Sampler(V, seed=0, device=device).device == (None if device is None else torch.device(device))
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for device in ["cuda", f"cuda:{n - 1}", n - 1][: 3 if n else 0]:
        assert tpsample.Sampler(V, seed=0, device=device).device.type == "cuda"
    if not n:
        with pytest.raises(ValueError, match=r"device must be None or 'cpu' \(no CUDA device here\)"):
            tpsample.Sampler(V, seed=0, device="cuda")
    with pytest.raises(ValueError, match=rf"device must be .*N < {n}" if n else "no CUDA device"):
        tpsample.Sampler(V, seed=0, device=f"cuda:{n}")


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
