"""The Sampler on a GPU: the kernel path gives the CPU torch path's tokens on a mixed batch, and a
decode step captured in a CUDA graph replays with the tokens (and raw logprobs, bitwise) of eager
sampling on a twin sampler; a replay's output keeps its values whatever replays follow; penalties
and bad words recorded in the graph see the tokens later replays append; the guards refuse a
replay past the reserved history."""
from __future__ import annotations

import pytest
import torch

import tpsample
from tpsample import SamplingParams as P

pytestmark = pytest.mark.gpu
V = 1000


def mixed_params():
    return [P(temperature=0), P(temperature=0.8, top_k=20, top_p=0.9, seed=1), P(min_p=0.05, seed=2),
            P(top_p=0.6, seed=3, repetition_penalty=1.4, frequency_penalty=0.5), P(seed=4, logit_bias={7: 9.0}),
            P(seed=5, allowed_token_ids=[1, 2, 3]), P(top_k=3, seed=6, bad_words_token_ids=[[5], [9, 4]]),
            P(top_p=0.8, seed=7, logprobs=2), P(temperature=0.5, seed=8, logprobs=3, logprobs_mode="processed"),
            P(seed=9, min_tokens=2, top_k=50), P(top_p=0.9, seed=10)]


def run(device: str, steps: int = 4):
    s = tpsample.Sampler(V, seed=1, max_num_logits_per_req=3, eos_token_id=4, device=device)
    params = mixed_params()
    ids = [str(i) for i in range(len(params))]
    for i, p in enumerate(params):
        s.add_request(ids[i], p, [1, 2, 3])
    g = torch.Generator().manual_seed(0)
    got = []
    for step in range(steps):
        drafts = [[]] * (len(params) - 1) + [[4, 9]] if step % 2 else None
        plan = s.plan(ids, draft_token_ids=drafts)
        x = torch.randn(plan.num_rows, V, generator=g) * 3
        x[1, 5] = float("nan")
        out = s.sample(x.to(device), plan)
        got.append((out.token_lists(), out.num_nans.tolist(), out.num_fallback.tolist(),
                    out.logprobs.token_ids.tolist(), out.logprobs.logprobs))
    return got, [s.output_token_ids(r) for r in ids]


def test_cuda_kernel_path_gives_the_cpu_tokens():
    cpu, cpu_hist = run("cpu")
    gpu, gpu_hist = run("cuda")
    assert gpu_hist == cpu_hist
    for a, b in zip(cpu, gpu, strict=True):
        assert a[:4] == b[:4]
        assert torch.allclose(a[4], b[4].cpu(), atol=1e-5, rtol=0, equal_nan=True)


def test_captured_decode_step_replays_eager_tokens():
    params = [P(temperature=0), P(temperature=0.8, top_k=50, top_p=0.9, seed=1), P(min_p=0.1, seed=2),
              P(seed=3, repetition_penalty=1.2, frequency_penalty=0.3, top_p=0.95), P(seed=4)]
    samplers = []
    for _ in range(2):
        s = tpsample.Sampler(V, seed=7, device="cuda")
        for i, p in enumerate(params):
            s.add_request(str(i), p, [1, 2, 3])
        samplers.append(s)
    eager, graphed = samplers
    ids = [str(i) for i in range(len(params))]
    g = torch.Generator(device="cuda").manual_seed(0)
    buffer = torch.empty(len(params), V, device="cuda")
    step = graphed.capture(graphed.plan(ids), buffer)
    for _ in range(6):
        x = torch.randn(len(params), V, device="cuda", generator=g) * 3
        want = eager.sample(x, eager.plan(ids)).token_lists()
        buffer.copy_(x)
        assert step.replay().token_lists() == want
    assert [graphed.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]
    graphed.remove_request("1")
    with pytest.raises(ValueError, match="stale"):
        step.replay()


def twins(params, **kw):
    """Two samplers with the same requests: one samples eagerly, the other replays a capture."""
    out = []
    for _ in range(2):
        s = tpsample.Sampler(V, seed=7, device="cuda", eos_token_id=2, **kw)
        for i, p in enumerate(params):
            s.add_request(str(i), p, [1, 2, 3])
        out.append(s)
    return out, [str(i) for i in range(len(params))]


