"""`Sampler(auto_graph=True)`: eager calls that repeat one plan over one logits buffer are
replayed from a captured graph with the eager tokens, and anything else is sampled eagerly.

CUDA graphs are stood in for on CPU (tests/fake_graphs.py); `autograph.wanted` is widened to CPU
logits for the test. The GPU test in test_sampler_cuda.py replays real graphs."""
import pytest
import torch

import fake_graphs
import tpsample
from tpsample import SamplingParams as P
from tpsample import autograph

V = 300
PARAMS = {"g": P(temperature=0, logprobs=2), "p": P(seed=1, top_p=0.9), "k": P(seed=2, top_k=5, top_p=0.8),
          "f": P(seed=3, frequency_penalty=0.5, repetition_penalty=1.2), "m": P(seed=4, min_p=0.1)}


@pytest.fixture
def cpu_graphs(monkeypatch):
    fake_graphs.install(monkeypatch)
    monkeypatch.setattr(autograph, "wanted", lambda s, logits, probs: s.auto_graph is not None and probs is None)


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


def test_replay_is_only_wanted_where_it_gives_the_eager_results():
    """Never with draft probabilities, in-place logits, memory profiling, CPU logits or
    auto_graph=False (and never at TP > 1: ranks could decide differently and hang)."""
    x = torch.zeros(2, V)
    on, off = tpsample.Sampler(V, auto_graph=True), tpsample.Sampler(V, auto_graph=False)
    inplace, profiled = tpsample.Sampler(V, inplace_logits=True), tpsample.Sampler(V, profile_memory=True)
    cuda_like = type("Logits", (), {"is_cuda": True})()
    assert autograph.wanted(on, cuda_like, None)
    assert not autograph.wanted(on, x, None)                      # CPU logits
    assert not autograph.wanted(on, cuda_like, torch.zeros(2, V))  # draft probabilities
    for s in (off, inplace, profiled):
        assert not autograph.wanted(s, cuda_like, None)
    on.group = type("TP2", (), {"size": 2})()                     # tp_size reads the group's size
    assert not autograph.wanted(on, cuda_like, None)
