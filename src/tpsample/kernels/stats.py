"""Row statistics without a [R, V] temporary (max / argmax, log-sum-exp, top-n, counts above) and
the logprob rows laid out from them; kernels and their launches (the vocab-parallel shard passes
are `kernels.shard`).

stats_kernel, grid (rows, splits): over a split of the transformed row l (fp32(x), / T where
T != 0, < threshold -> -inf, NaN -> -inf): the max and its lowest column; with LSE an online
sum of exp(l - running max) in fp32; with TOP a sorted top-n list (NP slots, a power of two >= n)
(value desc, column asc), merged only when a block holds an entry beating the current n-th; with
CNT the count of entries > a per-row value (with TOK: the value of l at a per-row global token
id). combine_kernel, grid (rows,): merges the splits (sum-exp in fp64).

`raw_logprobs(...)`: a step's raw logprob rows (the sampled token, then the top-n) from one
`token_logprob_stats` pass, laid out by one kernel for the rows that want them.
"""

import torch
import triton
import triton.language as tl

from ..numerics import next_pow2
from .launcher import DEFAULT, KernelConfig, Launcher, split_shape, stream_scratch
from .tlutil import (
    BIG_ID32,
    NEG_INF,
    argmax_pair,
    chunk_bounds,
    div_t,
    fexp,
    load_x,
    pair_max,
)


@triton.jit
def load_transformed(x_ptr, row_off, cols, mask, t, thr, HAS_T: tl.constexpr, HAS_THR: tl.constexpr):
    l = load_x(x_ptr, row_off, cols, mask)
    if HAS_T:
        l = div_t(l, tl.where(t == 0.0, 1.0, t))
    if HAS_THR:
        l = tl.where(l < thr, NEG_INF, l)
    return l


@triton.jit
def _best_alive(v, ids, alive):
    """(value, id) of the best alive entry (value desc, id asc); id BIG_ID32 when none."""
    mx = tl.max(tl.where(alive, v, NEG_INF), axis=0)
    return mx, tl.min(tl.where(alive & (v == mx), ids, BIG_ID32), axis=0)


@triton.jit
def merge_top(lv, li, v, ids, cand, n, NP: tl.constexpr):
    """Top-n of (list lv/li, sorted) and the candidate entries of a block, sorted again."""
    slot = tl.arange(0, NP)
    alive_l = li != BIG_ID32
    nv = tl.full((NP,), NEG_INF, tl.float32)
    ni = tl.full((NP,), BIG_ID32, tl.int32)
    for j in range(n):
        v1, i1 = _best_alive(lv, li, alive_l)
        v2, i2 = _best_alive(v, ids, cand)
        bv, bi = pair_max(v1, i1, v2, i2)
        nv = tl.where(slot == j, bv, nv)
        ni = tl.where(slot == j, bi, ni)
        alive_l = alive_l & (li != bi)
        cand = cand & (ids != bi)
    return nv, ni


