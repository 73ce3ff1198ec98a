"""Host side of `sample_rows`: the workspace and the launch sequence (scan, select, rounds).

Launches: scan (rows x splits), select (rows); then, only if some row filters, [hist_kernel
(rows x splits: mass and list), list_kernel (rows) and hist_kernel again (rows x splits: the bins
of the rows the list left, and their brackets), only when some row has top-p without top-k], one
round [round_kernel (rows x splits), finish_kernel (rows)], and, when some row has top-k / top-p,
drain_kernel (rows), which finishes the rows the round left searching (one program per row).
The sequence is fixed: the host never reads the device, so the call is CUDA-graph capturable.
The workspace is O(rows x (V / BB + CAP)) bytes, one allocation per call (the caching
allocator reuses it).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from .config import (
    MAX_ROUNDS,
    KernelConfig,
    RowHints,
    _pow2,
    fallback_counter,
    lean_counter,
    listed_counter,
    num_splits,
)
from .launcher import Launcher, stream_scratch
from .sample_drain import drain_kernel
from .sample_finish import finish_kernel
from .sample_hist import hist_kernel
from .sample_list import SCRATCH_WORDS, list_kernel
from .sample_rounds import round_kernel
from .sample_scan import scan_kernel
from .sample_select import select_kernel
from .sample_state import CN

SCAN, SELECT, HIST, LIST, BINS, ROUND, FINISH, DRAIN = (
    Launcher(k) for k in (scan_kernel, select_kernel, hist_kernel, list_kernel, hist_kernel, round_kernel,
                          finish_kernel, drain_kernel))
CN_STRIDE = CN.value         # int32s between two rows' candidate counters
# registers a thread of the bins pass may take on CUDA: its bracket code (run by one program a
# row) would take 168, and the loop's occupancy with them; 96 keeps the loop free of spills
BINS_MAXNREG = 96


class Workspace:
    """Per-call buffers carved from one allocation (one allocator call, no memsets: every field
    is written before it is read). Fields are [rows] unless noted; see sample_state.py."""

    def __init__(self, rows: int, splits: int, nblk: int, cfg: KernelConfig, dev):
        f32, i32, i64 = torch.float32, torch.int32, torch.int64
        n = rows * splits
        fields = [("raw_v", n, f32), ("raw_i", n, i32), ("max", n, f32), ("best_v", n, f32), ("best_i", n, i32),
                  ("nans", n, i32), ("bmax", (rows, nblk), f32),
                  ("stage", rows, i32), ("flags", rows, i32),
                  ("raw", rows, i32), ("m", rows, f32), ("t1", rows, f32), ("tkey", rows, i64), ("klo", rows, i64),
                  ("khi", rows, i64), ("shift", rows, i32), ("cabove", rows, i64), ("mabove", rows, i64),
                  ("S", rows, i64), ("piv", (rows, cfg.pivots), i64), ("cand_key", (rows, cfg.cap), i64),
                  ("cand_id", (rows, cfg.cap), i32), ("cand_n", rows * CN_STRIDE, i32), ("p_cnt", n, i64),
                  ("p_mass", n, i64),
                  ("p_cgt", (n, cfg.pivots), i64), ("p_mgt", (n, cfg.pivots), i64), ("p_hist", (n, cfg.bins), i32),
                  ("pending", 1, i32), ("hlo", rows, f32), ("hinv", rows, f32), ("hist", (rows, hist_width(cfg)), i32),
                  ("bfirst", rows, i32), ("blast", rows, i32), ("bcount", rows, i32), ("lean_l", rows, f32),
                  ("xf", rows, f32), ("arrive", rows, i32), ("top_bin", rows, i32), ("top_mass", rows, i64)]
        sizes = [math.prod(sh if isinstance(sh, tuple) else (sh,)) * dt.itemsize for _, sh, dt in fields]
        offsets, total = [], 0
        for b in sizes:
            offsets.append(total)
            total += (b + 255) // 256 * 256          # 256-byte aligned views: no re-specialisation
        self.buffer = torch.empty(total, dtype=torch.uint8, device=dev)
        for (name, shape, dt), off, b in zip(fields, offsets, sizes):
            setattr(self, name, self.buffer[off:off + b].view(dt).view(shape))
        self.cand_ids = self.cand_key.view(i32)       # a LEAN row's column list: [rows, 2 * cap] int32
        self.nbytes = total

    def state(self, token, valid):
        return (self.stage, self.flags, token, valid, self.raw, self.m, self.t1, self.tkey,
                self.klo, self.khi, self.shift, self.cabove, self.mabove, self.S, self.piv)


def hist_width(cfg: KernelConfig) -> int:
    """int32 words a row of the workspace's `hist`: the top-p list's x (2 * cap, until the list
    kernel has read them; then the first SCRATCH_WORDS are its search's scratch), then the
    bracket's bins (hist_bins). Even, so a row's words start 8-byte aligned."""
    return max(cfg.hist_bins, 2 * cfg.cap, SCRATCH_WORDS)


def reg_cap(cuda: bool, regs: int | None) -> dict:
    """The launch option that caps a kernel's registers a thread (Triton's `maxnreg`) on CUDA;
    none elsewhere, or when `regs` is None."""
    return {"maxnreg": regs} if cuda and regs else {}


def list_warps(dev: torch.device, cfg: KernelConfig) -> int:
    """Warps of the list kernel's programs (one a row): `list_warps` when set; else 8 on CUDA,
    with `list_regs` (128) registers a thread so that two programs share a SM (the call waits on
    one row's chain of reductions, which more warps shorten, and the programs that queue are
    half as many), and 4 elsewhere. Device time on an H200, T 0.8 / top-p 0.9 over 151,936
    columns, at 32 / 256 / 1,024 rows: 8 warps at 128 registers 18.3 / 26.4 / 92.3 us, where
    the compiler's 175 registers left one program a SM (18.3 / 36.5, and 4 warps 144.6 at 1,024
    rows); 16 warps at 64 registers 16.9 / ~29 / ~97 (docs/benchmarks.md)."""
    if cfg.list_warps is not None:
        return cfg.list_warps
    return 8 if dev.type == "cuda" else 4


def block_max_cols(cols: int, cfg: KernelConfig) -> int:
    if cfg.block_max_cols is not None:
        return cfg.block_max_cols
    return min(128, max(16, _pow2(math.ceil(cols / 2048))))


@functools.lru_cache(maxsize=64)
def list_blocks(nblk: int, cfg: KernelConfig) -> int:
    """k of the block maximum that bounds the hist pass's guessed list. Were the row's
    values exchangeable, n entries above a bound would leave about nblk * (1 - exp(-n / nblk))
    blocks with a maximum above it; k is that count for n = `list_room` (by default 3/4 of the
    list's room), so the list usually fits and holds the kept set of a top-p row
    (docs/benchmarks.md)."""
    room = cfg.list_room
    return max(1, min(nblk, round(nblk * -math.expm1(-room / nblk))))


def workspace_for(rows, splits, nblk, cfg, dev) -> Workspace:
    """The workspace of this shape on the current stream (see `launcher.stream_scratch`): reusing
    it across calls saves ~30 tensor views per call."""
    return stream_scratch(dev, ("sample", rows, splits, nblk, cfg), lambda: Workspace(rows, splits, nblk, cfg, dev))


def workspace_bytes(rows: int, cols: int, cfg: KernelConfig, device) -> int:
    """Bytes of the sample_rows workspace for this shape (the kernels' only extra memory), for
    the larger of the filter and plain launch shapes."""
    cuda = torch.device(device).type == "cuda"
    shapes = (filter_config(cfg), plain_config(cfg), draw_config(cfg, cuda))
    splits = max(num_splits(rows, cols, device, c) for c in shapes)
    nblk = math.ceil(cols / block_max_cols(cols, cfg))
    return Workspace(rows, splits, nblk, cfg, torch.device("meta")).nbytes


@functools.lru_cache(maxsize=16)
def plain_config(cfg: KernelConfig) -> KernelConfig:
    """The launch shape of a batch with no filter row, whose scan does the whole draw: steps of
    `plain_scan_cols` (measured on an H200, temperature only at 256 x 151,936: 107 against 124 us
    of device time; batches with filter rows were slower with them, so they keep `scan_cols`).
    Never longer than `scan_cols`, so a shape set for a test stays what it says."""
    return dataclasses.replace(cfg, scan_cols=min(cfg.scan_cols, cfg.plain_scan_cols))


DRAW_SCAN_COLS_CUDA = 128      # `draw_scan_cols` None on CUDA


@functools.lru_cache(maxsize=16)
def draw_config(cfg: KernelConfig, cuda: bool) -> KernelConfig:
    """The launch shape of a batch with a temperature-only row and no filter row (the scan draws
    the token): steps of at most `draw_scan_cols` and `draw_scan_warps` warps, so the per-step
    "may an entry win?" reduction stays inside one warp (measured on an H200, temperature only at
    256 x 151,936: 108 -> 101 us of device time against `plain_config`'s 512 columns and 4 warps;
    with the step's margin and the noise's spread add, 128 columns against 256: 17.9 / 80.6 /
    276.9 against 23.3 / 85.2 / 281.2 us at 32 / 256 / 1,024 rows, 512: 36 / 112 / 301).
    `draw_scan_cols` None is DRAW_SCAN_COLS_CUDA on CUDA and `plain_scan_cols` elsewhere: the
    interpreter's cost is per step, not per entry. Greedy-only batches keep `plain_config`."""
    plain = plain_config(cfg)
    cols = cfg.draw_scan_cols
    if cols is None:
        cols = DRAW_SCAN_COLS_CUDA if cuda else plain.scan_cols
    return dataclasses.replace(plain, scan_cols=min(plain.scan_cols, cols), scan_warps=cfg.draw_scan_warps)


@functools.lru_cache(maxsize=16)
def filter_config(cfg: KernelConfig) -> KernelConfig:
    """The launch shape of a batch with a filter row: round-pass steps of at most `filter_block`
    columns and `filter_programs_per_sm` programs per SM. The one-warp round programs are bound
    by their serial loops, with fewer of them resident than an SM can hold (docs/benchmarks.md),
    so more and shorter ones fill it better: measured on an H200 (device time, 256 / 1,024 rows
    x 151,936) top-p alone 413 -> 365 / 1,513 -> 1,314 us, top-k + top-p 140 -> 133 / 470 -> 430,
    min-p 107 -> 98 / 351 -> 330. Never a longer step than `block`."""
    pps = cfg.programs_per_sm if cfg.filter_programs_per_sm is None else cfg.filter_programs_per_sm
    return dataclasses.replace(cfg, block=min(cfg.block, cfg.filter_block), programs_per_sm=pps)


@functools.lru_cache(maxsize=64)
def _geometry(rows: int, cols: int, dev: torch.device, cfg: KernelConfig) -> tuple:
    """(splits, BB, TILE, CHUNK, number of BB blocks) of a launch shape (host arithmetic, once)."""
    splits = num_splits(rows, cols, dev, cfg)
    bb = block_max_cols(cols, cfg)
    tile = max(1, cfg.scan_cols // bb)
    step = tile * bb
    chunk = max(step, math.ceil(math.ceil(cols / splits) / step) * step)
    chunk = math.ceil(chunk / cfg.block) * cfg.block if chunk % cfg.block else chunk
    return splits, bb, tile, chunk, math.ceil(cols / bb)


def launch_sample(x, params, col_offset: int, shift: int, hints: RowHints, exact_exp: bool, cfg: KernelConfig,
                  nans_out=None, out=None):
    """out: optional (token [R] int64, valid [R] bool) to write into instead of new tensors."""
    t, k, p, lmp, key0, key1 = params
    rows, cols = x.shape
    dev = x.device
    cuda = dev.type == "cuda"       # compiled (else the interpreter, which runs no inline PTX)
    if hints.any_filter:
        cfg = filter_config(cfg)
    else:
        cfg = draw_config(cfg, cuda) if hints.any_plain else plain_config(cfg)
    splits, bb, tile, chunk, nblk = _geometry(rows, cols, dev, cfg)
    ws = workspace_for(rows, splits, nblk, cfg, dev)
    if out is None:
        token = torch.empty(rows, dtype=torch.int64, device=dev)
        valid = torch.empty(rows, dtype=torch.bool, device=dev)
    else:
        token, valid = out
    # what decides every launch key below (the workspace views are 256-byte aligned by
    # construction), so the launches skip their per-argument keys
    site = (dev, x.dtype, x.data_ptr() & 15 == 0, x.stride(0), rows, cols, col_offset, shift, hints, exact_exp, cfg,
            tuple([v.data_ptr() & 15 == 0 for v in params]), token.data_ptr() & 15 == 0, valid.data_ptr() & 15 == 0)
    nw = cfg.num_warps
    lcap = 2 * cfg.cap          # a top-p row's column list, in cand_key's bytes read as int32
    SCAN.at(site, (rows, splits), x, x.stride(0), cols, t, k, p, lmp, key0, key1, col_offset,
         ws.raw_v, ws.raw_i, ws.max, ws.best_v, ws.best_i, ws.nans, ws.bmax,
         nblk, NSPLIT=splits, CHUNK=chunk, TILE=tile, BB=bb, EXACT_EXP=exact_exp, MODES=hints.modes, PTX=cuda,
         num_warps=cfg.scan_warps)
    SELECT.at(site, (rows,), x, x.stride(0), t, k, p, lmp, cols, col_offset, ws.raw_v, ws.raw_i, ws.max, ws.best_v,
           ws.best_i, ws.bmax, nblk, ws.stage, token, valid, ws.raw, ws.m, ws.t1, ws.flags, ws.tkey,
           ws.klo, ws.khi, ws.shift, ws.cabove, ws.mabove, ws.piv, ws.cand_n, ws.hlo, ws.hinv, ws.xf,
           list_blocks(nblk, cfg), NSPLIT=splits, NBP=_pow2(nblk), CAP=cfg.cap, P=cfg.pivots, NB=cfg.bins,
           num_warps=cfg.row_warps)
    if hints.any_filter:
        # one round settles almost every row (min-p always; top-k / top-p unless the candidates
        # overflow or the bracket fails); the drain kernel finishes the others on the device, so
        # the host never waits
        scale = float(2.0 ** shift)
        stages = (3 if hints.any_top_k_or_p else 2) | (8 if hints.any_top_p_alone else 0)
        fallbacks, leans = fallback_counter(dev), lean_counter(dev)
        if hints.any_top_p_alone:
            hb, hw = cfg.hist_block or cfg.block, cfg.hist_warps or nw
            hist_args = (x, x.stride(0), cols, t, p, scale, ws.stage, ws.m, ws.tkey, ws.hlo, ws.hinv, ws.hist,
                         ws.p_mass, ws.xf, ws.cand_ids, ws.cand_n, ws.arrive, ws.bfirst, ws.blast, ws.bcount,
                         ws.lean_l, ws.top_bin, ws.top_mass)
            hist_shape = dict(NSPLIT=splits, CHUNK=chunk, BLOCK=hb, NBH=cfg.hist_bins, EXACT_EXP=exact_exp,
                              LCAP=lcap, LG=cfg.list_groups, PTX=cuda, ALL=min(cfg.bracket_all, cfg.cap),
                              CAP=cfg.cap, LEAN=cfg.lean, HW=hist_width(cfg), num_warps=hw)
            pack = cuda and cfg.list_pack and hb % (128 * hw) == 0     # 4 entries a thread, whole
            HIST.at(site, (rows, splits), *hist_args, PACK=pack, BINS=False, **hist_shape,
                    **reg_cap(cuda, cfg.hist_regs))
            LIST.at(site, (rows,), t, p, key0, key1, col_offset, scale, 1 << shift, ws.stage, ws.m, ws.tkey, ws.raw,
                    token, valid, ws.xf, ws.p_mass, ws.cand_ids, ws.cand_n, ws.hist, ws.arrive, listed_counter(dev),
                    ws.hlo, ws.hinv, ws.top_bin, ws.top_mass, NSPLIT=splits, LCAP=lcap, LG=cfg.list_groups,
                    NBH=cfg.hist_bins, HW=hist_width(cfg), EXACT_EXP=exact_exp, PTX=cuda,
                    num_warps=list_warps(dev, cfg), **reg_cap(cuda, cfg.list_regs))
            BINS.at(site, (rows, splits), *hist_args, PACK=False, BINS=True, **hist_shape,
                    **reg_cap(cuda, BINS_MAXNREG))
        ROUND.at(site, (rows, splits), x, x.stride(0), cols, t, key0, key1, col_offset, scale, 1 << shift,
              ws.stage, ws.flags, ws.m, ws.tkey, ws.klo, ws.khi, ws.shift, ws.piv,
              ws.cand_key, ws.cand_id, ws.cand_n, ws.best_v, ws.best_i, ws.p_cnt,
              ws.p_mass, ws.p_cgt, ws.p_mgt, ws.p_hist, ws.pending, ws.hlo, ws.hinv, ws.bfirst, ws.blast, ws.bcount,
              ws.xf, ws.cand_ids, NSPLIT=splits, CHUNK=chunk, BLOCK=cfg.block, CAP=cfg.cap, P=cfg.pivots,
              NB=cfg.bins, EXACT_EXP=exact_exp, STAGES=stages, NBH=cfg.hist_bins, LCAP=lcap,
              LEAN_BLOCK=cfg.lean_block, LG=cfg.list_groups, num_warps=nw)
        FINISH.at(site, (rows,), cols, k, p, key0, key1, col_offset, scale, 1 << shift, *ws.state(token, valid),
               ws.cand_key, ws.cand_id, ws.cand_n, ws.best_v, ws.best_i, ws.p_cnt, ws.p_mass,
               ws.p_cgt, ws.p_mgt, ws.p_hist, ws.pending, ws.bcount, fallbacks,
               x, x.stride(0), t, ws.hlo, ws.hinv, ws.blast, ws.lean_l, ws.cand_ids, leans,
               NSPLIT=splits, CAP=cfg.cap, SMALL=cfg.small, P=cfg.pivots, NB=cfg.bins,
               EXACT_EXP=exact_exp, STAGES=stages, LCAP=lcap, FC=cfg.lean_read_cols, NBH=cfg.hist_bins,
               LG=cfg.list_groups, num_warps=cfg.row_warps)
        if hints.any_top_k_or_p:
            DRAIN.at(site, (rows,), x, x.stride(0), cols, t, k, p, key0, key1, col_offset, scale, 1 << shift,
                  *ws.state(token, valid), ws.cand_key, ws.cand_id, ws.cand_n, ws.best_v, ws.best_i, ws.p_cnt,
                  ws.p_mass, ws.p_cgt, ws.p_mgt, ws.p_hist, ws.hlo, ws.hinv, ws.bfirst, ws.blast, ws.bcount, fallbacks,
                  ws.xf, ws.lean_l, ws.cand_ids, leans,
                  NSPLIT=splits, CHUNK=chunk, BLOCK=cfg.block, CAP=cfg.cap, SMALL=cfg.small, P=cfg.pivots,
                  NB=cfg.bins, EXACT_EXP=exact_exp, MAX_ROUNDS=MAX_ROUNDS, NBH=cfg.hist_bins,
                  num_warps=cfg.row_warps)
    if isinstance(nans_out, str) and nans_out == "partials":
        return token, valid, ws.nans.view(rows, splits)
    if nans_out is not None:
        nans_out.copy_(ws.nans.view(rows, splits).sum(dim=1))
    return token, valid
