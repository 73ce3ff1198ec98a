"""What a captured step's replay relies on, on CPU tensors: the one-copy byte layout of the
results, the shared host buffer a graph refills on every replay (an output keeps its own values
whatever replays follow), the eager copy path, the guards checked before each replay, and which
plans capture refuses before it needs a GPU; and `CapturedStep.replay`'s host flow with a stand-in
for the graph that runs the recorded step again. The graph itself is tested in test_sampler_cuda.py."""
from __future__ import annotations

import gc

import fake_graphs
import numpy as np
import pytest
import torch

import tpsample
from tpsample import SamplingParams as P
from tpsample.replay import ReplayGuard
from tpsample.sampling.output import HostLayout, LogprobsOutput, ReplayResults, SamplerOutput

V = 50


def results(rows: int = 3, width: int = 3, max_rows: int = 1, fill: int = 0):
    block = torch.full((rows, max_rows + 4), fill, dtype=torch.int64)
    block[:, max_rows] = 1
    ids = torch.arange(rows * width, dtype=torch.int64).view(rows, width) + fill
    vals = torch.tensor([[-0.5, float("-inf"), float("nan")], [1e-40, -3.25, 0.0], [-0.0, 2.0, -7.5]])[:rows, :width]
    ranks = torch.arange(rows, dtype=torch.int64) + 1 + fill
    return block, LogprobsOutput(ids, vals + fill, ranks)


def test_layout_round_trip_is_bitwise():
    block, lp = results()
    layout = HostLayout(block, lp)
    assert layout.nbytes == block.numel() * 8 + lp.token_ids.numel() * 8 + lp.ranks.numel() * 8 + lp.logprobs.numel() * 4
    got_block, got = layout.unpack(layout.pack(block, lp).numpy().copy())
    assert torch.equal(torch.from_numpy(got_block), block)
    assert torch.equal(got.token_ids, lp.token_ids) and torch.equal(got.ranks, lp.ranks)
    assert torch.equal(got.logprobs.view(torch.int32), lp.logprobs.view(torch.int32))     # NaN, -0, denormal
    alone = HostLayout(block, None)
    assert alone.pack(block, None).data_ptr() == block.data_ptr()                         # no copy without logprobs
    with pytest.raises(ValueError, match="largest first"):
        HostLayout(block, LogprobsOutput(lp.token_ids.to(torch.int32), lp.logprobs, lp.ranks))


def test_eager_copy_reads_the_copy_not_the_device_tensors():
    block, lp = results(max_rows=2)
    block[:, 0], block[:, 1] = torch.tensor([5, 6, 7]), torch.tensor([9, -1, 8])
    block[:, 2] = torch.tensor([2, 1, 2])                                                 # num_sampled
    out = SamplerOutput(block, 2, lp)
    out._start_copy()                      # what the constructor does on CUDA (device-agnostic)
    want = block.clone(), lp.logprobs.clone()
    block.fill_(-7)                                      # the device tensors move on
    lp.logprobs.fill_(3.0)
    assert torch.equal(out.sampled_token_ids, want[0][:, :2]) and out.num_sampled.tolist() == [2, 1, 2]
    assert out.token_lists() == [[5, 9], [6], [7, 8]] and out.tokens(2) == [7, 8]
    assert torch.equal(out.logprobs.logprobs.view(torch.int32), want[1].view(torch.int32))
    block[:, 2] = torch.tensor([2, 1, 2])
    alone = SamplerOutput(block, 2)                      # no logprobs: the bytes are a view of the block
    alone._start_copy()
    block.fill_(-8)
    assert alone.token_lists() == [[-7, -7], [-7], [-7, -7]]


def test_cpu_output_fields_are_views_of_the_results():
    block, lp = results()
    block[:, 0] = torch.tensor([3, 1, 4])
    out = SamplerOutput(block, 1, lp)
    assert out.token_lists() == [[3], [1], [4]] and out.tokens(1) == [1]
    assert out.logprobs is lp and out.num_sampled.tolist() == [1, 1, 1]
    assert out.sampled_token_ids.data_ptr() == block.data_ptr()                 # no copy on CPU


