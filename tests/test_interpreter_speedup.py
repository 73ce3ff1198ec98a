"""Under Triton's interpreter, a helper called from a kernel no longer re-patches the language
that the kernel's launch already patched (`tests/interpreter.py`, installed by
conftest.py), and kernels give the same results with and without it."""
import pytest
import torch

pytest.importorskip("triton")
pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where CUDA does not")]


def test_a_launch_patches_the_language_once_however_many_helper_calls_it_makes(monkeypatch):
    import tlutil_probes
    from interpreter import speed_up_device_calls
    from triton.runtime import interpreter as interp
    assert speed_up_device_calls()
    calls = [0]
    real = interp._patch_lang

    def counted(fn):
        calls[0] += 1
        return real(fn)
    monkeypatch.setattr(interp, "_patch_lang", counted)
    x = torch.randn(4096) * 3
    got = torch.empty_like(x)
    tlutil_probes.divide[(8,)](x, got, x.numel(), 0.8, BLOCK=512)      # 8 programs, 5 helper calls each
    assert calls[0] == 2        # the launch, and the first call of Triton's own helpers (triton.language.core)
    assert torch.equal(got, x / torch.tensor(0.8))      # the interpreter's fma is exact here (float64 inside)
