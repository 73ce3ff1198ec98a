"""The engine's sampler graphs (`engine.sampler_graphs.SamplerGraphs`) give eager sampling's
tokens step for step while they capture a stable batch once, replay it, fall back to eager
sampling when the batch changes or a replay is refused, and never retry a plan capture refused.
On CPU tensors with CUDA graphs stood in for (fake_graphs); the real graphs: test_sampler_cuda.py."""
from __future__ import annotations

import fake_graphs
import torch

import tpsample
from tpsample import SamplingParams as P
from tpsample.engine.sampler_graphs import STREAK, SamplerGraphs

V = 60


def sampler(params: dict):
    s = tpsample.Sampler(V, seed=3, eos_token_id=2, max_logprobs=5)
    for name, p in params.items():
        s.add_request(name, p, [1, 2, 3])
    return s


PARAMS = {"a": P(seed=1, top_k=10, top_p=0.9), "b": P(temperature=0, frequency_penalty=0.7, logprobs=2),
          "c": P(seed=2, repetition_penalty=1.3, bad_words_token_ids=[[5, 6]])}


def test_stable_batches_are_captured_once_and_replay_eager_tokens(monkeypatch):
    fake_graphs.install(monkeypatch)
    eager, graphed = sampler(PARAMS), sampler(PARAMS)
    graphs = SamplerGraphs(graphed)
    buffer = torch.zeros(3, V)
    g = torch.Generator().manual_seed(0)
    batches = [["a", "b", "c"]] * 8 + [["a", "c"]] * 2 + [["a", "b", "c"]] * 6 + [["c", "a", "b"]] * 2
    for step, ids in enumerate(batches):
        if step == 8:
            graphed.remove_request("b"), eager.remove_request("b")
        if step == 10:
            graphed.add_request("b", PARAMS["b"], [4]), eager.add_request("b", PARAMS["b"], [4])
        x = torch.randn(len(ids), V, generator=g) * 3
        x[:, 8:10] += 4.0                                   # repeats: the penalties matter
        view = buffer[: len(ids)]
        view.copy_(x)
        got = graphs.sample(view, graphed.plan(ids))
        want = eager.sample(x, eager.plan(ids))
        assert got.token_lists() == want.token_lists(), step
        if want.logprobs is not None:
            assert torch.equal(got.logprobs.token_ids, want.logprobs.token_ids)
    assert [graphed.output_token_ids(r) for r in "abc"] == [eager.output_token_ids(r) for r in "abc"]
    # captured after STREAK steps of each stable batch: steps 2 and 12 (the 2-request batch and the
    # reordered one are too short)
    assert graphs.num_captures == 2
    assert graphs.num_replays == (8 - STREAK + 1) + (6 - STREAK + 1)


def test_a_plan_capture_refuses_is_sampled_eagerly_without_asking_again(monkeypatch):
    fake_graphs.install(monkeypatch)
    calls = []
    params = {"a": P(seed=1, min_tokens=50), "b": P(seed=2)}        # min_tokens still to reach
    graphed, eager = sampler(params), sampler(params)
    capture = graphed.capture
    monkeypatch.setattr(graphed, "capture", lambda *a, **k: (calls.append(1), capture(*a, **k))[1])
    graphs = SamplerGraphs(graphed)
    buffer = torch.randn(2, V)
    for _ in range(6):
        got = graphs.sample(buffer, graphed.plan(["a", "b"]))
        assert got.token_lists() == eager.sample(buffer.clone(), eager.plan(["a", "b"])).token_lists()
    assert len(calls) == 1 and graphs.num_captures == 0 and graphs.num_replays == 0


def test_a_refused_replay_falls_back_and_captures_again(monkeypatch):
    fake_graphs.install(monkeypatch)
    eager, graphed = sampler(PARAMS), sampler(PARAMS)
    graphs = SamplerGraphs(graphed)
    ids = ["a", "b", "c"]
    buffer = torch.randn(3, V)
    for _ in range(STREAK):
        graphs.sample(buffer, graphed.plan(ids)), eager.sample(buffer.clone(), eager.plan(ids))
    assert graphs.num_captures == 1
    plan = graphed.plan(ids)
    history = graphed.store.history
    graphed.store.sync(torch.device("cpu"), history.capacity + 1)      # the history moves (grows)
    assert graphed.plan(ids) is plan and graphs.step.plan is plan       # the same plan: a replay is tried
    for _ in range(STREAK + 1):
        got = graphs.sample(buffer, graphed.plan(ids))
        assert got.token_lists() == eager.sample(buffer.clone(), eager.plan(ids)).token_lists()
    assert graphs.num_captures == 2
