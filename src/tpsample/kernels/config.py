"""Kernel launch configuration, batch hints and path counters (no kernels here).

Shared by the entry points and the launch modules, which import nothing above this.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..numerics import next_pow2

MAX_ROUNDS = 64
FORCE = ("bracket", "unpacked")       # what `KernelConfig.force` may hold


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    """Launch shape. Defaults come from a sweep on an H200 at 256 x 151936 (docs/kernels.md;
    `tpsample bench kernels --sweep` varies these fields): small programs (1-4 warps) keep the
    per-block reductions and branches of the streaming loops inside a warp or two. CAP
    candidates per row, P pivots and NB histogram bins per search pass. Production sets no
    field; tests set them to run the kernels at other shapes (short steps and small caps put
    several programs, blocks and search rounds on tiny rows).

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

    # Fixed launch choices, measured on an H200 (docs/kernels.md); not settable.
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
