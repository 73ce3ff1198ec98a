"""How kernels are launched: where they may run, the launch shape, and the launch itself.

- The gate (`kernels_wanted`, `kernels_available`, `interpreting`): the one answer to "may a
  kernel run here?". The sampling kernels run on CUDA with Triton, or on CPU when both
  TPSAMPLE_KERNELS_ON_CPU=1 and TRITON_INTERPRET=1 (how the CPU tests run them through Triton's
  interpreter); the engine's kernels (`cpu_ok=False`) on CUDA only.
- `KernelConfig` (launch shapes), `num_splits` / `split_shape` (programs a row), `RowHints`
  (what a batch holds, so a call compiles only the code it needs), the path counters.
- `Launcher`: a launch without Triton's per-call argument binding (which costs several times
  the kernels' own time at decode batch sizes): the first launch of each specialisation goes
  the normal way, later ones call the compiled kernel's C launcher directly, keyed by what
  Triton specialises on (each tensor's dtype and 16-byte alignment, each integer's width class,
  ==1 and divisibility by 16, the constexpr values). With launch hooks installed (a
  profiler's), or under the interpreter, it takes Triton's own path.
- `recording()` / `recorded(device_type)`: a `Tape` of the launches made inside (incomplete if
  one compiled a kernel), and the torch operations doing device work there (`DeviceWork`),
  which a launch list could not repeat; `LaunchList` issues a tape again over other tensors.
Nothing heavy is imported here (no kernels, Triton only when asked), so CPU-only installs
without Triton can ask the gate; never imports the sampling layers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..numerics import next_pow2

# ---- the gate -----------------------------------------------------------------------------

def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernels_wanted(device, *, cpu_ok: bool = True) -> bool:
    """Whether a kernel path runs on `device` (see the module docstring); cpu_ok=False for the
    engine's CUDA-only kernels."""
    kind = torch.device(device).type
    if kind == "cuda":
        return _cuda_triton()
    return cpu_ok and kind == "cpu" and os.environ.get("TPSAMPLE_KERNELS_ON_CPU") == "1" and kernels_available(kind)


def kernels_available(device) -> bool:
    """True when these kernels can run on `device`: CUDA with Triton, or CPU under TRITON_INTERPRET=1."""
    kind = torch.device(device).type
    if kind == "cuda":
        return _cuda_triton()
    return kind == "cpu" and interpreting() and _triton_importable()


@functools.cache
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _cuda_triton() -> bool:
    return _triton_importable() and torch.cuda.is_available()


# ---- the launch shape ---------------------------------------------------------------------