@triton.jit(do_not_specialize=["col_offset", "val_offset"])
def stats_kernel(x_ptr, stride, ncols, t_ptr, thr_ptr, val_ptr, val_stride, n,
                 max_ptr, arg_ptr, sm_ptr, ss_ptr, top_v_ptr, top_i_ptr, cnt_ptr, val_offset,
                 NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_T: tl.constexpr,
                 HAS_THR: tl.constexpr, LSE: tl.constexpr, NP: tl.constexpr, TOP: tl.constexpr,
                 CNT: tl.constexpr, TOK: tl.constexpr):
    row = tl.program_id(0)
    part = row * NSPLIT + tl.program_id(1)
    start, end = chunk_bounds(ncols, CHUNK)
    row_off = row.to(tl.int64) * stride
    t = tl.load(t_ptr + row) if HAS_T else 1.0
    thr = tl.load(thr_ptr + row) if HAS_THR else NEG_INF
    val = 0.0
    if CNT:
        if TOK:     # val_ptr holds global token ids: the count is of entries above that token's value
            local = tl.minimum(tl.maximum(tl.load(val_ptr + row * val_stride) - val_offset, 0), ncols - 1)
            val = tl.max(load_transformed(x_ptr, row_off, local + tl.arange(0, 1), local + tl.arange(0, 1) < ncols,
                                          t, thr, HAS_T, HAS_THR), axis=0)
        else:
            val = tl.load(val_ptr + row * val_stride)
    mx = tl.full((), NEG_INF, tl.float32)
    arg = tl.full((), BIG_ID32, tl.int32)
    sm = tl.full((), NEG_INF, tl.float32)
    ss = tl.full((), 0.0, tl.float32)
    cnt = tl.zeros((), tl.int64)
    lv = tl.full((NP,), NEG_INF, tl.float32)
    li = tl.full((NP,), BIG_ID32, tl.int32)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        l = load_transformed(x_ptr, row_off, cols, cols < end, t, thr, HAS_T, HAS_THR)
        v, i = argmax_pair(l, cols)
        mx, arg = pair_max(mx, arg, v, i)
        if LSE:
            new_m = tl.maximum(sm, v)
            ss = ss * tl.where(new_m == sm, 1.0, fexp(sm - new_m, False))
            ss += tl.sum(tl.where(l > NEG_INF, fexp(l - new_m, False), 0.0), axis=0)
            sm = new_m
        if CNT:
            cnt += tl.sum((l > val).to(tl.int64), axis=0)
        if TOP:
            wv = tl.min(tl.where(tl.arange(0, NP) == n - 1, lv, float("inf")), axis=0)
            wi = tl.max(tl.where(tl.arange(0, NP) == n - 1, li, -1), axis=0)
            cand = (cols < end) & ((l > wv) | ((l == wv) & (cols < wi)))
            if tl.sum(cand.to(tl.int32), axis=0) > 0:
                lv, li = merge_top(lv, li, l, cols, cand, n, NP)
    tl.store(max_ptr + part, mx)
    tl.store(arg_ptr + part, arg)
    if LSE:
        tl.store(sm_ptr + part, sm)
        tl.store(ss_ptr + part, ss)
    if CNT:
        tl.store(cnt_ptr + part, cnt)
    if TOP:
        tl.store(top_v_ptr + part * NP + tl.arange(0, NP), lv)
        tl.store(top_i_ptr + part * NP + tl.arange(0, NP), li)


@triton.jit(do_not_specialize=["col_offset"])
def combine_kernel(n, col_offset, max_ptr, arg_ptr, sm_ptr, ss_ptr, top_v_ptr, top_i_ptr, cnt_ptr,
                   out_max, out_arg, out_lse, out_v, out_i, out_cnt,
                   NSPLIT: tl.constexpr, LSE: tl.constexpr, NP: tl.constexpr, TOP: tl.constexpr,
                   CNT: tl.constexpr):
    row = tl.program_id(0)
    parts = row * NSPLIT + tl.arange(0, NSPLIT)
    mx, arg = argmax_pair(tl.load(max_ptr + parts), tl.load(arg_ptr + parts))
    tl.store(out_max + row, mx)
    tl.store(out_arg + row, arg.to(tl.int64) + col_offset)
    if LSE:
        sm = tl.load(sm_ptr + parts)
        w = tl.where(sm > NEG_INF, tl.load(ss_ptr + parts).to(tl.float64) * tl.exp((sm - mx).to(tl.float64)), 0.0)
        lse = tl.where(mx < float("inf"), mx.to(tl.float64) + tl.log(tl.sum(w, axis=0)), mx.to(tl.float64))
        tl.store(out_lse + row, tl.where(mx > NEG_INF, lse, NEG_INF).to(tl.float32))
    if CNT:
        tl.store(out_cnt + row, tl.sum(tl.load(cnt_ptr + parts), axis=0))
    if TOP:
        flat = (row * NSPLIT * NP + tl.arange(0, NSPLIT * NP))
        v = tl.load(top_v_ptr + flat)
        ids = tl.load(top_i_ptr + flat)
        lv, li = merge_top(tl.full((NP,), NEG_INF, tl.float32), tl.full((NP,), BIG_ID32, tl.int32),
                           v, ids, ids != BIG_ID32, n, NP)
        slot = tl.arange(0, NP)
        tl.store(out_v + row * n + slot, lv, mask=slot < n)
        tl.store(out_i + row * n + slot, tl.where(li == BIG_ID32, -1, li.to(tl.int64) + col_offset), mask=slot < n)


_LAUNCHERS: dict = {}


def _launcher(kernel) -> Launcher:
    got = _LAUNCHERS.get(kernel)
    if got is None:
        got = _LAUNCHERS[kernel] = Launcher(kernel)
    return got


