"""`Sampler(auto_graph=True)`: eager calls that repeat one plan over one logits buffer are
replayed from a captured graph with the eager tokens, and anything else is sampled eagerly.

CUDA graphs are stood in for on CPU (tests/fake_graphs.py); `replay.AutoGraph.cuda_only` is lifted for CPU
logits for the test. The GPU test in test_sampler_cuda.py replays real graphs."""
import pytest
import torch

import fake_graphs
import tpsample
from tpsample import SamplingParams as P
from tpsample import replay as autograph

V = 300
PARAMS = {"g": P(temperature=0, logprobs=2), "p": P(seed=1, top_p=0.9), "k": P(seed=2, top_k=5, top_p=0.8),
          "f": P(seed=3, frequency_penalty=0.5, repetition_penalty=1.2), "m": P(seed=4, min_p=0.1)}


@pytest.fixture
def cpu_graphs(monkeypatch):
    fake_graphs.install(monkeypatch)
    monkeypatch.setattr(autograph.AutoGraph, "cuda_only", False)


def sampler(auto: bool):
    s = tpsample.Sampler(V, seed=5, auto_graph=auto)
    for rid, p in PARAMS.items():
        s.add_request(rid, p, [1, 2, 3])
    return s


def test_repeated_eager_calls_replay_with_the_eager_tokens(cpu_graphs):
    auto, eager = sampler(True), sampler(False)
    ids = list(PARAMS)
    buffer = torch.empty(len(ids), V)
    g = torch.Generator().manual_seed(0)
    steps = autograph.AFTER + 6
    for _ in range(steps):
        buffer.copy_(torch.randn(len(ids), V, generator=g) * 3)
        want = eager.sample(buffer.clone(), eager.plan(ids))
        got = auto.sample(buffer, auto.plan(ids))
        assert got.token_lists() == want.token_lists()
        assert torch.equal(got.logprobs.token_ids, want.logprobs.token_ids)
    assert auto.auto_graph.captures == 1
    assert auto.auto_graph.replays == steps - autograph.AFTER + 1
    assert [auto.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]


def test_a_new_buffer_or_plan_is_sampled_eagerly_and_counted_again(cpu_graphs):
    auto, eager = sampler(True), sampler(False)
    ids = list(PARAMS)
    g = torch.Generator().manual_seed(1)
    buffers = [torch.empty(len(ids), V) for _ in range(2)]
    for i in range(2 * autograph.AFTER):          # alternating buffers: never the same twice in a row
        x = buffers[i % 2]
        x.copy_(torch.randn(len(ids), V, generator=g))
        assert auto.sample(x, auto.plan(ids)).token_lists() == eager.sample(x.clone(), eager.plan(ids)).token_lists()
    assert auto.auto_graph.captures == 0
    for s in (auto, eager):
        s.remove_request("f")                     # a new plan: counting starts again
    ids = [r for r in ids if r != "f"]
    x = torch.empty(len(ids), V)
    for _ in range(autograph.AFTER + 1):
        x.copy_(torch.randn(len(ids), V, generator=g))
        assert auto.sample(x, auto.plan(ids)).token_lists() == eager.sample(x.clone(), eager.plan(ids)).token_lists()
    assert auto.auto_graph.captures == 1 and auto.auto_graph.replays == 2


def test_a_plan_capture_refuses_is_sampled_eagerly(cpu_graphs):
    auto, eager = sampler(True), sampler(False)
    for s in (auto, eager):
        s.add_request("proc", P(seed=9, logprobs=1, logprobs_mode="processed"), [4])
    ids = list(PARAMS) + ["proc"]
    x = torch.empty(len(ids), V)
    g = torch.Generator().manual_seed(2)
    for _ in range(autograph.AFTER + 2):
        x.copy_(torch.randn(len(ids), V, generator=g))
        assert auto.sample(x, auto.plan(ids)).token_lists() == eager.sample(x.clone(), eager.plan(ids)).token_lists()
    assert auto.auto_graph.captures == 0 and auto.auto_graph.refused


def test_replay_is_only_wanted_where_it_gives_the_eager_results(cpu_graphs, monkeypatch):
    """Never with draft probabilities, in-place logits, memory profiling, CPU logits or
    auto_graph=False (and never at TP > 1: ranks could decide differently and hang)."""
    on, off = tpsample.Sampler(V, auto_graph=True), tpsample.Sampler(V, auto_graph=False)
    inplace, profiled = tpsample.Sampler(V, inplace_logits=True), tpsample.Sampler(V, profile_memory=True)
    for s in (off, inplace, profiled):
        assert s.auto_graph is None
    asked = []
    monkeypatch.setattr(autograph.AutoGraph, "sample", lambda self, s, plan, logits: asked.append(plan))
    on.add_request("a", P(seed=1), [1])
    plan = on.plan(["a"])
    on.sample(torch.zeros(1, V), plan, draft_probs=torch.full((1, V), 1.0 / V))   # draft probabilities
    assert asked == []
    on.sample(torch.zeros(1, V), plan)
    assert asked == [plan]
    monkeypatch.setattr(autograph.AutoGraph, "cuda_only", True)
    on.sample(torch.zeros(1, V), plan)                                           # CPU logits
    assert asked == [plan]
    group = type("TP2", (), {"size": 2, "rank": 0, "timeout": None})()
    monkeypatch.setattr(tpsample.sampler.TPGroup, "resolve", staticmethod(lambda g, t: group))
    monkeypatch.setattr(tpsample.sampler.Collectives, "broadcast_int", lambda self, v: v)
    assert tpsample.Sampler(V, auto_graph=True, check_plans=False).auto_graph is None
