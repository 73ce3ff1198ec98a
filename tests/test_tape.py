"""`replay.TapedStep`: a decode step recorded as its kernel launches and replayed over new logits
buffers gives the eager tokens and logprobs; a step with device work outside the kernels is
refused (and still sampled once); the automatic replay follows a buffer that moves; a replay's
host work is the launches and a bounded number of Python calls.

The sampling kernels run on CPU tensors through Triton's interpreter (TPSAMPLE_KERNELS_ON_CPU);
the GPU test in test_sampler_cuda.py replays real launches with integer pointers."""
import cProfile
import pstats

import pytest
import torch

import tpsample
from tpsample import SamplingParams as P
from tpsample import replay as autograph

pytest.importorskip("triton")
pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning"),   # numpy's inf - inf in masked lanes
              pytest.mark.skipif(torch.cuda.is_available(),         # the interpreter is set up only without CUDA
                                 reason="CPU kernels through the interpreter; test_sampler_cuda.py runs the GPU case")]

V = 300
PARAMS = {"k": P(seed=2, top_k=20, top_p=0.9), "g": P(temperature=0, logprobs=2), "p": P(seed=1, top_p=0.8),
          "m": P(seed=4, min_p=0.1, logprobs=3), "t": P(seed=5, temperature=0.7)}


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")


def sampler(params=PARAMS, auto=False):
    s = tpsample.Sampler(V, seed=5, auto_graph=auto)
    for rid, p in params.items():
        s.add_request(rid, p, [1, 2, 3])
    return s


def buffers(n, rows, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, V, generator=g) * 3 for _ in range(n)]     # all alive: distinct pointers


def same(a, b):
    assert a.token_lists() == b.token_lists()
    if b.logprobs is not None:
        assert torch.equal(a.logprobs.token_ids, b.logprobs.token_ids)
        assert torch.equal(a.logprobs.logprobs, b.logprobs.logprobs)


def test_launch_list_replays_give_the_eager_tokens_over_new_buffers(kernels_on_cpu):
    from tpsample.replay import TapedStep
    taped, eager = sampler(), sampler()
    ids = list(PARAMS)
    xs = buffers(4, len(ids), 0)
    step = TapedStep(taped, taped.plan(ids), xs[0])
    assert step.refused is None
    plan = eager.plan(ids)
    same(step.first, eager.sample(xs[0].clone(), plan))
    for x in xs[1:]:
        same(step.replay(x), eager.sample(x.clone(), plan))
    assert [taped.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]
    with pytest.raises(ValueError, match="strides"):
        step.replay(torch.randn(V, len(ids)).t())


def test_a_step_with_device_work_outside_the_kernels_is_refused_and_sampled_once(kernels_on_cpu):
    """Penalties copy the logits with a torch operation, which a launch list cannot repeat."""
    from tpsample.replay import TapedStep
    params = {**PARAMS, "f": P(seed=3, frequency_penalty=0.5, repetition_penalty=1.2)}
    taped, eager = sampler(params), sampler(params)
    ids = list(params)
    xs = buffers(2, len(ids), 1)
    step = TapedStep(taped, taped.plan(ids), xs[0])
    assert step.refused is not None and "device work" in step.refused
    same(step.first, eager.sample(xs[0].clone(), eager.plan(ids)))
    with pytest.raises(ValueError, match="cannot be replayed"):
        step.replay(xs[1])
    same(taped.sample(xs[1], taped.plan(ids)), eager.sample(xs[1].clone(), eager.plan(ids)))   # history once


def test_the_automatic_replay_follows_a_moving_buffer(kernels_on_cpu, monkeypatch):
    monkeypatch.setattr(autograph.AutoGraph, "cuda_only", False)
    auto, eager = sampler(auto=True), sampler()
    ids = list(PARAMS)
    steps = autograph.AFTER + 3
    for x in buffers(steps, len(ids), 2):
        same(auto.sample(x, auto.plan(ids)), eager.sample(x.clone(), eager.plan(ids)))
    ag = auto.auto_graph
    assert (ag.captures, ag.tapes, ag.tape_replays) == (0, 1, steps - autograph.AFTER)
    assert [auto.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]


def test_a_replay_is_its_launches_and_a_bounded_number_of_python_calls(kernels_on_cpu, monkeypatch):
    """The replay's host work without the launches themselves (one C call each on a GPU): this
    batch (every filter, raw logprobs) is 13 launches and 107 Python calls in all (measured when
    this test was written; the eager step makes about 400), bounded at 120; 14 launches since
    top-p rows without top-k take the list kernel and the bins pass (one launch more)."""
    from tpsample import replay as tape
    from tpsample.kernels import launcher as relaunch
    s = sampler()
    ids = list(PARAMS)
    xs = buffers(3, len(ids), 3)
    step = tape.TapedStep(s, s.plan(ids), xs[0])
    launched = []
    monkeypatch.setattr(relaunch._Launch, "launch", lambda self, ptrs, tensors, stream: launched.append(self))
    step.replay(xs[1]).token_lists()
    prof = cProfile.Profile()
    prof.enable()
    step.replay(xs[2]).token_lists()
    prof.disable()
    assert len(launched) == 2 * len(step._launches) and 0 < len(step._launches) <= 14
    assert pstats.Stats(prof).total_calls <= 120
