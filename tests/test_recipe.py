"""Every sampling backend runs the one recipe (`sampling/recipe.py`): front (steps 1-5), draw
(6-10), guard (12), then logprobs (11) only when a row asks. The torch pipeline, the kernels (Triton's
interpreter on CPU) and the vocab-parallel rounds are each run on the same rows with their steps
recorded, and give the same tokens."""
import numpy as np
import pytest
import torch

from tpsample import SamplingParams
from tpsample.parallel.plan import RowsView
from tpsample.sampling.processors import PROCESSORS
from tpsample.sampling.recipe import SampleArgs, sample_rows
from tpsample.sampling.reducer import LocalRows
from tpsample.state.store import RequestStore

V = 257
STEPS = ("front", "draw", "guard", "logprobs")


def _batch(params):
    store = RequestStore(V, len(params), None, PROCESSORS)
    for i, p in enumerate(params):
        store.add(str(i), p, [1, 2], p.seed or 0)
    store.sync(torch.device("cpu"), 1)
    n = len(params)
    return store.row_batch(RowsView(np.arange(n), np.zeros(n, np.int64), np.full(n, -1, np.int64)),
                           torch.device("cpu"))


def _record(monkeypatch, cls):
    """The names of `cls`'s steps in the order they run."""
    log = []
    for name in STEPS:
        def wrapped(self, *a, _f=getattr(cls, name), _n=name):
            log.append(_n)
            return _f(self, *a)
        monkeypatch.setattr(cls, name, wrapped)
    return log


def _backends(monkeypatch):
    """(name, steps class, run(args) -> RowResult) of each backend."""
    from tpsample.sampling.kernel_backend import KERNELS, KernelSteps
    from tpsample.sampling.rounds.rounds import ROUNDS, ShardRounds
    from tpsample.sampling.torch_backend import TORCH, TorchSteps
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    return [("torch", TorchSteps, lambda a: sample_rows(a, backend=TORCH)),
            ("kernels", KernelSteps, lambda a: sample_rows(a, backend=KERNELS)),
            ("rounds", ShardRounds, lambda a: sample_rows(a, backend=ROUNDS))]


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("logprobs", [None, 3])
def test_every_backend_runs_the_recipe_steps_in_the_semantics_order(monkeypatch, logprobs):
    pytest.importorskip("triton")
    params = [SamplingParams(temperature=0.0, logprobs=logprobs), SamplingParams(top_p=0.8, seed=3, logprobs=logprobs),
              SamplingParams(top_k=5, min_p=0.05, seed=4, logit_bias={3: 2.0}, logprobs=logprobs)]
    b = _batch(params)
    x = torch.randn(len(params), V, generator=torch.Generator().manual_seed(1)) * 3
    want = STEPS if logprobs is not None else STEPS[:3]
    tokens = {}
    for name, cls, run in _backends(monkeypatch):
        log = _record(monkeypatch, cls)
        res = run(SampleArgs(x, 0, b, LocalRows()))
        assert res is not None, name
        assert tuple(log) == want, (name, log)
        tokens[name] = res.emitted
    assert torch.equal(tokens["kernels"], tokens["torch"]) and torch.equal(tokens["rounds"], tokens["torch"])