def launch_stats(x, temperature, threshold, values, n: int, lse: bool, col_offset: int, cfg: KernelConfig,
                 tokens=None):
    """(max [R], argmax global id [R], lse [R] | None, top_v [R, n], top_i [R, n], count [R] | None).
    tokens: global ids [R] int64 whose transformed values take the place of `values`."""
    if x.stride(1) != 1:
        raise ValueError("x must have unit column stride")
    rows, cols = x.shape
    splits, chunk = split_shape(rows, cols, x.device, cfg)
    dev = x.device
    np_ = next_pow2(n)
    f32, i64 = torch.float32, torch.int64
    p_max, p_arg, p_sm, p_ss, p_tv, p_ti, p_cnt = stream_scratch(
        dev, ("stats", rows, splits, np_), lambda: _partials(rows * splits, np_, dev))
    dummy = p_ss          # an fp32 pointer for the arguments a variant does not read
    t = dummy if temperature is None else temperature.to(dev, f32).contiguous()
    thr = dummy if threshold is None else threshold.to(dev, f32).contiguous()
    counted = values is not None or tokens is not None
    if tokens is not None:      # read with its stride (a column of the results block): no copy
        val = tokens.to(dev, i64)
    else:
        val = dummy if values is None else values.to(dev, f32).contiguous()
    _launcher(stats_kernel)((rows, splits), x, x.stride(0), cols, t, thr, val, val.stride(0) if val.dim() else 0, n,
                            p_max, p_arg, p_sm, p_ss, p_tv, p_ti, p_cnt, col_offset, NSPLIT=splits, CHUNK=chunk,
                            BLOCK=cfg.block, HAS_T=temperature is not None, HAS_THR=threshold is not None, LSE=lse,
                            NP=np_, TOP=n > 0, CNT=counted, TOK=tokens is not None, num_warps=cfg.num_warps)
    out_max, out_arg = torch.empty(rows, dtype=f32, device=dev), torch.empty(rows, dtype=i64, device=dev)
    out_lse = torch.empty(rows, dtype=f32, device=dev)
    out_v = torch.empty((rows, n), dtype=f32, device=dev)
    out_i = torch.empty((rows, n), dtype=i64, device=dev)
    out_cnt = torch.empty(rows, dtype=i64, device=dev)
    _launcher(combine_kernel)((rows,), n, col_offset, p_max, p_arg, p_sm, p_ss, p_tv, p_ti, p_cnt, out_max, out_arg,
                              out_lse, out_v, out_i, out_cnt, NSPLIT=splits, LSE=lse, NP=np_, TOP=n > 0,
                              CNT=counted, num_warps=4)
    return (out_max, out_arg, out_lse if lse else None, out_v, out_i, out_cnt if counted else None)


def _partials(parts: int, np_: int, dev) -> tuple:
    """The per-split partials of `launch_stats` (scratch: combined within the call)."""
    f32, i32 = torch.float32, torch.int32
    return (torch.empty(parts, dtype=f32, device=dev), torch.empty(parts, dtype=i32, device=dev),
            torch.empty(parts, dtype=f32, device=dev), torch.empty(parts, dtype=f32, device=dev),
            torch.empty(parts * np_, dtype=f32, device=dev), torch.empty(parts * np_, dtype=i32, device=dev),
            torch.empty(parts, dtype=torch.int64, device=dev))


@triton.jit
def _raw_logprobs_kernel(tok_ptr, tok_stride, x_ptr, x_stride, ncols, col_offset, t_ptr, lse_ptr, tv_ptr, ti_ptr, n,
                         cnt_ptr, i64_ptr, i64_stride, slot_ptr, ids_out, vals_out, ranks_out, width,
                         NUM_LP: tl.constexpr, PROCESSED: tl.constexpr, WP: tl.constexpr, HAS_T: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row)
    nlp = tl.load(i64_ptr + NUM_LP * i64_stride + slot)
    want = (nlp >= 0) & (tl.load(i64_ptr + PROCESSED * i64_stride + slot) == 0)
    tok = tl.load(tok_ptr + row * tok_stride)
    local = tl.minimum(tl.maximum(tok - col_offset, 0), ncols - 1)
    v = tl.load(x_ptr + row.to(tl.int64) * x_stride + local).to(tl.float32)
    v = tl.where(v != v, float("-inf"), v)
    if HAS_T:       # the value the stats pass saw: / T (T == 0: none, as load_transformed)
        t = tl.load(t_ptr + row)
        v = div_t(v, tl.where(t == 0.0, 1.0, t))
    lse = tl.load(lse_ptr + row).to(tl.float64)
    j = tl.arange(0, WP)
    top = (j >= 1) & (j <= n)
    ids = tl.where(j == 0, tok, tl.load(ti_ptr + row * n + (j - 1), mask=top, other=-1))
    vals = tl.where(j == 0, v, tl.load(tv_ptr + row * n + (j - 1), mask=top, other=float("-inf"))).to(tl.float64)
    lp = vals - lse
    lp = tl.where(lse == float("inf"), tl.where(vals == float("inf"), 0.0, float("-inf")), lp)
    lp = tl.where(ids >= 0, lp, float("-inf"))
    lp = tl.where(lse > float("-inf"), lp, float("-inf"))
    keep = (j <= nlp) & (j < WP + want.to(tl.int32) * 0)      # columns up to the row's n ...
    keep = tl.where(want, keep, j < 0)                          # ... of rows that want raw logprobs
    out = j < width
    tl.store(ids_out + row * width + j, tl.where(keep, ids, -1), mask=out)
    tl.store(vals_out + row * width + j, tl.where(keep, lp, float("-inf")).to(tl.float32), mask=out)
    tl.store(ranks_out + row, tl.where(want, tl.load(cnt_ptr + row) + 1, 0))


