"""Recorded Triton launches issued again over other tensors: a launch list.

Contract:
- `recorded(device_type)`: a context that records every `Launcher` launch made inside it
  (`launcher.recording`) and notes any torch operation doing device work on `device_type`
  (`DeviceWork`: anything but views, metadata queries and allocations), which a launch list
  could not repeat.
- `LaunchList(tape, externals, views=False)`: the tape's launches, where each tensor argument
  that is one of `externals` (the same data pointer and dtype; with `views`, also a view into
  an external's memory at a byte offset) is remembered by its index, and every other argument
  is kept as recorded: those tensors (scratch, caches) stay referenced by the list, so their
  memory outlives the recording. Raises ValueError when an argument shares an external's
  memory in another way (another dtype, or a view without `views`), or when a launch cannot be
  repeated (a kernel compiled while recording).
- `launch(tensors)`: the launches in order, each external replaced by the tensor at its index.
  The caller guarantees those match the recorded externals in dtype, shape, strides and 16-byte
  alignment (what the kernels were specialised on). On a GPU with no launch hooks a launch is
  one C call with integer pointers; otherwise (the interpreter, a profiler's hooks) the
  arguments are rebuilt as tensors and launched through `Launcher`.
Never imports the sampling layers.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import launcher

# aten operations that do no device work: views, metadata and allocation
_NO_WORK = frozenset({
    "empty", "empty_strided", "empty_like", "as_strided", "view", "_unsafe_view", "select", "slice", "reshape",
    "_reshape_alias", "detach", "alias", "unsqueeze", "squeeze", "t", "transpose", "expand", "permute", "unbind",
    "split", "split_with_sizes", "narrow", "unfold", "view_as_real", "view_as_complex", "lift_fresh", "set_",
    "is_pinned", "_pin_memory", "record_stream",
})


class DeviceWork(TorchDispatchMode):
    """Notes each aten operation that touches a tensor on `device_type` and is not a view,
    metadata query, allocation or an operation returning its input itself (`found`: names)."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type = device_type
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        noop = bool(args) and out is args[0]         # a `to` or `contiguous` that returned its input
        if name not in _NO_WORK and not noop and self._touches(args, kwargs, out):
            self.found.append(name)
        return out

    def _touches(self, args, kwargs, out) -> bool:
        flat = torch.utils._pytree.tree_leaves((args, kwargs or {}, out))
        return any(isinstance(a, torch.Tensor) and a.device.type == self.device_type for a in flat)


@contextlib.contextmanager
def recorded(device_type: str):
    """`with recorded(dev.type) as (tape, work):` the launches made inside, and `work.found`."""
    work = DeviceWork(device_type)
    with launcher.recording() as tape, work:
        yield tape, work


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _slot(a: torch.Tensor, externals: list, stores: list, views: bool):
    """(external index, byte offset) of argument `a`, None when it shares no external's memory."""
    same = [j for j, e in enumerate(externals) if e.device == a.device and stores[j] == _storage(a)]
    if not same:
        return None
    for j in same:
        if externals[j].data_ptr() == a.data_ptr() and externals[j].dtype == a.dtype:
            return j, 0
    if views and len(same) == 1 and externals[same[0]].dtype == a.dtype:
        return same[0], a.data_ptr() - externals[same[0]].data_ptr()
    raise ValueError("a kernel reads an input in another dtype or layout: not replayable")


class _Launch:
    """One recorded launch and where the externals go in its arguments."""

    def __init__(self, rec, externals: list, stores: list, views: bool):
        self.launcher, self.compiled, self.grid, self.args, self.constexprs = rec
        self.slots = []               # (argument position, external index, byte offset, the recorded view)
        for i, a in enumerate(self.args):
            got = _slot(a, externals, stores, views) if isinstance(a, torch.Tensor) else None
            if got is not None:
                self.slots.append((i, *got, a))
        c = self.compiled
        self.direct = c is not None and c.run is not None
        self.ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in self.args]

    def launch(self, ptrs: list, tensors, stream: int) -> None:
        if self.direct and launcher._no_hooks():
            ints = self.ints
            if self.slots:
                ints = list(ints)
                for i, j, off, _ in self.slots:
                    ints[i] = ptrs[j] + off
            c = self.compiled
            c.run(self.grid[0], self.grid[1], self.grid[2], stream, c.function, c.packed, None, None, None,
                  *ints, *c.rest)
            return
        args = list(self.args)
        for i, j, off, view in self.slots:
            t = tensors[j]
            args[i] = t.as_strided(view.shape, view.stride(), t.storage_offset() + off // t.element_size())
        if self.compiled is not None:
            self.launcher._run(self.compiled, self.grid, tuple(args), self.constexprs)
        else:
            self.launcher.fn[self.grid](*args, **self.constexprs)


class LaunchList:
    """A recording's launches, issued again over other externals (see the module docstring)."""

    def __init__(self, tape, externals: list, views: bool = False):
        if not tape.complete or not tape.entries:
            raise ValueError("a launch that cannot be repeated (a kernel compiled while recording)")
        stores = [_storage(e) for e in externals]
        self.launches = [_Launch(rec, externals, stores, views) for rec in tape.entries]

    def __len__(self) -> int:
        return len(self.launches)

    def launch(self, tensors) -> None:
        ptrs = [t.data_ptr() for t in tensors]
        stream = launcher.raw_stream(tensors[0].device)
        for one in self.launches:
            one.launch(ptrs, tensors, stream)
