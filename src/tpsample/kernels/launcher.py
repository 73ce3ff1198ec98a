"""Launching Triton kernels without Triton's per-call argument binding.

Triton's `kernel[grid](...)` binds and specialises every argument on every call (tens of
microseconds per launch with ~40 arguments: several times the kernels' own time at decode batch
sizes). `Launcher` does the first launch of each specialisation the normal way, keeps the
compiled kernel, and later calls its launcher directly, keyed by what Triton specialises on:
each tensor's dtype and 16-byte alignment, each integer's width class, ==1 and divisibility by
16, and the constexpr values. A hit calls the compiled kernel's C launcher itself (what Triton's
`compiled[grid](...)` wrapper does after looking up the device, the stream and the launch
hooks), with the current stream; when launch hooks are installed (a profiler's), or the
compiled kernel lacks that launcher, it takes the wrapper. Under the interpreter it always
takes the normal path.
"""
from __future__ import annotations

import os

import torch


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host ints (triton.cdiv is a constexpr function: microseconds per call)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), for host ints."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _spec(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return (a == 1, a % 16 == 0, -2**31 <= a < 2**31, 0 <= a < 2**32)
    return type(a)


try:
    from triton import knobs as _knobs
except ImportError:             # an older Triton: always take the wrapper
    _knobs = None


def _no_hooks() -> bool:
    return _knobs is not None and _knobs.runtime.launch_enter_hook is None and _knobs.runtime.launch_exit_hook is None


class _Compiled:
    """A compiled kernel with what a direct launch needs (run None: use Triton's wrapper)."""

    def __init__(self, kernel, rest: list):
        self.kernel, self.rest = kernel, rest
        self.run = self.function = self.packed = None
        try:
            kernel._init_handles()
            run, function, packed = kernel.run, kernel.function, kernel.packed_metadata
        except (AttributeError, TypeError):
            return
        if callable(run) and function is not None:
            self.run, self.function, self.packed = run, function, packed


class Launcher:
    def __init__(self, fn):
        self.fn = fn
        self.names = list(fn.arg_names)
        self.cache: dict = {}
        self.direct = True            # off if this Triton's compiled kernels cannot be called directly

    def __call__(self, grid, *args, **constexprs):
        if not self.direct or os.environ.get("TRITON_INTERPRET", "0") == "1":
            self.fn[grid](*args, **constexprs)
            return
        key = (tuple(_spec(a) for a in args), tuple(sorted(constexprs.items())))
        compiled = self.cache.get(key)
        if compiled is None:
            kernel = self.fn[grid](*args, **constexprs)
            if kernel is not None and hasattr(kernel, "run"):
                self.cache[key] = _Compiled(kernel, [constexprs[n] for n in self.names[len(args):] if n in constexprs])
            return
        rest = compiled.rest
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        if compiled.run is not None and _no_hooks():
            stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
            try:
                compiled.run(grid3[0], grid3[1], grid3[2], stream, compiled.function, compiled.packed, None, None,
                             None, *args, *rest)
                return
            except TypeError:   # this Triton's launcher takes other arguments (checked before it launches)
                compiled.run = None
        try:
            runner = compiled.kernel[grid3]
        except (AttributeError, TypeError):
            self.direct = False
            self.fn[grid](*args, **constexprs)
            return
        runner(*args, *rest)
