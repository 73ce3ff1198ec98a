"""One gate decides where kernels run (`kernels.launcher.kernels_wanted`): on CPU only when both
TPSAMPLE_KERNELS_ON_CPU=1 and TRITON_INTERPRET=1 (the sampling kernels), never for the engine's
CUDA-only kernels; every path that picks kernels asks it."""
import pytest
import torch

pytest.importorskip("triton")

from tpsample.kernels.launcher import kernels_wanted  # noqa: E402


@pytest.mark.parametrize("env,want", [({}, False), ({"TPSAMPLE_KERNELS_ON_CPU": "1"}, False),
                                      ({"TRITON_INTERPRET": "1"}, False),
                                      ({"TPSAMPLE_KERNELS_ON_CPU": "1", "TRITON_INTERPRET": "1"}, True)])
def test_cpu_kernels_need_both_switches(monkeypatch, env, want):
    for name in ("TPSAMPLE_KERNELS_ON_CPU", "TRITON_INTERPRET"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cpu = torch.device("cpu")
    assert kernels_wanted(cpu) is want
    assert kernels_wanted(cpu, cpu_ok=False) is False


def test_every_kernel_path_asks_the_one_gate(monkeypatch):
    from tpsample.engine import runner
    from tpsample.kernels import launcher as config
    from tpsample.model import llama as layers
    from tpsample.sampling import kernel_backend as fastpath
    from tpsample.sampling import keys
    asked = []
    monkeypatch.setattr(config, "kernels_wanted", lambda d, **kw: asked.append(d) or False)
    for module in (fastpath, keys, layers, runner):
        monkeypatch.setattr(module, "kernels_wanted", config.kernels_wanted)
    x = torch.zeros(2, 4)
    keys._OK.clear()
    assert not fastpath.kernels_apply(x)
    assert keys.shard_passes(x) is None
    assert not keys._kernel_ok_now(x)
    assert not layers.use_kernels(x)
    assert not runner.kernels_usable(x.device)
    assert len(asked) == 5
