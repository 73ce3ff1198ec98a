"""Count reads of tensor data back to the host (each one a synchronisation on CUDA).

`count_host_reads()` patches the torch calls that move tensor values to Python or to the host
(`item`, `tolist`, `bool()`, `int()`, `float()`, `numpy`, `cpu`, `nonzero`, boolean-mask
indexing) for the duration of a `with` block and counts them. On CPU tensors these calls are
cheap, but they mark exactly the places that would stall a CUDA stream, so a CPU test can hold
the "no host read inside a step" contract.
"""
from __future__ import annotations

import contextlib

import torch

_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "numpy", "cpu", "nonzero")


@contextlib.contextmanager
def count_host_reads():
    calls: list[str] = []
    saved = {name: getattr(torch.Tensor, name) for name in _METHODS}
    saved_getitem, saved_nonzero = torch.Tensor.__getitem__, torch.nonzero

    def wrap(name, fn):
        def inner(self, *a, **k):
            calls.append(name)
            return fn(self, *a, **k)
        return inner

    def getitem(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
            calls.append("bool-mask index")
        return saved_getitem(self, index)

    def nonzero(*a, **k):
        calls.append("torch.nonzero")
        return saved_nonzero(*a, **k)

    try:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, wrap(name, fn))
        torch.Tensor.__getitem__ = getitem
        torch.nonzero = nonzero
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        torch.Tensor.__getitem__ = saved_getitem
        torch.nonzero = saved_nonzero
