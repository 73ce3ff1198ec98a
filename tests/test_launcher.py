"""The launch key of `kernels.launcher.Launcher` separates every launch Triton would compile
differently (a cached launch must never run another specialisation's kernel), and the direct
launch is taken when no launch hook is installed (None, or an empty hook chain)."""
import pytest
import torch

pytest.importorskip("triton")

from tpsample.kernels import launcher  # noqa: E402


def test_launch_key_separates_what_triton_specialises_on():
    buf = torch.zeros(64)
    key = launcher.launch_key
    base = key((buf, 7, 2.0, True, None), {"BLOCK": 256}, (3,))
    assert base == key((torch.zeros(8), 9, 3.5, True, None), {"BLOCK": 256}, (3,))     # same kinds
    assert base != key((buf[1:], 7, 2.0, True, None), {"BLOCK": 256}, (3,))           # 4-byte aligned pointer
    assert base != key((buf.int(), 7, 2.0, True, None), {"BLOCK": 256}, (3,))         # dtype
    assert base != key((buf, 1, 2.0, True, None), {"BLOCK": 256}, (3,))               # int == 1
    assert base != key((buf, 16, 2.0, True, None), {"BLOCK": 256}, (3,))              # int % 16 == 0
    assert base != key((buf, 2**40, 2.0, True, None), {"BLOCK": 256}, (3,))           # 64-bit int
    assert key((buf, 7), {}, (1,)) != key((buf, 9), {}, (1,))                         # constexpr by position
    assert base != key((buf, 7, 2.0, True, None), {"BLOCK": 128}, (3,))               # keyword constexpr
    args = (buf, buf[1:], -3, 1, 16, 2**33, 0.5, True, None)
    assert key(args, {})[0] == tuple(launcher._spec(a) for a in args)               # the inlined _spec


def test_constexpr_positions_come_from_the_kernel_signature(monkeypatch):
    import triton
    import triton.language as tl
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)     # a compiled kernel's signature

    @triton.jit
    def kernel(x_ptr, n, WIDTH: tl.constexpr, stride, BLOCK: tl.constexpr):
        pass

    assert launcher.Launcher(kernel).const_positions == (2, 4)


def test_direct_launch_only_without_launch_hooks(monkeypatch):
    class Chain:                       # Triton >= 3.5: hooks are chains, empty when none is set
        def __init__(self, calls):
            self.calls = calls

    knobs = pytest.importorskip("triton").knobs
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", Chain([]))
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", None)
    assert launcher._no_hooks()
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", Chain([print]))
    assert not launcher._no_hooks()