class FakeStep:
    """What `CapturedStep.replay` does around its graph, with `fill` standing in for the graph
    (which writes the results, then copies them into the shared buffer)."""

    def __init__(self):
        self.block, self.lp = results()
        self.shared = ReplayResults(self.block, 1, self.lp)
        self.shared.fill()

    def replay(self, value: int) -> SamplerOutput:
        self.shared.release()
        block, lp = results(fill=value)
        self.block.copy_(block), self.lp.token_ids.copy_(lp.token_ids), self.lp.logprobs.copy_(lp.logprobs)
        self.lp.ranks.copy_(lp.ranks)
        self.shared.fill()
        return self.shared.publish()


def expect(out: SamplerOutput, value: int) -> None:
    block, lp = results(fill=value)
    assert out.token_lists() == block[:, :1].tolist()
    assert torch.equal(out.logprobs.token_ids, lp.token_ids) and torch.equal(out.logprobs.ranks, lp.ranks)
    assert torch.equal(out.logprobs.logprobs.view(torch.int32), lp.logprobs.view(torch.int32))


def test_replay_output_read_after_the_next_replay_keeps_its_values():
    step = FakeStep()
    first = step.replay(10)
    second = step.replay(20)               # overwrites the shared buffer: `first` took its copy before
    expect(first, 10)
    expect(second, 20)
    third = step.replay(30)
    held = third.sampled_token_ids, third.logprobs     # read before the next replay
    step.replay(40)
    step.replay(50)
    assert held[0].flatten().tolist() == [30, 30, 30] and held[1].ranks.tolist() == [31, 32, 33]
    assert not np.shares_memory(third._host_block(), step.shared.host_np)


def test_only_live_unread_outputs_are_copied_before_a_replay(monkeypatch):
    calls = []
    detach = SamplerOutput._detach
    monkeypatch.setattr(SamplerOutput, "_detach", lambda self: (calls.append(self), detach(self)))
    step = FakeStep()
    kept = step.replay(1)
    step.replay(2)                          # `kept` unread: detached
    assert calls == [kept] and kept._shared is None
    calls.clear()
    step.replay(3)                          # the previous output was dropped: nothing to do
    gc.collect()
    step.replay(4)
    assert calls == []
    expect(kept, 1)


def sampler(**params):
    s = tpsample.Sampler(V, seed=0, max_num_logits_per_req=3, eos_token_id=2, max_logprobs=5)
    for name, p in params.items():
        s.add_request(name, p, [1, 2])
    return s


