"""Launching Triton kernels without Triton's per-call argument binding, recording those launches,
and issuing a recording again over other tensors (a launch list).

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

A `Tape` (the `recording()` context) keeps every launch made while it is open, with its
arguments; a launch it cannot repeat (one that compiles a kernel) marks it incomplete.
- `recorded(device_type)`: a context that records every `Launcher` launch made inside it and
  notes any torch operation doing device work on `device_type` (`DeviceWork`: anything but
  views, metadata queries and allocations), which a launch list could not repeat.
- `LaunchList(tape, externals, views=False)`: the tape's launches, where each tensor argument
  that is one of `externals` (the same data pointer and dtype; with `views`, also a view into
  an external's memory at a byte offset) is remembered by its index, and every other argument
  is kept as recorded: those tensors (scratch, caches) stay referenced by the list, so their
  memory outlives the recording. Raises ValueError when an argument shares an external's
  memory in another way (another dtype, or a view without `views`), or when a launch cannot be
  repeated (a kernel compiled while recording).
- `LaunchList.launch(tensors)`: the launches in order, each external replaced by the tensor at
  its index. The caller guarantees those match the recorded externals in dtype, shape, strides
  and 16-byte alignment (what the kernels were specialised on). On a GPU with no launch hooks a
  launch is one C call with integer pointers; otherwise (the interpreter, a profiler's hooks)
  the arguments are rebuilt as tensors and launched through `Launcher`.
Never imports the sampling layers.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .gate import interpreting


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host ints (triton.cdiv is a constexpr function: microseconds per call)."""
    return -(-a // b)


def raw_stream(dev: torch.device) -> int:
    """The current stream of `dev` as its raw handle (0 off CUDA); torch.cuda.current_stream
    builds a Python object."""
    if dev.type != "cuda":
        return 0
    return torch._C._cuda_getCurrentRawStream(dev.index if dev.index is not None else torch.cuda.current_device())


_SCRATCH: dict = {}
SCRATCH_SIZE = 16


def stream_scratch(dev: torch.device, key: tuple, make):
    """Buffers for one call's intermediates, reused by every later call with the same `key` on
    the current stream of `dev` (`make()` builds them the first time; at most SCRATCH_SIZE sets
    are kept). Kernels on one stream run in order, so a call's scratch is never overwritten while
    an earlier call still reads it; never return scratch to a caller that may keep it."""
    full = (str(dev), raw_stream(dev), key)
    got = _SCRATCH.get(full)
    if got is None:
        if len(_SCRATCH) >= SCRATCH_SIZE:
            _SCRATCH.pop(next(iter(_SCRATCH)))
        got = _SCRATCH[full] = make()
    return got


_Tensor = torch.Tensor
_I32, _U32 = 2**31, 2**32


def _spec(a):
    """One argument's part of the key (what the comprehension in `launch_key` inlines)."""
    if isinstance(a, _Tensor):
        return (a.dtype, a.data_ptr() & 15 == 0)
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return (a == 1, a & 15 == 0, -_I32 <= a < _I32, 0 <= a < _U32)
    return type(a)


def launch_key(args, constexprs, const_positions: tuple = ()) -> tuple:
    """What Triton specialises a launch on (see the module docstring), as a dict key: `_spec` of
    each argument, inlined for tensors, ints and None (a launch has ~20 arguments: the key is most
    of the host cost of a cached launch; a kernel with two modes takes the other mode's arguments
    as None), the values of constexpr parameters passed by position, and the keyword constexprs
    in the call's own order."""
    return (tuple([(a.dtype, a.data_ptr() & 15 == 0) if type(a) is _Tensor else
                   (a == 1, a & 15 == 0, -_I32 <= a < _I32, 0 <= a < _U32) if type(a) is int else
                   None if a is None else _spec(a) for a in args]),
            tuple([args[i] for i in const_positions if i < len(args)]), tuple(constexprs.items()))


try:
    from triton import knobs as _knobs
except ImportError:             # an older Triton: always take the wrapper
    _knobs = None


def _unset(hook) -> bool:
    """No hook installed: None (older Triton) or an empty HookChain (Triton >= 3.5)."""
    return hook is None or (isinstance(getattr(hook, "calls", None), list) and not hook.calls)


def _no_hooks() -> bool:
    return _knobs is not None and _unset(_knobs.runtime.launch_enter_hook) and _unset(_knobs.runtime.launch_exit_hook)


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


class Tape:
    """Launches recorded in order: (launcher, compiled or None, grid, args, constexprs)."""

    def __init__(self):
        self.entries: list = []
        self.complete = True


_TAPE: list = []        # the open tape, if any (a one-element stack)


class recording:
    """`with recording() as tape:` records every `Launcher` launch made inside."""

    def __enter__(self) -> Tape:
        if _TAPE:
            raise RuntimeError("launch recordings do not nest")
        _TAPE.append(Tape())
        return _TAPE[0]

    def __exit__(self, *exc):
        _TAPE.clear()


def _record(launcher, compiled, grid, args, constexprs) -> None:
    _TAPE[0].entries.append((launcher, compiled, tuple(grid) + (1,) * (3 - len(grid)), args, constexprs))


class Launcher:
    def __init__(self, fn):
        self.fn = fn
        self.names = list(fn.arg_names)
        # constexpr parameters: their values, not only their kinds, select the compiled kernel
        self.const_positions = tuple(i for i, p in enumerate(getattr(fn, "params", ())) if p.is_constexpr)
        self.cache: dict = {}
        self.sites: dict = {}         # caller-given site -> compiled (see `at`)
        self.direct = True            # off if this Triton's compiled kernels cannot be called directly

    def __call__(self, grid, *args, **constexprs):
        if not self.direct or interpreting():
            if not _TAPE:
                self.fn[grid](*args, **constexprs)
                return
            _record(self, None, grid, args, constexprs)
            from torch.utils._python_dispatch import _disable_current_modes
            with _disable_current_modes():      # the interpreter's own copies are not the step's work
                self.fn[grid](*args, **constexprs)
            return
        key = launch_key(args, constexprs, self.const_positions)
        compiled = self.cache.get(key)
        if compiled is None:
            if _TAPE:
                _TAPE[0].complete = False      # a compile: not repeatable from the tape
            kernel = self.fn[grid](*args, **constexprs)
            if kernel is not None and hasattr(kernel, "run"):
                self.cache[key] = _Compiled(kernel, [constexprs[n] for n in self.names[len(args):] if n in constexprs])
            return
        self._run(compiled, grid, args, constexprs)

    def at(self, site, grid, *args, **constexprs):
        """Launch with `site` (hashable) standing in for the launch key: the caller guarantees
        that equal sites mean equal keys (the same dtypes, pointer alignments, integer classes
        and constexprs), so a hit skips the per-argument key (most of a cached launch's host
        cost). A miss launches as `__call__` does and remembers the compiled kernel."""
        compiled = self.sites.get(site)
        if compiled is None:
            self(grid, *args, **constexprs)
            if self.direct and not interpreting():
                got = self.cache.get(launch_key(args, constexprs, self.const_positions))
                if got is not None:
                    self.sites[site] = got
            return
        self._run(compiled, grid, args, constexprs)

    def _run(self, compiled, grid, args, constexprs):
        if _TAPE:
            _record(self, compiled, grid, args, constexprs)
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
    with recording() as tape, work:
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
        if self.direct and _no_hooks():
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
        stream = raw_stream(tensors[0].device)
        for one in self.launches:
            one.launch(ptrs, tensors, stream)
