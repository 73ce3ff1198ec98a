"""The fused Triton path inside the Sampler gives the torch pipeline's tokens over steps with and
without drafts (penalties then read the device history in its two forms), run on CPU through
Triton's interpreter; on the GPU the same comparison runs with TPSAMPLE_TEST_DEVICE=cuda."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, torch, tpsample
from interpreter import speed_up_device_calls
speed_up_device_calls()
import tpsample.kernels.sample as dispatch
from tpsample import SamplingParams as P
kernel_calls = [0]
_sample_rows = dispatch.sample_rows
def _counted(*a, **k):
    kernel_calls[0] += 1
    return _sample_rows(*a, **k)
dispatch.sample_rows = _counted        # the fast path looks it up at call time
V = 301
params = [P(temperature=0), P(temperature=0.8, top_k=20, top_p=0.9, seed=1), P(min_p=0.05, seed=2),
          P(top_p=0.6, seed=3, repetition_penalty=1.4, frequency_penalty=0.5), P(seed=4, logit_bias={7: 9.0}),
          P(seed=5, allowed_token_ids=[1, 2, 3]), P(top_k=3, seed=6, bad_words_token_ids=[[5]]),
          P(top_p=0.8, seed=7, logprobs=2), P(temperature=0.5, seed=8, repetition_penalty=1.3, presence_penalty=0.4)]
s = tpsample.Sampler(V, seed=1, max_num_logits_per_req=3)
for i, p in enumerate(params):
    s.add_request(str(i), p, [1, 2, 3])
out = []
g = torch.Generator().manual_seed(0)
for step in range(6):
    # the last request verifies drafts in steps 0, 2 and 5; the other steps have none (their
    # penalties read the history kept ascending on the device)
    drafts = [[]] * (len(params) - 1) + [[4, 9]] if step in (0, 2, 5) else None
    plan = s.plan([str(i) for i in range(len(params))], draft_token_ids=drafts)
    x = torch.randn(plan.num_rows, V, generator=g) * 3
    x[:, 10:13] += 6.0                                   # likely tokens repeat: penalties count them
    x[1, 5] = float("nan")
    if step == 2:
        x[2] = float("-inf")
    o = s.sample(x.to(torch.bfloat16).float() if step == 1 else x, plan)
    out.append([o.sampled_token_ids.tolist(), o.num_nans.tolist(), o.num_fallback.tolist(),
                o.logprobs.token_ids.tolist(), [round(v, 5) for v in o.logprobs.logprobs[:, 0].tolist()]])
inplace = tpsample.Sampler(V, seed=1, inplace_logits=True)   # the engine's setting: NaNs still counted
for i, p in enumerate(params):
    inplace.add_request(str(i), p, [1, 2, 3])
for step in range(2):
    x = torch.randn(len(params), V, generator=g) * 3
    x[:, 7:9] = float("nan")
    o = inplace.sample(x, inplace.plan([str(i) for i in range(len(params))]))
    out.append([o.sampled_token_ids.tolist(), o.num_nans.tolist()])
empty = s.plan([])             # a step with no rows (a batch_sharded rank that owns none)
o = s.sample(torch.zeros(empty.num_rows, V), empty)
out.append(o.sampled_token_ids.shape[0])
dispatch.sample_rows = _sample_rows
print("RESULT" + json.dumps({"steps": out, "kernel_calls": kernel_calls[0]}))
"""


def _result(stdout: str):
    line = [x for x in stdout.splitlines() if x.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def _run(extra_env):
    """In a fresh process: triton.jit reads TRITON_INTERPRET when the kernels are defined (the
    tests' folder goes on its path for `interpreter`)."""
    env = dict(os.environ, **extra_env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(__file__), env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return _result(res.stdout)


def _run_here(monkeypatch):
    """The torch pipeline in this process (no kernels on CPU unless asked for)."""
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "0")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(SCRIPT, {})
    return _result(out.getvalue())


def test_fused_kernel_path_gives_the_torch_pipeline_tokens(monkeypatch):
    torch_path = _run_here(monkeypatch)
    kernel_path = _run({"TRITON_INTERPRET": "1", "TPSAMPLE_KERNELS_ON_CPU": "1"})
    assert kernel_path["kernel_calls"] > 0 and torch_path["kernel_calls"] == 0   # two different paths ran
    assert kernel_path["steps"] == torch_path["steps"]
    assert any(f for step in torch_path["steps"] for f in step[2])      # the guard row was exercised
    assert any(n for step in torch_path["steps"] for n in step[1])      # NaNs were counted


COUNTS = r"""
import json, torch, tpsample
from tpsample import SamplingParams as P
V = 1500
s = tpsample.Sampler(V, seed=1)
top_p = [P(temperature=0.8, top_p=0.9, seed=i) for i in range(3)] + [P(top_p=0.5, min_p=0.02, seed=3)]
others = [P(temperature=0.8, top_k=20, top_p=0.9, seed=4), P(min_p=0.05, seed=5), P(temperature=0)]
for i, p in enumerate(top_p + others):
    s.add_request(str(i), p, [1, 2, 3])
ids = [str(i) for i in range(len(top_p) + len(others))]
counts = (s.kernel_listed_rows, s.kernel_lean_rows, s.kernel_fallback_rows)
before = [c() for c in counts]
g = torch.Generator().manual_seed(0)
for _ in range(2):
    s.sample(torch.randn(len(ids), V, generator=g) * 3, s.plan(ids))
print("RESULT" + json.dumps(dict(zip(("listed", "lean", "fallback"), [c() - b for c, b in zip(counts, before)]))))
"""


def test_the_sampler_counts_the_top_p_rows_its_kernels_settled_from_their_list():
    """Top-p rows without top-k (min-p allowed) on ordinary logits are settled from their list,
    and the sampler says so; top-k, min-p-only and greedy rows never count there, none takes the
    lean pass and nothing falls back."""
    env = dict(os.environ, TRITON_INTERPRET="1", TPSAMPLE_KERNELS_ON_CPU="1")
    res = subprocess.run([sys.executable, "-c", COUNTS], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _result(res.stdout) == {"listed": 8, "lean": 0, "fallback": 0}     # 4 top-p rows x 2 steps
