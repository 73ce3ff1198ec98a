"""The Sampler on a GPU: the kernel path gives the CPU torch path's tokens on a mixed batch, and a
decode step captured in a CUDA graph replays with the tokens of eager sampling."""
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
