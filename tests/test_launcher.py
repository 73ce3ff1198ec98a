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


def test_a_site_hit_launches_the_remembered_kernel_without_a_key(monkeypatch):
    """`Launcher.at`: the first launch of a site takes the normal path and remembers the compiled
    kernel; later launches of that site call it directly, computing no per-argument key."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(launcher, "_no_hooks", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    runs, binds = [], []

    class Compiled:
        function, packed_metadata = object(), object()

        def _init_handles(self):
            pass

        def run(self, *args):
            runs.append(args)

    class Fn:
        arg_names, params = ["x", "n"], ()

        def __getitem__(self, grid):
            def bind(*args, **constexprs):
                binds.append(args)
                return Compiled()
            return bind

    lau = launcher.Launcher(Fn())
    keys = []
    real_key = launcher.launch_key
    monkeypatch.setattr(launcher, "launch_key", lambda *a: keys.append(a) or real_key(*a))
    x = torch.zeros(4)
    lau.at(("site", 1), (2,), x, 3)          # normal path: compiles (binds) and remembers
    assert len(binds) == 1 and not runs
    lau.at(("site", 1), (2,), x, 5)
    lau.at(("site", 1), (2,), x, 7)
    assert len(binds) == 1 and [r[-1] for r in runs] == [5, 7] and runs[0][:3] == (2, 1, 1)
    n_keys = len(keys)
    lau.at(("site", 1), (2,), x, 9)
    assert len(keys) == n_keys               # a hit computes no launch key
    lau.at(("site", 2), (2,), x, 11)         # another site: the normal path again
    assert len(runs) == 4 and len(binds) == 1   # (the same key: the cached compiled kernel runs)
