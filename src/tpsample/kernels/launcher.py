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

A `Tape` (the `recording()` context) keeps every launch made while it is open, with its
arguments, so that the same launches can be issued again over another input buffer
(`tpsample.tape` does); a launch it cannot repeat (one that compiles a kernel) marks it
incomplete.
"""
from __future__ import annotations

import os

import torch


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


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), for host ints."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


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
    each argument, inlined for tensors and ints (a launch has ~20 arguments: the key is most of
    the host cost of a cached launch), the values of constexpr parameters passed by position, and
    the keyword constexprs in the call's own order."""
    return (tuple([(a.dtype, a.data_ptr() & 15 == 0) if type(a) is _Tensor else
                   (a == 1, a & 15 == 0, -_I32 <= a < _I32, 0 <= a < _U32) if type(a) is int else
                   _spec(a) for a in args]), tuple([args[i] for i in const_positions if i < len(args)]),
            tuple(constexprs.items()))


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
        if not self.direct or os.environ.get("TRITON_INTERPRET", "0") == "1":
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
            if self.direct and os.environ.get("TRITON_INTERPRET", "0") != "1":
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