_RAW_LP = Launcher(_raw_logprobs_kernel)


def raw_logprobs(tokens, x, col_offset: int, lse, top_v, top_i, above, i64_table, slots, columns: dict, width: int,
                 out=None, temperature=None):
    """Logprob rows from one stats pass: (ids [R, width] int64, logprobs [R, width] fp32, ranks [R])
    (new tensors, or written into `out`).

    Column 0 the sampled token, then the top-n; rows that want no raw logprobs (per the slot
    tables) and columns past a row's n are (-1, -inf); values never NaN (see logprobs.py).
    temperature: the per-row divisor [R] fp32 the stats pass ran with (0: none), so the sampled
    token's value is fp32(x) / T as the pass's top-n and count are; None: none for every row."""
    rows, n = top_v.shape
    dev = tokens.device
    if out is not None:
        ids, vals, ranks = out
    else:
        ids = torch.empty((rows, width), dtype=torch.int64, device=dev)
        vals = torch.empty((rows, width), dtype=torch.float32, device=dev)
        ranks = torch.empty(rows, dtype=torch.int64, device=dev)
    if rows:
        t = lse if temperature is None else temperature.to(dev, torch.float32).contiguous()
        _RAW_LP((rows,), tokens, tokens.stride(0), x, x.stride(0), x.shape[1], col_offset, t, lse, top_v.contiguous(),
                top_i.contiguous(), n, above, i64_table, i64_table.stride(0), slots, ids, vals, ranks, width,
                WP=next_pow2(width), HAS_T=temperature is not None, **columns)
    return ids, vals, ranks


def logprob_stats(x, *, temperature=None, threshold=None, n: int = 0, col_offset: int = 0,
                  cfg: KernelConfig = DEFAULT):
    """Per-row (max [R] fp32, lse [R] fp32, top_vals [R, n] fp32, top_ids [R, n] int64 global)
    of the transform l = fp32(x) (/ T for rows with T != 0 when `temperature` is given; entries
    < `threshold` [R] -> -inf when given, the processed kept-set row; NaN -> -inf).
    lse sums exp(l - max) in fp32 per block and fp64 across (error ~1e-6); +-inf max -> lse = max.
    top-n: value desc, ties -> lower id; (-inf, -1) pads rows shorter than n."""
    mx, _, lse, tv, ti, _ = launch_stats(x, temperature, threshold, None, n, True, col_offset, cfg)
    return mx, lse, tv, ti


def token_logprob_stats(x, values, n: int, *, col_offset: int = 0, cfg: KernelConfig = DEFAULT, tokens=None,
                        temperature=None):
    """One pass over l = fp32(x) (NaN -> -inf; / T for rows with T != 0 when `temperature` [R] is
    given) for the logprobs of sampled tokens whose values [R] fp32 are `values` (or, with
    `tokens` [R] int64 global ids instead, the values of l at those ids): (lse [R] fp32, top_vals
    [R, n], top_ids [R, n] global ids, count [R] int64 of entries strictly greater than values,
    i.e. rank - 1)."""
    _, _, lse, tv, ti, cnt = launch_stats(x, temperature, None, values, n, True, col_offset, cfg, tokens=tokens)
    return lse, tv, ti, cnt