def same_output(a, b) -> None:
    assert a.token_lists() == b.token_lists()
    assert a.num_nans.tolist() == b.num_nans.tolist() and a.num_fallback.tolist() == b.num_fallback.tolist()
    if a.logprobs is None:
        assert b.logprobs is None
        return
    assert torch.equal(a.logprobs.token_ids.cpu(), b.logprobs.token_ids.cpu())
    assert torch.equal(a.logprobs.ranks.cpu(), b.logprobs.ranks.cpu())
    assert torch.equal(a.logprobs.logprobs.cpu().view(torch.int32), b.logprobs.logprobs.cpu().view(torch.int32))


LP_PARAMS = [P(temperature=0, logprobs=5), P(temperature=0.8, top_k=50, top_p=0.9, seed=1, logprobs=5),
             P(min_p=0.1, seed=2, logprobs=2), P(seed=3, repetition_penalty=1.2, frequency_penalty=0.3, logprobs=5),
             P(seed=4), P(seed=5, logprobs=0), P(seed=6, logprobs_mode="processed")]   # no logprobs asked


def test_captured_step_with_logprobs_replays_eager_tokens_and_logprobs():
    (eager, graphed), ids = twins(LP_PARAMS)
    g = torch.Generator(device="cuda").manual_seed(1)
    buffer = torch.empty(len(ids), V, device="cuda")
    step = graphed.capture(graphed.plan(ids), buffer)
    for _ in range(6):
        x = torch.randn(len(ids), V, device="cuda", generator=g) * 3
        x[1, 11] = float("nan")
        want = eager.sample(x, eager.plan(ids))
        buffer.copy_(x)
        got = step.replay()
        assert got.logprobs.token_ids.shape == (len(ids), 6)
        same_output(got, want)
    assert [graphed.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]


@pytest.mark.parametrize("gpu_busy", [True, False])
def test_replay_output_read_after_later_replays_keeps_its_values(gpu_busy):
    """Outputs are read only after every replay. gpu_busy: each replay queues behind a long GPU
    sleep, so the previous replay is still running when the next one starts (its output's copy is
    queued on the stream: at least the first, before any other host work can drain the GPU);
    else the GPU is drained before each replay (the host copies the finished bytes)."""
    (eager, graphed), ids = twins(LP_PARAMS)
    g = torch.Generator(device="cuda").manual_seed(2)
    xs = [torch.randn(len(ids), V, device="cuda", generator=g) * 3 for _ in range(4)]
    wants = [eager.sample(x, eager.plan(ids)) for x in xs]
    buffer = torch.empty(len(ids), V, device="cuda")
    step = graphed.capture(graphed.plan(ids), buffer)
    gots = []
    for x in xs:                                   # nothing but the replays between replays
        if gpu_busy:
            torch.cuda._sleep(50_000_000)          # tens of milliseconds of GPU time
        else:
            torch.cuda.synchronize()
        buffer.copy_(x)
        gots.append(step.replay())
    queued = [o._pending is not None for o in gots[:-1]]
    assert queued[0] if gpu_busy else not any(queued)
    for got, want in zip(gots, wants, strict=True):
        same_output(got, want)


def test_replay_output_read_before_the_next_replay_is_its_own():
    (eager, graphed), ids = twins(LP_PARAMS)
    g = torch.Generator(device="cuda").manual_seed(3)
    buffer = torch.empty(len(ids), V, device="cuda")
    step = graphed.capture(graphed.plan(ids), buffer)
    held = []
    for _ in range(3):
        x = torch.randn(len(ids), V, device="cuda", generator=g) * 3
        want = eager.sample(x, eager.plan(ids))
        buffer.copy_(x)
        got = step.replay()
        held.append((got.sampled_token_ids, got.logprobs.logprobs, want.sampled_token_ids, want.logprobs.logprobs))
    for ids_got, lp_got, ids_want, lp_want in held:
        assert torch.equal(ids_got, ids_want) and torch.equal(lp_got.view(torch.int32), lp_want.view(torch.int32))


def test_captured_penalties_and_bad_words_see_the_tokens_replays_append():
    """Greedy rows whose best token changes only through their own history: 8 leads 7 by less
    than the frequency penalty, and the bad word (8, 8) bans 8 right after an 8. A graph whose
    history views stopped at the length seen at capture would repeat 8 forever. Captured after
    two eager steps, with a min_tokens request that is met by then."""
    params = [P(temperature=0, frequency_penalty=2.0), P(temperature=0, presence_penalty=2.0),
              P(temperature=0, repetition_penalty=3.0), P(temperature=0, bad_words_token_ids=[[8, 8]]),
              P(temperature=0, min_tokens=2)]
    (eager, graphed), ids = twins(params)
    x = torch.rand(len(ids), V, device="cuda")
    x[:, 8], x[:, 7] = 5.0, 4.5
    plan = {s: s.plan(ids) for s in (eager, graphed)}
    for _ in range(2):
        for s in (eager, graphed):
            s.sample(x.clone(), plan[s]).token_lists()
    buffer = x.clone()
    step = graphed.capture(plan[graphed], buffer)
    for _ in range(6):
        same_output(step.replay(), eager.sample(x.clone(), plan[eager]))
    assert [graphed.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]
    assert len(set(eager.output_token_ids("0"))) > 1 and len(set(eager.output_token_ids("3"))) > 1


