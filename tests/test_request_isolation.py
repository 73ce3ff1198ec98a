"""A request that fails to be added leaves the sampler exactly as it was: no slot taken, no table
row changed, no seed serial used; so the requests after it are placed and sampled as if it had
never been tried (the same slots and the same tokens), and a full sampler still takes new ones."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tpsample
from tpsample import SamplingParams as SP

V = 100


def _tampered(**fields) -> SP:
    """Params whose fields bypassed validation (as a stale pickle could): the store must still
    refuse them without side effects."""
    p = SP()
    for name, value in fields.items():
        object.__setattr__(p, name, value)
    return p


def _state(s: tpsample.Sampler) -> dict:
    """Everything an add writes, up to the slots ever used."""
    st, hw = s.store, s.store.slots.high_water
    return {
        "high_water": hw, "freed": sorted(st.slots._freed), "generation": st.slots.generation[:hw].tolist(),
        "prints": st.slots.prints[:hw].tolist(), "requests": sorted(st.slots.requests), "serial": s._serial,
        "f32": st.f32.host[:, :hw].tolist(), "i64": st.i64.host[:, :hw].tolist(),
        "history": (st.history.upper[:hw].tolist(),
                                                                   list(st.history._reset)),
        "padded": {name: (t.lengths[:hw].tolist(), {k: v.tolist() for k, v in t._staged.items()})
                   for name, t in st.padded.items()},
    }


def _inject_failure(monkeypatch, s: tpsample.Sampler, where: str) -> None:
    """Make the next add fail late, after some of its rows were written."""
    def boom(*args, **kwargs):
        raise RuntimeError(f"injected failure in {where}")
    target = {"history": s.store.history, "register": s.store.slots}[where]
    monkeypatch.setattr(target, {"history": "reset", "register": "register"}[where], boom)


@pytest.mark.parametrize("params", [_tampered(min_tokens=2**63, stop_token_ids=(5,)),
                                    _tampered(min_tokens=10**30, stop_token_ids=(5,)),
                                    _tampered(logprobs=2**64), _tampered(repetition_penalty=1.5,
                                                                         allowed_token_ids=(2**40,))])
def test_failed_add_request_leaves_no_slot_behind(params):
    s = tpsample.Sampler(V, max_num_reqs=2, seed=0, max_logprobs=5)
    for i in range(3):
        with pytest.raises((OverflowError, ValueError)):
            s.add_request(f"bad{i}", params, [1, 2])
    assert s.store.slots.high_water == 0 and not s.store.slots.requests
    assert [s.add_request("a", SP(), [1]), s.add_request("b", SP(), [1])] == [0, 1]


@pytest.mark.parametrize("where", ["history", "register"])
@pytest.mark.parametrize("freed", [False, True], ids=["fresh_slot", "freed_slot"])
def test_a_late_failure_in_add_request_restores_every_table(monkeypatch, where, freed):
    s = tpsample.Sampler(V, max_num_reqs=4, seed=0)
    s.add_request("a", SP(logit_bias={3: 1.0}, repetition_penalty=1.2, min_tokens=2, stop_token_ids=[5]), [1, 2])
    s.add_request("b", SP(), [4])
    if freed:
        s.remove_request("a")                  # the failing add takes slot 0 from the freed heap
    before = _state(s)
    with monkeypatch.context() as mp:
        _inject_failure(mp, s, where)
        with pytest.raises(RuntimeError, match="injected"):
            s.add_request("c", SP(allowed_token_ids=[1, 2], bad_words_token_ids=[[7, 8]], logprobs=2,
                                  repetition_penalty=1.5, temperature=0.5), [9, 9, 3])
    assert _state(s) == before
    assert s.add_request("c", SP(), [1]) == (0 if freed else 2)


def _tokens_after(failures: int, monkeypatch) -> tuple[list, list]:
    """Slots and 3 steps of tokens of unseeded requests, after `failures` failed adds."""
    s = tpsample.Sampler(V, max_num_reqs=3, seed=11)
    s.add_request("x", SP(), [1])
    for i in range(failures):
        with pytest.raises((OverflowError, ValueError)):
            s.add_request(f"bad{i}", _tampered(min_tokens=2**64, stop_token_ids=(5,)), [1])
        with monkeypatch.context() as mp:
            _inject_failure(mp, s, "history")
            with pytest.raises(RuntimeError):
                s.add_request(f"late{i}", SP(), [2])
    slots = [s.add_request(r, SP(), [3, 4]) for r in ("y", "z")]
    g = torch.Generator().manual_seed(0)
    steps = [s.sample(torch.randn(3, V, generator=g), s.plan(["x", "y", "z"])).sampled_token_ids.tolist()
             for _ in range(3)]
    return slots, steps


def test_failed_adds_change_neither_later_slots_nor_derived_seeds(monkeypatch):
    """Unseeded requests derive their seed from the add order: a failed add must not use a serial
    (ranks where it failed and ranks that never saw it would otherwise sample differently)."""
    assert _tokens_after(2, monkeypatch) == _tokens_after(0, monkeypatch)


def test_a_full_sampler_refuses_without_taking_anything_and_accepts_after_a_remove():
    s = tpsample.Sampler(V, max_num_reqs=1, seed=0)
    s.add_request("a", SP(), [1])
    before = _state(s)
    with pytest.raises(ValueError, match="no free slot"):
        s.add_request("b", SP(), [1])
    with pytest.raises(ValueError, match="already active"):
        s.add_request("a", SP(), [1])
    assert _state(s) == before
    s.remove_request("a")
    assert s.add_request("b", SP(), [1]) == 0


@pytest.mark.parametrize("prompt", [[2**63], [10**30], np.array([2**62], dtype=np.int64), [-(2**70)]])
def test_out_of_range_prompt_ids_are_refused_before_a_slot_is_taken(prompt):
    s = tpsample.Sampler(V, max_num_reqs=1, seed=0)
    with pytest.raises(ValueError, match=r"prompt_token_ids must be token ids in \[0, 100\)"):
        s.add_request("a", SP(), prompt)
    assert s.add_request("a", SP(), [1]) == 0
