"""Kernel launch configuration, availability and batch hints (no kernels here).

Shared by the dispatch entry points and the launch modules, which import nothing above this.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass

import torch

MAX_ROUNDS = 64


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    """Launch shape. Defaults come from a sweep on an H200 at 256 x 151936 (docs/kernels.md):
    small programs (1-4 warps) keep the per-block reductions and branches of the streaming loops
    inside a warp or two; ~16 programs per SM in all, ~32 for batches with a filter row. CAP
    candidates per row, P pivots and NB histogram bins per search pass.

    Every size that becomes a block of a kernel is a power of two (Triton's blocks are), warps
    are 1-32, and `small` <= `cap`; anything else is a `ValueError` naming the field, raised
    here rather than inside a kernel's compilation."""
    block: int = 256           # columns per step in the round passes (and the stats kernels)
    filter_block: int = 128    # at most this for batches with a filter row
    scan_cols: int = 1024      # columns per step in the scan (TILE x BB)
    plain_scan_cols: int = 512     # at most this for batches with no filter row (greedy, temperature only)
    draw_scan_cols: int | None = None  # ... and at most this when one is temperature only (the scan draws);
    #                                    None: 128 on CUDA, plain_scan_cols elsewhere (the interpreter pays per step)
    draw_scan_warps: int = 1       # the scan's warps then
    cap: int = 2048
    small: int = 256
    pivots: int = 8
    bins: int = 256
    hist_bins: int = 2048      # the bracket histogram of top-p rows without top-k (a power of two)
    bracket_all: int = 256     # top-p alone: at most this many entries from the bracket up are all candidates
    list_room: int = 3072      # top-p alone: entries a row's guessed list aims at (it holds up to 2 * cap)
    list_groups: int = 4       # counters a row's list appends through (atomics spread over addresses)
    list_pack: bool = True     # CUDA: the hist pass claims list slots with one atomic per 4 entries a thread
    list_warps: int | None = None   # the list kernel (a program a row holds its whole list); None: 8 on CUDA, else 4
    list_regs: int | None = 128     # CUDA: registers a thread of the list kernel (its maxnreg; 8..255, a multiple
    #                                 of 8): 128 lets two 8-warp programs share a SM; None: the compiler's choice
    lean: bool = True          # rows the list leaves: <= 2 * cap entries from the bracket up take the lean pass
    lean_block: int = 256      # columns per step of the lean pass
    lean_read_cols: int = 1024     # listed columns the per-row step of a lean row reads at a time
    hist_block: int | None = 1024   # columns per step of the hist pass (None: the round passes' step)
    hist_warps: int | None = 4      # warps of the hist pass (None: num_warps)
    hist_regs: int | None = None    # CUDA: registers a thread of the hist pass's mass-and-list mode (maxnreg, as
    #                                 list_regs); None: the compiler's choice
    num_warps: int = 1         # round passes and stats / shard kernels
    scan_warps: int = 4        # the scan
    row_warps: int = 4         # per-row kernels (select, finish)
    splits: int | None = None       # programs per row; None: ~programs_per_sm per SM in all
    programs_per_sm: int = 16      # the splits' target
    filter_programs_per_sm: int | None = 32     # batches with a filter row (None: programs_per_sm)
    block_max_cols: int | None = None   # BB; None: 16..128 from V

    def __post_init__(self):
        for name, hi in _POW2_FIELDS.items():
            v = getattr(self, name)
            if v is None and name in _OPTIONAL:
                continue
            if not _is_int(v) or not 1 <= v <= hi or v & (v - 1):
                raise ValueError(f"KernelConfig.{name} must be a power of two in [1, {hi}], got {v!r}")
        for name, lo in (("programs_per_sm", 1), ("filter_programs_per_sm", 1), ("bracket_all", 0),
                         ("list_room", 1)):
            v = getattr(self, name)
            if not (v is None and name in _OPTIONAL) and (not _is_int(v) or v < lo):
                raise ValueError(f"KernelConfig.{name} must be an integer >= {lo}, got {v!r}")
        for name in ("list_regs", "hist_regs"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or not 8 <= v <= 255 or v % 8):
                raise ValueError(f"KernelConfig.{name} must be None or a multiple of 8 in [8, 255], got {v!r}")
        for name in ("lean", "list_pack"):
            if not isinstance(getattr(self, name), bool):
                msg = f"KernelConfig.{name} must be True or False, got {getattr(self, name)!r}"
                raise ValueError(msg)  # noqa: TRY004 - every field check raises a ValueError naming it
        if self.small > self.cap:
            raise ValueError(f"KernelConfig.small must be <= cap ({self.cap}), got {self.small}")
        _cache_hash(self)

    def __hash__(self):         # computed once: launches and shape caches hash the config every call
        return self._hash


_COLS = 1 << 16            # the largest column step or list (Triton blocks hold at most 2**20 entries)
_POW2_FIELDS = {"block": _COLS, "filter_block": _COLS, "scan_cols": _COLS, "plain_scan_cols": _COLS,
                "draw_scan_cols": _COLS, "draw_scan_warps": 32, "cap": _COLS,
                "small": _COLS, "pivots": 256, "bins": _COLS, "hist_bins": _COLS, "num_warps": 32, "scan_warps": 32,
                "row_warps": 32, "splits": _COLS, "block_max_cols": _COLS, "lean_block": _COLS,
                "lean_read_cols": _COLS, "hist_block": _COLS, "hist_warps": 32, "list_groups": 32,
                "list_warps": 32}
_OPTIONAL = {"splits", "filter_programs_per_sm", "block_max_cols", "hist_block", "hist_warps", "draw_scan_cols",
             "list_warps"}


def _cache_hash(obj) -> None:
    """Store the hash of a frozen dataclass's fields on it (read by its `__hash__`)."""
    object.__setattr__(obj, "_hash", hash(tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


DEFAULT = KernelConfig()


_FALLBACKS: dict = {}
_LEANS: dict = {}


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
    top-p pass resolved (kernels/sample_lean.py). A device tensor: read it off the hot path."""
    return _device_counter(_LEANS, dev)


_LISTED: dict = {}


def listed_counter(dev) -> torch.Tensor:
    """[1] int32 on `dev`: top-p rows without top-k of every `sample_rows` call on this device so
    far that the list kernel resolved from the hist pass's list (kernels/sample_list.py); the
    others took the bracket method. A device tensor: read it off the hot path."""
    return _device_counter(_LISTED, dev)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernels_wanted(device, *, cpu_ok: bool = True) -> bool:
    """The one gate for every kernel path: CUDA with Triton, or (cpu_ok) CPU when both
    TPSAMPLE_KERNELS_ON_CPU=1 and TRITON_INTERPRET=1, which is how the CPU tests run the sampling
    kernels. The engine's kernels (attention, model ops) pass cpu_ok=False: CUDA only."""
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    if kind == "cuda":
        return _cuda_triton()
    return cpu_ok and kind == "cpu" and os.environ.get("TPSAMPLE_KERNELS_ON_CPU") == "1" and kernels_available(kind)


def kernels_available(device) -> bool:
    """True when these kernels can run on `device`: CUDA with Triton, or CPU under TRITON_INTERPRET=1."""
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
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


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_splits(rows: int, cols: int, device, cfg: KernelConfig) -> int:
    """Programs per row: about cfg.programs_per_sm per SM in all (so R = 1 still fills the GPU), a
    power of two."""
    if cfg.splits is not None:
        return cfg.splits
    if torch.device(device).type != "cuda":
        return 1
    sms = _sm_count(torch.device(device).index or 0)
    want = _pow2(max(1, (cfg.programs_per_sm * sms) // max(rows, 1)))
    most = _pow2(max(1, cols // (4 * cfg.scan_cols)))
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
