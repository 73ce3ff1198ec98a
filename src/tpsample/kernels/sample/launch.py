"""Host side of `sample_rows`: its entry point, the launch shapes, the workspace and the launch
sequence (scan, select, rounds).

Launches: scan (rows x splits), [sigma_sums_kernel (rows x splits), only when some row has
top-n-sigma], select (rows); then, only if some row filters, [hist_kernel
(rows x splits: mass and list), list_kernel (rows) and hist_kernel again (rows x splits: the bins
of the rows the list left, and their brackets), only when some row has top-p without top-k], one
round [round_kernel (rows x splits), finish_kernel (rows)], and, when some row has top-k / top-p,
drain_kernel (rows), which finishes the rows the round left searching (one program per row);
last, only when asked (`Kept`: a kept support or XTC), kept_kernel (the selected rows, kept.py).
The sequence is fixed: the host never reads the device, so the call is CUDA-graph capturable.

A row moves through stages (scan.py holds their constants), each one streaming pass
(round_kernel) plus one per-row step (finish_kernel), until DONE:
- COLLECT: the candidates {eligible, klo <= key <= khi} are gathered; with FAST the window holds
  every token that can be kept, so the finish resolves top-k, top-p and the draw from them.
- HIST: the general exact search. The target threshold (top-k's k-th largest key, or top-p's
  smallest key kappa* with float64(mass of keys > kappa*) < p * S) lies in the key window
  [klo, khi]; count and mass strictly above khi are carried exactly (cabove, mabove). Each pass
  measures the exact count and mass above P pivot keys, which shrinks the window to the span
  between two pivots, and a histogram of the window that places the next pivots at count
  quantiles. Once the window holds <= CAP entries it is collected and resolved exactly.
- DRAW: the masked Gumbel argmax over {key >= tkey}.
- LIST: top-p without top-k: the hist pass (its mass and its list), then the list kernel
  (lists.py), which settles most rows (DONE); the others take BINS.
- BINS: the bins pass, whose last program a row makes its bracket (bracket.py): BRACKET or LEAN.
- BRACKET: the bracket's third pass (its candidates collected) and their resolution; a row
  whose bracket does not certify starts HIST.
- LEAN: a BINS row with few entries from the bracket up: its third pass only lists columns and
  a per-row step resolves them (lists.py); a row that does not certify starts HIST.
All decisions use exact integers (counts, int64 masses) or keys, so the result is the threshold
of the definition no matter how the search went.

The workspace (`Workspace`) is O(rows x (V / BB + CAP)) bytes, one allocation per launch shape
and stream, reused by every later call.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from ...numerics import mass_shift, next_pow2
from ..launcher import (
    DEFAULT,
    MAX_ROUNDS,
    KernelConfig,
    Launcher,
    RowHints,
    _cache_hash,
    fallback_counter,
    interpreting,
    lean_counter,
    listed_counter,
    num_splits,
    row_hints,
    stream_scratch,
)

KEPT_STEP = 1024    # the kept pass's columns a step: a step whose blocks all lie below the kept set is not read
KEPT_WARPS = 4
# the sigma pass's columns a step and warps: its per-entry work (an exact division, float64 grid
# arithmetic) is independent entry to entry, so wide steps keep many in flight
SIGMA_STEP, SIGMA_WARPS = 1024, 4


@functools.cache
def _passes() -> SimpleNamespace:
    """The passes' launchers and the workspace layout constants the kernels define, built on first
    use: triton.jit picks interpreted or compiled when a kernel module is imported, so this
    module imports none (the package re-exports `sample_rows` without building a kernel)."""
    from ..tlutil import SCRATCH_WORDS
    from .finish import finish_kernel
    from .kept import kept_kernel
    from .lists import hist_kernel, list_kernel
    from .rounds import drain_kernel, round_kernel
    from .scan import CN_STRIDE, scan_kernel
    from .select import select_kernel
    from .sigma import sigma_sums_kernel
    names = ("SCAN", "SIGMA", "SELECT", "HIST", "LIST", "BINS", "ROUND", "FINISH", "DRAIN", "KEPT")
    kernels = (scan_kernel, sigma_sums_kernel, select_kernel, hist_kernel, list_kernel, hist_kernel, round_kernel,
               finish_kernel, drain_kernel, kept_kernel)
    return SimpleNamespace(**{n: Launcher(k) for n, k in zip(names, kernels)}, CN_STRIDE=CN_STRIDE,
                           SCRATCH_WORDS=SCRATCH_WORDS)


def hints_from_params(temperature, top_k, top_p, log_min_p, vocab_size: int, n_sigma=None) -> RowHints:
    """RowHints from the per-row parameter tensors (one device sync if they live on the GPU);
    a top-n-sigma row filters as a min-p row does."""
    thresholded = log_min_p > float("-inf")
    if n_sigma is not None:
        thresholded = thresholded | (n_sigma > 0)
    return row_hints(temperature, top_k, top_p, thresholded, vocab_size)


@dataclass(frozen=True)
class Kept:
    """What `sample_rows`'s kept pass reads (kept.py): rows, [n] int64 on x's device, the rows it
    reads (each once); with XTC, xtc_threshold [R] fp32 and coin [R] bool (the row's seeded coin
    came up), else None."""
    rows: torch.Tensor
    xtc_threshold: torch.Tensor | None = None
    coin: torch.Tensor | None = None


@functools.cache
def _interpreting_on_cuda() -> bool:
    """TRITON_INTERPRET on a CUDA machine, read once: it is fixed when the process starts there
    (the tests set it per module only on machines without CUDA)."""
    return interpreting()


def sample_rows(x, temperature, top_k, top_p, log_min_p, key0, key1, *, col_offset: int = 0,
                vocab_size_global: int | None = None, hints: RowHints | None = None,
                exact_exp: bool | None = None, cfg: KernelConfig = DEFAULT, nans_out=None, out=None, n_sigma=None,
                kept=None):
    """Sample one token per row (semantics above). Returns (token_ids [R] int64 global ids,
    valid [R] bool: False where the guard chose the token). nans_out="partials": also return the
    [R, splits] int32 per-split NaN counts (sum them per row). nans_out: optional [R] int64 tensor
    that receives each row's NaN count (counted in the first pass, no extra read of x).
    out: optional (token_ids [R] int64, valid [R] bool) written instead of new tensors (the
    per-row parameters must then already be contiguous, on x's device, in the dtypes above).
    n_sigma: optional [R] top-n-sigma (<= 0: off); None, the batch has none: the kernels then
    compile and launch nothing for it. kept: optional `Kept` (rows whose kept set to
    measure, and XTC's threshold and coins): one more pass over those rows, whose XTC rows are
    redrawn under XTC's upper bound; the result then ends with (count, smallest, largest, upper)
    [R] of their kept values (kept.py)."""
    rows, cols = x.shape
    if rows == 0:      # a rank that owns no rows this step (batch_sharded) still returns the same shapes
        empty = (torch.zeros(0, dtype=torch.int64, device=x.device), torch.zeros(0, dtype=torch.bool, device=x.device))
        return (*empty, torch.zeros(0, 1, dtype=torch.int32, device=x.device)) if isinstance(nans_out, str) else empty
    if x.stride(1) != 1:
        raise ValueError("x must have unit column stride")
    dev = x.device
    if out is not None:      # the caller's own buffers: its parameters are in place already
        params = (temperature, top_k, top_p, log_min_p, key0, key1)
    else:
        params = tuple(v.to(dev, dt).contiguous() for v, dt in (
            (temperature, torch.float32), (top_k, torch.int32), (top_p, torch.float32), (log_min_p, torch.float32),
            (key0, torch.int64), (key1, torch.int64)))
    if n_sigma is not None and out is None:
        n_sigma = n_sigma.to(dev, torch.float32).contiguous()
    if hints is None:
        hints = hints_from_params(params[0], params[1], params[2], params[3], cols, n_sigma)
    if exact_exp is None:
        exact_exp = dev.type == "cuda" and not _interpreting_on_cuda()
    shift = mass_shift(vocab_size_global or cols)
    return launch_sample(x, params, col_offset, shift, hints, exact_exp, cfg, nans_out, out, n_sigma, kept)


@dataclass(frozen=True)
class Shape:
    """The launch shape of one kind of batch (`filter_config`, `plain_config`, `draw_config`): the
    config, and the round passes' step, the scan's step and warps and the programs a SM that kind
    takes. Hashed once: every launch of a call hashes it."""
    cfg: KernelConfig
    block: int
    scan_cols: int
    scan_warps: int
    programs_per_sm: int

    def __post_init__(self):
        _cache_hash(self)

    def __hash__(self):
        return self._hash

    @property
    def splits(self) -> int | None:
        return self.cfg.splits


def reg_cap(cuda: bool, regs: int | None) -> dict:
    """The launch option that caps a kernel's registers a thread (Triton's `maxnreg`) on CUDA;
    none elsewhere, or when `regs` is None."""
    return {"maxnreg": regs} if cuda and regs else {}


def list_warps(dev: torch.device, cfg: KernelConfig) -> int:
    """Warps of the list kernel's programs (one a row): `list_warps` when set; else 8 on CUDA
    (the call waits on one row's chain of reductions, which more warps shorten), with
    `list_regs` registers a thread so that two programs share a SM, and 4 elsewhere."""
    if cfg.list_warps is not None:
        return cfg.list_warps
    return 8 if dev.type == "cuda" else 4


def lane_ptx(cuda: bool, lanes: int, warps: int) -> bool:
    """Whether a kernel whose vectors hold `lanes` entries, run by `warps` warps, may take the
    per-lane PTX atomics and stores (`tlutil.claim_where`, `store_where`, `count_where`,
    `claim_slots`): compiled for CUDA, and every entry held by one thread only. With fewer
    entries than threads Triton repeats each entry over several threads; its own atomics and
    stores mask the copies, inline PTX cannot, so every copy would claim a slot of its own (a list
    with repeats and holes, writes past its room, a wrong threshold)."""
    return cuda and lanes >= 32 * warps


def block_max_cols(cols: int) -> int:
    """BB, the columns of a block whose maximum the scan keeps: 16..128 from V."""
    return min(128, max(16, next_pow2(math.ceil(cols / 2048))))


@functools.lru_cache(maxsize=64)
def list_blocks(nblk: int, cfg: KernelConfig) -> int:
    """k of the block maximum that bounds the hist pass's guessed list. Were the row's
    values exchangeable, n entries above a bound would leave about nblk * (1 - exp(-n / nblk))
    blocks with a maximum above it; k is that count for n = `list_room` (by default 3/4 of the
    list's room), so the list usually fits and holds the kept set of a top-p row."""
    room = cfg.list_room
    return max(1, min(nblk, round(nblk * -math.expm1(-room / nblk))))


def workspace_for(rows: int, splits: int, nblk: int, shape: Shape, dev) -> Workspace:
    """The workspace of this shape on the current stream, reused across calls
    (`launcher.stream_scratch`)."""
    return stream_scratch(dev, ("sample", rows, splits, nblk, shape),
                          lambda: Workspace(rows, splits, nblk, shape.cfg, dev))


def workspace_bytes(rows: int, cols: int, cfg: KernelConfig, device) -> int:
    """Bytes of the sample_rows workspace for this shape (the kernels' only extra memory), for
    the larger of the filter and plain launch shapes."""
    cuda = torch.device(device).type == "cuda"
    shapes = (filter_config(cfg), plain_config(cfg), draw_config(cfg, cuda))
    splits = max(num_splits(rows, cols, device, s) for s in shapes)
    nblk = math.ceil(cols / block_max_cols(cols))
    return Workspace(rows, splits, nblk, cfg, torch.device("meta")).nbytes


@functools.lru_cache(maxsize=16)
def plain_config(cfg: KernelConfig) -> Shape:
    """The launch shape of a batch with no filter row, whose scan does the whole draw: steps of
    `plain_scan_cols`, never longer than `scan_cols` (so a shape set for a test stays what it
    says)."""
    return Shape(cfg, cfg.block, min(cfg.scan_cols, cfg.plain_scan_cols), cfg.scan_warps, cfg.programs_per_sm)


@functools.lru_cache(maxsize=16)
def draw_config(cfg: KernelConfig, cuda: bool) -> Shape:
    """The launch shape of a batch with a temperature-only row and no filter row (the scan draws
    the token): steps of at most `draw_scan_cols` and `draw_scan_warps` warps, so the per-step
    "may an entry win?" reduction stays inside one warp. `draw_scan_cols` None is `draw_scan_cols_cuda` on CUDA and `plain_scan_cols` elsewhere: the
    interpreter's cost is per step, not per entry. Greedy-only batches keep `plain_config`."""
    plain = plain_config(cfg)
    cols = cfg.draw_scan_cols
    if cols is None:
        cols = cfg.draw_scan_cols_cuda if cuda else plain.scan_cols
    return Shape(cfg, cfg.block, min(plain.scan_cols, cols), cfg.draw_scan_warps, cfg.programs_per_sm)


@functools.lru_cache(maxsize=16)
def filter_config(cfg: KernelConfig) -> Shape:
    """The launch shape of a batch with a filter row: round-pass steps of at most `filter_block`
    columns and `filter_programs_per_sm` programs per SM. The one-warp round programs are bound
    by their serial loops, with fewer of them resident than an SM can hold, so more and shorter
    ones fill it better. Never a longer step than `block`."""
    return Shape(cfg, min(cfg.block, cfg.filter_block), cfg.scan_cols, cfg.scan_warps, cfg.filter_programs_per_sm)


@functools.lru_cache(maxsize=64)
def _geometry(rows: int, cols: int, dev: torch.device, shape: Shape) -> tuple:
    """(splits, BB, TILE, CHUNK, number of BB blocks) of a launch shape (host arithmetic, once)."""
    splits = num_splits(rows, cols, dev, shape)
    bb = block_max_cols(cols)
    tile = max(1, shape.scan_cols // bb)
    step = tile * bb
    chunk = max(step, math.ceil(math.ceil(cols / splits) / step) * step)
    chunk = math.ceil(chunk / shape.block) * shape.block if chunk % shape.block else chunk
    return splits, bb, tile, chunk, math.ceil(cols / bb)


def launch_sample(x, params, col_offset: int, shift: int, hints: RowHints, exact_exp: bool, cfg: KernelConfig,
                  nans_out=None, out=None, n_sigma=None, kept: Kept | None = None):
    """out: optional (token [R] int64, valid [R] bool) to write into instead of new tensors.
    n_sigma: optional [R] fp32 top-n-sigma (<= 0: off); None: no row has it (nothing compiled
    or launched for it). kept: the kept pass's rows (`Kept`); then the result ends with
    (count [R] int64, smallest [R] fp32, largest [R] fp32, upper [R] fp32) of the kept values,
    written at those rows only (kept.py)."""
    t, k, p, lmp, key0, key1 = params
    rows, cols = x.shape
    dev = x.device
    K = _passes()
    cuda = dev.type == "cuda"       # compiled (else the interpreter, which runs no inline PTX)
    if hints.any_filter:
        shape = filter_config(cfg)
    else:
        shape = draw_config(cfg, cuda) if hints.any_plain else plain_config(cfg)
    splits, bb, tile, chunk, nblk = _geometry(rows, cols, dev, shape)
    ws = workspace_for(rows, splits, nblk, shape, dev)
    if out is None:
        token = torch.empty(rows, dtype=torch.int64, device=dev)
        valid = torch.empty(rows, dtype=torch.bool, device=dev)
    else:
        token, valid = out
    # what decides every launch key below (the workspace views are 256-byte aligned by
    # construction), so the launches skip their per-argument keys
    site = (dev, x.dtype, x.data_ptr() & 15 == 0, x.stride(0), rows, cols, col_offset, shift, hints, exact_exp, shape,
            tuple([v.data_ptr() & 15 == 0 for v in params]), token.data_ptr() & 15 == 0, valid.data_ptr() & 15 == 0,
            None if n_sigma is None else n_sigma.data_ptr() & 15 == 0, kept is not None)
    sigma = n_sigma is not None     # B below: numerics.sigma_bits of the vocabulary, mass_shift // 2
    nw = cfg.num_warps
    block = shape.block
    lcap = 2 * cfg.cap          # a top-p row's column list, in cand_key's bytes read as int32
    K.SCAN.at(site, (rows, splits), x, x.stride(0), cols, t, k, p, lmp, key0, key1, col_offset,
         ws.raw_v, ws.raw_i, ws.max, ws.best_v, ws.best_i, ws.nans, ws.bmax,
         nblk, n_sigma, ws.sig_lo, ws.sig_hi, NSPLIT=splits, CHUNK=chunk, TILE=tile, BB=bb, EXACT_EXP=exact_exp,
         MODES=hints.modes, PTX=cuda, SIGMA=sigma, num_warps=shape.scan_warps)
    if sigma:
        K.SIGMA.at(site, (rows, splits), x, x.stride(0), cols, t, n_sigma, ws.sig_lo, ws.sig_hi, ws.sig_sums,
                 ws.sig_top, ws.sig_scale, NSPLIT=splits, CHUNK=chunk, BLOCK=min(SIGMA_STEP, next_pow2(chunk)),
                 B=shift // 2, num_warps=SIGMA_WARPS)
    K.SELECT.at(site, (rows,), x, x.stride(0), t, k, p, lmp, cols, col_offset, ws.raw_v, ws.raw_i, ws.max, ws.best_v,
           ws.best_i, ws.bmax, nblk, ws.stage, token, valid, ws.raw, ws.m, ws.t1, ws.flags, ws.tkey,
           ws.klo, ws.khi, ws.shift, ws.cabove, ws.mabove, ws.piv, ws.cand_n, ws.hlo, ws.hinv, ws.xf,
           list_blocks(nblk, cfg), n_sigma, ws.sig_sums, ws.sig_top, ws.sig_scale, NSPLIT=splits,
           NBP=next_pow2(nblk), CAP=cfg.cap, P=cfg.pivots, NB=cfg.bins, SIGMA=sigma, PTX=cuda,
           num_warps=cfg.row_warps)
    if hints.any_filter:
        # one round settles almost every row (min-p always; top-k / top-p unless the candidates
        # overflow or the bracket fails); the drain kernel finishes the others on the device, so
        # the host never waits
        scale = float(2.0 ** shift)
        stages = (3 if hints.any_top_k_or_p else 2) | (8 if hints.any_top_p_alone else 0)
        fallbacks, leans = fallback_counter(dev), lean_counter(dev)
        if hints.any_top_p_alone:
            hb, hw = cfg.hist_block or block, cfg.hist_warps or nw
            lw = list_warps(dev, cfg)
            hist_ptx = lane_ptx(cuda, hb, hw)
            hist_args = (x, x.stride(0), cols, t, p, scale, ws.stage, ws.m, ws.tkey, ws.hlo, ws.hinv, ws.hist,
                         ws.p_mass, ws.xf, ws.cand_ids, ws.cand_n, ws.arrive, ws.bfirst, ws.blast, ws.bcount,
                         ws.lean_l, ws.top_bin, ws.top_mass)
            hist_shape = dict(NSPLIT=splits, CHUNK=chunk, BLOCK=hb, NBH=cfg.hist_bins, EXACT_EXP=exact_exp,
                              LCAP=lcap, LG=cfg.list_groups, PTX=hist_ptx, ALL=min(cfg.bracket_all, cfg.cap),
                              CAP=cfg.cap, LEAN="bracket" not in cfg.force, HW=hist_width(cfg), num_warps=hw)
            # 4 entries a thread, whole
            pack = hist_ptx and "unpacked" not in cfg.force and hb % (128 * hw) == 0
            K.HIST.at(site, (rows, splits), *hist_args, PACK=pack, BINS=False, **hist_shape)
            K.LIST.at(site, (rows,), t, p, key0, key1, col_offset, scale, 1 << shift, ws.stage, ws.m, ws.tkey, ws.raw,
                    token, valid, ws.xf, ws.p_mass, ws.cand_ids, ws.cand_n, ws.hist, ws.arrive, listed_counter(dev),
                    ws.hlo, ws.hinv, ws.top_bin, ws.top_mass, NSPLIT=splits, LCAP=lcap, LG=cfg.list_groups,
                    NBH=cfg.hist_bins, HW=hist_width(cfg), EXACT_EXP=exact_exp, PTX=lane_ptx(cuda, lcap, lw),
                    KEPT=kept is not None, num_warps=lw, **reg_cap(cuda, cfg.list_regs))
            K.BINS.at(site, (rows, splits), *hist_args, PACK=False, BINS=True, **hist_shape,
                    **reg_cap(cuda, cfg.bins_regs))
        K.ROUND.at(site, (rows, splits), x, x.stride(0), cols, t, key0, key1, col_offset, scale, 1 << shift,
              ws.stage, ws.flags, ws.m, ws.tkey, ws.klo, ws.khi, ws.shift, ws.piv,
              ws.cand_key, ws.cand_id, ws.cand_n, ws.best_v, ws.best_i, ws.p_cnt,
              ws.p_mass, ws.p_cgt, ws.p_mgt, ws.p_hist, ws.pending, ws.hlo, ws.hinv, ws.bfirst, ws.blast, ws.bcount,
              ws.xf, ws.cand_ids, NSPLIT=splits, CHUNK=chunk, BLOCK=block, CAP=cfg.cap, P=cfg.pivots,
              NB=cfg.bins, EXACT_EXP=exact_exp, STAGES=stages, NBH=cfg.hist_bins, LCAP=lcap,
              LEAN_BLOCK=cfg.lean_block, LG=cfg.list_groups, num_warps=nw)
        K.FINISH.at(site, (rows,), cols, k, p, key0, key1, col_offset, scale, 1 << shift, *ws.state(token, valid),
               ws.cand_key, ws.cand_id, ws.cand_n, ws.best_v, ws.best_i, ws.p_cnt, ws.p_mass,
               ws.p_cgt, ws.p_mgt, ws.p_hist, ws.pending, ws.bcount, fallbacks,
               x, x.stride(0), t, ws.hlo, ws.hinv, ws.blast, ws.lean_l, ws.cand_ids, leans,
               NSPLIT=splits, CAP=cfg.cap, SMALL=cfg.small, P=cfg.pivots, NB=cfg.bins,
               EXACT_EXP=exact_exp, STAGES=stages, LCAP=lcap, FC=cfg.lean_read_cols, NBH=cfg.hist_bins,
               LG=cfg.list_groups, KEPT=kept is not None, num_warps=cfg.row_warps)
        if hints.any_top_k_or_p:
            K.DRAIN.at(site, (rows,), x, x.stride(0), cols, t, k, p, key0, key1, col_offset, scale, 1 << shift,
                  *ws.state(token, valid), ws.cand_key, ws.cand_id, ws.cand_n, ws.best_v, ws.best_i, ws.p_cnt,
                  ws.p_mass, ws.p_cgt, ws.p_mgt, ws.p_hist, ws.hlo, ws.hinv, ws.bfirst, ws.blast, ws.bcount, fallbacks,
                  ws.xf, ws.lean_l, ws.cand_ids, leans,
                  NSPLIT=splits, CHUNK=chunk, BLOCK=block, CAP=cfg.cap, SMALL=cfg.small, P=cfg.pivots,
                  NB=cfg.bins, EXACT_EXP=exact_exp, MAX_ROUNDS=MAX_ROUNDS, NBH=cfg.hist_bins,
                  KEPT=kept is not None, num_warps=cfg.row_warps)
    extent = ()
    if kept is not None:
        extent = launch_kept(site, x, params, col_offset, shift, n_sigma, ws, nblk, bb, token, valid, kept,
                             exact_exp)
    if isinstance(nans_out, str) and nans_out == "partials":
        return token, valid, ws.nans.view(rows, splits), *extent
    if nans_out is not None:
        nans_out.copy_(ws.nans.view(rows, splits).sum(dim=1))
    return token, valid, *extent


def launch_kept(site, x, params, col_offset: int, shift: int, n_sigma, ws: Workspace, nblk: int, bb: int, token,
                valid, kept: Kept, exact_exp: bool) -> tuple:
    """The kept pass over `kept.rows` (kept.py), in steps of KEPT_STEP columns (whole blocks of
    the scan's BB) by KEPT_WARPS warps: (count, smallest, largest, upper), [R] each."""
    t, k, p, lmp, key0, key1 = params
    rows, dev = x.shape[0], x.device
    count = torch.empty(rows, dtype=torch.int64, device=dev)
    low, top, upper = (torch.empty(rows, dtype=torch.float32, device=dev) for _ in range(3))
    xtc = kept.coin is not None
    xthr, coin = (kept.xtc_threshold, kept.coin) if xtc else (t, valid)      # (not read without XTC)
    aligned = tuple(v.data_ptr() & 15 == 0 for v in (kept.rows, xthr, coin))
    _passes().KEPT.at((site, "kept", xtc, aligned), (kept.rows.shape[0],), x, x.stride(0), x.shape[1], col_offset, kept.rows,
            t, k, p, lmp, n_sigma, ws.tkey, ws.bmax, nblk, key0, key1, xthr, coin, float(2.0 ** shift), 1 << shift,
            token, valid, count, low, top, upper, TILE=max(1, KEPT_STEP // bb), BB=bb, SIGMA=n_sigma is not None,
            XTC=xtc, EXACT_EXP=exact_exp, num_warps=KEPT_WARPS)
    return count, low, top, upper


class Workspace:
    """Per-call buffers carved from one allocation (one allocator call, no memsets: every field
    is written before it is read). Fields are [rows] unless noted; see the module docstring."""

    def __init__(self, rows: int, splits: int, nblk: int, cfg: KernelConfig, dev):
        f32, i32, i64 = torch.float32, torch.int32, torch.int64
        n = rows * splits
        fields = [("raw_v", n, f32), ("raw_i", n, i32), ("max", n, f32), ("best_v", n, f32), ("best_i", n, i32),
                  ("nans", n, i32), ("bmax", (rows, nblk), f32),
                  ("stage", rows, i32), ("flags", rows, i32),
                  ("raw", rows, i32), ("m", rows, f32), ("t1", rows, f32), ("tkey", rows, i64), ("klo", rows, i64),
                  ("khi", rows, i64), ("shift", rows, i32), ("cabove", rows, i64), ("mabove", rows, i64),
                  ("S", rows, i64), ("piv", (rows, cfg.pivots), i64), ("cand_key", (rows, cfg.cap), i64),
                  ("cand_id", (rows, cfg.cap), i32), ("cand_n", rows * _passes().CN_STRIDE, i32), ("p_cnt", n, i64),
                  ("p_mass", n, i64),
                  ("p_cgt", (n, cfg.pivots), i64), ("p_mgt", (n, cfg.pivots), i64), ("p_hist", (n, cfg.bins), i32),
                  ("pending", 1, i32), ("hlo", rows, f32), ("hinv", rows, f32), ("hist", (rows, hist_width(cfg)), i32),
                  ("bfirst", rows, i32), ("blast", rows, i32), ("bcount", rows, i32), ("lean_l", rows, f32),
                  ("xf", rows, f32), ("arrive", rows, i32), ("top_bin", rows, i32), ("top_mass", rows, i64),
                  ("sig_lo", n, f32), ("sig_hi", n, f32), ("sig_sums", (n, 3), i64), ("sig_top", rows, f32),
                  ("sig_scale", rows, torch.float64)]
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
    return max(cfg.hist_bins, 2 * cfg.cap, _passes().SCRATCH_WORDS)