def test_replay_stops_at_the_reserved_history():
    (eager, graphed), ids = twins([P(seed=1), P(temperature=0, frequency_penalty=0.5)])
    buffer = torch.randn(len(ids), V, device="cuda")
    step = graphed.capture(graphed.plan(ids), buffer, reserve_tokens=1)
    limit = graphed.store.history.capacity
    for _ in range(limit):                             # the last replay writes the last reserved column
        same_output(step.replay(), eager.sample(buffer.clone(), eager.plan(ids)))
    with pytest.raises(ValueError, match="ran out of reserved history"):
        step.replay()
    assert [graphed.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]


def test_auto_graph_replays_repeated_eager_calls_with_the_eager_tokens():
    from tpsample import replay as autograph
    params = [P(temperature=0), P(temperature=0.8, top_k=50, top_p=0.9, seed=1), P(top_p=0.9, seed=2),
              P(min_p=0.1, seed=3, logprobs=2), P(seed=4, repetition_penalty=1.2, frequency_penalty=0.3)]
    auto, eager = (tpsample.Sampler(V, seed=7, device="cuda", auto_graph=a) for a in (True, False))
    ids = [str(i) for i in range(len(params))]
    for s in (auto, eager):
        for i, p in enumerate(params):
            s.add_request(ids[i], p, [1, 2, 3])
    buffer = torch.empty(len(ids), V, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(autograph.AFTER + 5):
        buffer.copy_(torch.randn(len(ids), V, device="cuda", generator=g) * 3)
        want = eager.sample(buffer.clone(), eager.plan(ids))
        got = auto.sample(buffer, auto.plan(ids))
        assert got.token_lists() == want.token_lists()
        assert torch.equal(got.logprobs.token_ids, want.logprobs.token_ids)
    assert auto.auto_graph.captures == 1 and auto.auto_graph.replays == 6
    assert [auto.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]


@pytest.mark.parametrize("penalties", [False, True])
def test_auto_replay_follows_a_new_logits_buffer_every_call(penalties):
    """Eager calls whose logits come in a new allocation each step (a view of a wider one here)
    replay the step's launch list with integer pointers: the eager tokens and logprobs, bitwise.
    A step with penalties (a torch copy of the logits) is refused and stays eager."""
    from tpsample import replay as autograph
    params = [P(temperature=0), P(temperature=0.8, top_k=50, top_p=0.9, seed=1), P(top_p=0.9, seed=2),
              P(min_p=0.1, seed=3, logprobs=2), P(seed=4, temperature=0.7)]
    if penalties:
        params.append(P(seed=5, repetition_penalty=1.2, frequency_penalty=0.3))
    auto, eager = (tpsample.Sampler(V, seed=7, device="cuda", auto_graph=a) for a in (True, False))
    ids = [str(i) for i in range(len(params))]
    for s in (auto, eager):
        for i, p in enumerate(params):
            s.add_request(ids[i], p, [1, 2, 3])
    g = torch.Generator(device="cuda").manual_seed(0)
    steps = autograph.AFTER + 5
    held = []                      # all alive: a new address every call
    for _ in range(steps):
        wide = torch.randn(len(ids), V + 64, device="cuda", generator=g) * 3
        held.append(wide)
        x = wide[:, 32:32 + V]
        want = eager.sample(x.clone(), eager.plan(ids))
        got = auto.sample(x, auto.plan(ids))
        assert got.token_lists() == want.token_lists()
        assert torch.equal(got.logprobs.token_ids, want.logprobs.token_ids)
        assert torch.equal(got.logprobs.logprobs, want.logprobs.logprobs)
    ag = auto.auto_graph
    assert ag.captures == 0 and ag.tapes == 1
    assert ag.tape_replays == (0 if penalties else steps - autograph.AFTER)
    assert [auto.output_token_ids(r) for r in ids] == [eager.output_token_ids(r) for r in ids]