MAX_ROUNDS = 64
FORCE = ("bracket", "unpacked")       # what `KernelConfig.force` may hold


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    """Launch shape (defaults and their reasons: docs/kernels.md; `tpsample bench kernels
    --sweep` varies these fields). Small programs (1-4 warps) keep the per-block reductions and
    branches of the streaming loops inside a warp or two. Production sets no field; tests set
    them to run the kernels at other shapes (several programs, blocks and rounds on tiny rows).

    Every size that becomes a block of a kernel is a power of two (Triton's blocks are), warps
    are 1-32, and `small` <= `cap`; anything else is a `ValueError` naming the field, raised
    here rather than inside a kernel's compilation.

    `force` is the test hook that turns a method off so that the path behind it runs (small
    settings force the others: `list_room=1`, the list settles no row; a small `cap` or
    `hist_bins`, the candidates overflow or the bracket fails and the exact search runs):
    - "bracket": rows the list leaves collect their bracket's candidates (no lean pass);
    - "unpacked": on CUDA too, the hist pass claims list slots with one atomic an entry, through
      the counter its column picks (not one atomic for 4 entries a thread, by lane)."""
    block: int = 256           # columns per step in the round passes (and the stats kernels)
    scan_cols: int = 1024      # columns per step in the scan (TILE x BB)
    plain_scan_cols: int = 512     # at most this for batches with no filter row (greedy, temperature only)
    draw_scan_cols: int | None = None  # ... and at most this when one is temperature only (the scan draws);
    #                                    None: draw_scan_cols_cuda on CUDA, plain_scan_cols elsewhere (the
    #                                    interpreter pays per step)
    cap: int = 2048
    small: int = 256
    pivots: int = 8
    bins: int = 256
    hist_bins: int = 2048      # the bracket histogram of top-p rows without top-k (a power of two)
    bracket_all: int = 256     # top-p alone: at most this many entries from the bracket up are all candidates
    list_room: int = 3072      # top-p alone: entries a row's guessed list aims at (it holds up to 2 * cap)
    list_groups: int = 4       # counters a row's list appends through (atomics spread over addresses)
    list_warps: int | None = None   # the list kernel (a program a row holds its whole list); None: 8 on CUDA, else 4
    lean_block: int = 256      # columns per step of the lean pass
    lean_read_cols: int = 1024     # listed columns the per-row step of a lean row reads at a time
    hist_block: int | None = 1024   # columns per step of the hist pass (None: the round passes' step)
    hist_warps: int | None = 4      # warps of the hist pass (None: num_warps)
    num_warps: int = 1         # round passes and stats / shard kernels
    splits: int | None = None       # programs per row; None: ~programs_per_sm per SM in all
    force: frozenset = frozenset()  # test hook (above): "bracket", "unpacked"

    # Fixed launch choices (docs/kernels.md); not settable.
    filter_block: ClassVar[int] = 128      # batches with a filter row: round-pass steps of at most this
    filter_programs_per_sm: ClassVar[int] = 32     # ... and this many programs a SM
    programs_per_sm: ClassVar[int] = 16    # the splits' target otherwise
    scan_warps: ClassVar[int] = 4
    draw_scan_cols_cuda: ClassVar[int] = 128   # `draw_scan_cols` None on CUDA
    draw_scan_warps: ClassVar[int] = 1     # the scan's warps when it draws (one warp: its per-step test stays in it)
    row_warps: ClassVar[int] = 4           # per-row kernels (select, finish, drain)
    list_regs: ClassVar[int] = 128         # CUDA: registers a thread of the list kernel (maxnreg): two 8-warp programs a SM
    bins_regs: ClassVar[int] = 96          # CUDA: registers a thread of the bins pass, whose bracket code (one program
    #                                        a row) would take 168, and the loop's occupancy with them

    def __post_init__(self):
        for name, hi in _POW2_FIELDS.items():
            v = getattr(self, name)
            if v is None and name in _OPTIONAL:
                continue
            if not _is_int(v) or not 1 <= v <= hi or v & (v - 1):
                raise ValueError(f"KernelConfig.{name} must be a power of two in [1, {hi}], got {v!r}")
        for name, lo in (("bracket_all", 0), ("list_room", 1)):
            v = getattr(self, name)
            if not _is_int(v) or v < lo:
                raise ValueError(f"KernelConfig.{name} must be an integer >= {lo}, got {v!r}")
        if isinstance(self.force, str) or not isinstance(self.force, (set, frozenset, tuple, list)) \
                or not set(self.force) <= set(FORCE):
            raise ValueError(f"KernelConfig.force must be a set of {', '.join(FORCE)}, got {self.force!r}")
        object.__setattr__(self, "force", frozenset(self.force))
        if self.small > self.cap:
            raise ValueError(f"KernelConfig.small must be <= cap ({self.cap}), got {self.small}")
        _cache_hash(self)

    def __hash__(self):         # computed once: launches and shape caches hash the config every call
        return self._hash


_COLS = 1 << 16            # the largest column step or list (Triton blocks hold at most 2**20 entries)
_POW2_FIELDS = {"block": _COLS, "scan_cols": _COLS, "plain_scan_cols": _COLS, "draw_scan_cols": _COLS, "cap": _COLS,
                "small": _COLS, "pivots": 256, "bins": _COLS, "hist_bins": _COLS, "num_warps": 32, "splits": _COLS,
                "lean_block": _COLS, "lean_read_cols": _COLS, "hist_block": _COLS, "hist_warps": 32,
                "list_groups": 32, "list_warps": 32}
_OPTIONAL = {"splits", "hist_block", "hist_warps", "draw_scan_cols", "list_warps"}


