"""The host work of one eager sampling step stays bounded: kernel launches and Python calls per
step are counted (never timed) on the kernel path with every Triton launch stubbed out, so a
change that adds launches or per-step Python shows here before it shows on a GPU.

The bounds are the counts measured when this test was written (238 / 262 / 275 Python calls and
5 / 8 / 10 launches for greedy / top-k + top-p / top-p alone at 64 rows) with a ~15% margin on
the calls; raise one only with a measured reason. Top-p alone later took an 11th launch: the
list kernel, which settles such rows from one list, and the bins pass for the rows it leaves
replaced the bracket kernel (device time 207 -> see docs/benchmarks.md)."""
import cProfile
import pstats

import pytest
import torch

pytest.importorskip("triton")

ROWS, V = 64, 2048
# case: (params, most launches per step, most Python calls per step)
CASES = {
    "greedy": ({"temperature": 0.0}, 5, 275),
    "top_k_top_p": ({"temperature": 0.8, "top_k": 50, "top_p": 0.9}, 8, 300),
    "top_p": ({"temperature": 0.8, "top_p": 0.9}, 11, 320),
}


@pytest.fixture
def stubbed_launches(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    from tpsample.kernels import launcher
    launches = []

    def call(self, grid, *args, **constexprs):
        launcher.launch_key(args, constexprs, self.const_positions)     # what a cached GPU launch computes
        launches.append(self.fn)

    def at(self, site, grid, *args, **constexprs):
        hash(site)
        launches.append(self.fn)

    monkeypatch.setattr(launcher.Launcher, "__call__", call)
    monkeypatch.setattr(launcher.Launcher, "at", at)
    return launches


def _step_counts(params, launches):
    import tpsample
    s = tpsample.Sampler(V, max_num_reqs=ROWS, seed=1)
    ids = [f"r{i}" for i in range(ROWS)]
    for i, rid in enumerate(ids):
        s.add_request(rid, tpsample.SamplingParams(seed=i, **params), [1, 2, 3])
    x = torch.randn(ROWS, V)

    def step():
        s.sample(x, s.plan(ids)).token_lists()

    for _ in range(3):
        step()
    launches.clear()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(10):
        step()
    prof.disable()
    return len(launches) / 10, pstats.Stats(prof).total_calls / 10


@pytest.mark.parametrize("case", list(CASES))
def test_an_eager_step_has_bounded_launches_and_python_calls(case, stubbed_launches):
    params, most_launches, most_calls = CASES[case]
    launches, calls = _step_counts(params, stubbed_launches)
    assert 0 < launches <= most_launches, launches
    assert calls <= most_calls, calls