@pytest.mark.parametrize("params, kwargs, match", [
    ({"a": P(seed=1)}, {"draft_token_ids": [[3, 4]]}, "draft tokens"),
    ({"a": P(seed=1)}, {"grammar_bitmask": torch.full((1, (V + 31) // 32), -1, dtype=torch.int32)}, "grammar mask"),
    ({"a": P(seed=1, logprobs=2), "b": P(seed=2, logprobs=3, logprobs_mode="processed")}, {}, r"\['b'\] ask for processed"),
    ({"a": P(seed=1, min_tokens=2)}, {}, r"min_tokens.*\['a'\]"),
    ({"a": P(seed=1, logprobs=5), "b": P(temperature=0, logprobs=0)}, {}, "CUDA logits"),   # raw logprobs: past the plan checks
    ({"a": P(seed=1, logprobs_mode="processed")}, {}, "CUDA logits"),          # processed mode, no logprobs asked
])
def test_capture_refuses_plans_it_cannot_record(params, kwargs, match):
    s = sampler(**params)
    with pytest.raises(ValueError, match=match):
        s.capture(s.plan(list(params), **kwargs), torch.zeros(1, V))


def test_capture_takes_min_tokens_requests_once_met():
    s = sampler(a=P(seed=1, min_tokens=2))
    plan = s.plan(["a"])
    for _ in range(2):
        s.sample(torch.randn(1, V), plan)
    with pytest.raises(ValueError, match="CUDA logits"):
        s.capture(plan, torch.zeros(1, V))


def test_replay_guard_refuses_stale_plans_full_history_and_new_tables():
    s = sampler(a=P(seed=1), b=P(seed=2))
    plan = s.plan(["a", "b"])
    s.sample(torch.randn(2, V), plan)                    # the tables exist now (on CPU)
    store = s.store
    guard = ReplayGuard(store, plan, store.history.capacity)
    guard.check()
    s.add_request("c", P(seed=3), [1])                   # another slot changes: the plan stays current
    guard.check()
    store.history.note_step(plan.slots[:1], np.array([store.history.capacity - 2]))
    guard.check()                                        # one token of room left
    store.history.note_step(plan.slots[:1], np.array([1]))
    with pytest.raises(ValueError, match="ran out of reserved history"):
        guard.check()

    guard = ReplayGuard(store, s.plan(["a", "b"]), 10**6)
    for i in range(20):                                  # more slots: an eager step grows the tables
        s.add_request(f"x{i}", P(seed=i), [1])
    guard.check()                                        # nothing reallocated until a sync
    s.sample(torch.randn(1, V), s.plan(["x19"]))
    with pytest.raises(ValueError, match="reallocated"):
        guard.check()

    guard = ReplayGuard(store, plan, 10**6)
    s.remove_request("b")
    s.add_request("b2", P(seed=9), [1])                  # takes b's slot
    with pytest.raises(ValueError, match="stale"):
        guard.check()


@pytest.fixture
def cpu_capture(monkeypatch):
    full_views = fake_graphs.install(monkeypatch)

    def make(s, plan, buffer, **kw):
        return s.capture(plan, buffer, **kw)
    make.full_views = full_views
    return make


def test_captured_step_replays_eager_outputs_read_later(cpu_capture):
    params = {"g": P(temperature=0, logprobs=3), "p": P(seed=1, top_p=0.9, logprobs=2),
              "f": P(seed=2, frequency_penalty=0.5, logprobs=0), "n": P(seed=3)}
    eager, graphed = sampler(**params), sampler(**params)
    ids = list(params)
    buffer = torch.zeros(len(ids), V)
    step = cpu_capture(graphed, graphed.plan(ids), buffer)
    assert cpu_capture.full_views == [True]            # recorded history views span the reserve
    assert not graphed.store.history.full_views
    g = torch.Generator().manual_seed(0)
    wants, gots = [], []
    for _ in range(4):
        x = torch.randn(len(ids), V, generator=g) * 3
        wants.append(eager.sample(x, eager.plan(ids)))
        buffer.copy_(x)
        gots.append(step.replay())
    for got, want in zip(gots, wants, strict=True):     # read after every replay
        assert got.token_lists() == want.token_lists()
        assert torch.equal(got.logprobs.token_ids, want.logprobs.token_ids)
        assert torch.equal(got.logprobs.logprobs.view(torch.int32), want.logprobs.logprobs.view(torch.int32))
        assert torch.equal(got.logprobs.ranks, want.logprobs.ranks)
    assert [graphed.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]
    assert graphed.store.history.upper.tolist() == eager.store.history.upper.tolist()
    graphed.remove_request("p")
    with pytest.raises(ValueError, match="stale"):
        step.replay()


def test_layout_packs_views_with_any_strides():
    """Result tensors can be views with unusual strides (a one-request block from a transpose,
    a column slice): their bytes still travel in row-major order."""
    wide = torch.arange(14, dtype=torch.int64).view(7, 2)
    one = wide[:, :1].t()                               # [1, 7], strides (1, 2)
    assert one.stride(-1) != 1
    got, _ = HostLayout(one, None).unpack(HostLayout.pack(one, None).numpy().copy())
    assert torch.equal(torch.from_numpy(got), one)
    single = (wide[:1, :1] + 5).t()[:, :1].as_strided((1, 1), (1, 2))
    _, lp = results(rows=1)
    lp = LogprobsOutput(lp.token_ids[:, :1].t().t(), lp.logprobs, torch.arange(3)[1:2])
    out = SamplerOutput(one, 3, None)
    out._start_copy()
    assert out.token_lists() == [one[0, :3].tolist()[: int(one[0, 3])]]
    got_block, got_lp = HostLayout(single, lp).unpack(HostLayout.pack(single, lp).numpy().copy())
    assert got_block.tolist() == [[5]] and got_lp.ranks.tolist() == [1]