def _cache_hash(obj) -> None:
    """Store the hash of a frozen dataclass's fields on it (read by its `__hash__`)."""
    object.__setattr__(obj, "_hash", hash(tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


DEFAULT = KernelConfig()


_FALLBACKS: dict = {}
_LEANS: dict = {}
_LISTED: dict = {}


def _device_counter(store: dict, dev) -> torch.Tensor:
    dev = torch.device(dev)
    if dev.type == "cuda" and dev.index is None:      # "cuda" and "cuda:0" share one counter
        dev = torch.device("cuda", torch.cuda.current_device())
    got = store.get(dev)
    if got is None:
        got = store[dev] = torch.zeros(1, dtype=torch.int32, device=dev)
    return got


def fallback_counter(dev) -> torch.Tensor:
    """[1] int32 on `dev`: rows of every `sample_rows` call on this device so far whose
    candidates overflowed or whose top-p bracket did not certify, so that they took the exact
    one-program-per-row search (the drain kernel). A device tensor: read it off the hot path."""
    return _device_counter(_FALLBACKS, dev)


def lean_counter(dev) -> torch.Tensor:
    """[1] int32 on `dev`: rows of every `sample_rows` call on this device so far that the lean
    top-p pass resolved (kernels/sample/lists.py). A device tensor: read it off the hot path."""
    return _device_counter(_LEANS, dev)


def listed_counter(dev) -> torch.Tensor:
    """[1] int32 on `dev`: top-p rows without top-k of every `sample_rows` call on this device so
    far that the list kernel resolved from the hist pass's list (kernels/sample/lists.py); the
    others took the bracket method. A device tensor: read it off the hot path."""
    return _device_counter(_LISTED, dev)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_splits(rows: int, cols: int, device, shape) -> int:
    """Programs per row: about shape.programs_per_sm per SM in all (so R = 1 still fills the GPU),
    a power of two. shape: a KernelConfig, or a batch kind's `sample.launch.Shape`."""
    if shape.splits is not None:
        return shape.splits
    if torch.device(device).type != "cuda":
        return 1
    sms = _sm_count(torch.device(device).index or 0)
    want = next_pow2(max(1, (shape.programs_per_sm * sms) // max(rows, 1)))
    most = next_pow2(max(1, cols // (4 * shape.scan_cols)))
    return max(1, min(want, most))


def split_shape(rows: int, cols: int, device, cfg: KernelConfig) -> tuple[int, int]:
    """(splits, chunk) of a row-statistics or shard pass: `num_splits` programs a row, each over
    `chunk` columns, a whole number of `cfg.block` steps."""
    splits = num_splits(rows, cols, device, cfg)
    return splits, max(cfg.block, cdiv(cdiv(cols, splits), cfg.block) * cfg.block)


@dataclass(frozen=True)
class RowHints:
    """What the batch holds, known on the host (so the call needs no device sync and compiles
    only the code the batch needs): rows with filters (top-k, top-p or min-p), rows with top-k or
    top-p (which may need several rounds), greedy rows, plain rows (temperature only), rows with
    top-p and no top-k (the list and bracket passes).
    A hint may be True when no such row exists (slower), never False when one does."""
    any_filter: bool = True
    any_top_k_or_p: bool = True
    any_greedy: bool = True
    any_plain: bool = True
    any_top_p_alone: bool = True

    def __post_init__(self):
        _cache_hash(self)

    def __hash__(self):         # computed once: every launch of a call hashes its hints
        return self._hash

    @property
    def modes(self) -> int:
        return int(self.any_greedy) | 2 * int(self.any_plain) | 4 * int(self.any_filter)


def row_hints(temperature, top_k, top_p, min_p_on, vocab_size: int) -> RowHints:
    """The RowHints of rows given alike as numpy arrays (host parameters) or tensors (one device
    sync when they live on the GPU); min_p_on: which rows have min-p."""
    sampled = temperature != 0
    topk = (top_k > 0) & (top_k < vocab_size)
    kp = sampled & (topk | (top_p < 1))
    filt = kp | (sampled & min_p_on)
    p_alone = sampled & (top_p < 1) & ~topk
    flags = (filt, kp, ~sampled, sampled & ~filt, p_alone)
    if isinstance(temperature, torch.Tensor):
        return RowHints(*(bool(f) for f in torch.stack([f.any() for f in flags]).tolist()))
    return RowHints(*(bool(f.any()) for f in flags))


# ---- the launch ---------------------------------------------------------------------------

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
