"""Launching Triton kernels without Triton's per-call argument binding.

Triton's `kernel[grid](...)` binds and specialises every argument on every call (tens of
microseconds per launch with ~40 arguments: several times the kernels' own time at decode batch
sizes). `Launcher` does the first launch of each specialisation the normal way, keeps the
compiled kernel, and later calls its launcher directly, keyed by what Triton specialises on:
each tensor's dtype and 16-byte alignment, each integer's width class, ==1 and divisibility by
16, and the constexpr values. Under the interpreter it always takes the normal path.
"""
from __future__ import annotations

import os

import torch


def _spec(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return (a == 1, a % 16 == 0, -2**31 <= a < 2**31, 0 <= a < 2**32)
    return type(a)


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
            compiled = self.fn[grid](*args, **constexprs)
            if compiled is not None and hasattr(compiled, "run"):
                self.cache[key] = compiled
            return
        rest = [constexprs[n] for n in self.names[len(args):] if n in constexprs]
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        try:
            runner = compiled[grid3]
        except (AttributeError, TypeError):
            self.direct = False
            self.fn[grid](*args, **constexprs)
            return
        runner(*args, *rest)
