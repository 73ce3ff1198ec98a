"""What the list kernel's parts cost on a GPU: device time of a probe copy of the list kernel with
parts left out or done another way, over the workspace the hist pass leaves for `randn * 3`
rows (T 0.8, top-p 0.9, V = 151,936): the search for v* (none, the kernel's short search, the
full bisection, radix-8), the Gumbel draw (on / off), the listed x read beside the ids or
gathered from the logits, the warps and the register cap. Each launch starts
from the same saved workspace (copied back outside the timed span).
    python scripts/list_costs.py [rows ...]
Prints a table and ends with one JSON line."""
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

from tpsample import noise
from tpsample.kernels import sample_launch
from tpsample.kernels.config import RowHints
from tpsample.kernels.dispatch import sample_rows
from tpsample.kernels.launcher import _SCRATCH
from tpsample.kernels.rng_triton import gumbel
from tpsample.kernels.sample_bracket import target_of
from tpsample.kernels.sample_scan import fp32_nonan
from tpsample.kernels.sample_state import CN
from tpsample.kernels.tlutil import (
    BIG_ID32,
    NEG_INF,
    argmax_pair,
    bisection_steps,
    div_t,
    key_to_float,
    mass,
    min_key_mass_below,
    min_key_mass_few,
    order_key,
)
from tpsample.numerics import mass_shift


@triton.jit
def _radix8(keys, e, target, lo, hi):
    j = tl.arange(0, 8).to(tl.int64) + 1
    for _ in range((bisection_steps(hi - lo) + 2) // 3):
        mids = lo + ((hi - lo) * j) // 8
        f = tl.sum(tl.where(keys[None, :] > mids[:, None], e[None, :], 0), axis=1)
        ok = f.to(tl.float64) < target
        hi = tl.min(tl.where(ok, mids, hi), axis=0)
        lo = tl.max(tl.where(ok, lo, mids), axis=0)
    return hi


@triton.jit
def probe(x_ptr, stride, t_ptr, p_ptr, key0_ptr, key1_ptr, scale, one, st_m, st_xf, p_mass, ids_ptr, cand_n,
          hist_ptr, out_ptr, NSPLIT: tl.constexpr, LCAP: tl.constexpr, LG: tl.constexpr, HW: tl.constexpr,
          SEARCH: tl.constexpr, DRAW: tl.constexpr, VALS: tl.constexpr):
    row = tl.program_id(0)
    t = tl.load(t_ptr + row)
    m = tl.load(st_m + row)
    idx = tl.arange(0, LCAP)
    cnt = tl.load(cand_n + row * CN + (idx % LG) * (CN // LG))
    valid = (idx // LG) < cnt
    ids = tl.load(ids_ptr + row.to(tl.int64) * LCAP + idx, mask=valid, other=0)
    if VALS:
        x = tl.load(hist_ptr + row.to(tl.int64) * HW + idx, mask=valid, other=0).to(tl.float32, bitcast=True)
    else:
        x = tl.load(x_ptr + row.to(tl.int64) * stride + ids, mask=valid, other=NEG_INF)
    l = div_t(fp32_nonan(x), t)
    lx = div_t(tl.load(st_xf + row), t)
    keep = valid & (l > lx)
    e = tl.where(keep, mass(l, m, scale, one, True), 0)
    target = target_of(tl.load(p_ptr + row), p_mass, row, NSPLIT)
    ok = tl.sum(e, axis=0).to(tl.float64) >= target
    keys = tl.where(keep, order_key(l).to(tl.int64), -1)
    lo = order_key(lx).to(tl.int64)
    hi = order_key(m).to(tl.int64)
    if SEARCH == 1:
        thr = min_key_mass_below(keys, e, tl.zeros((), tl.int64), target, lo, hi)
    elif SEARCH == 2:
        thr = _radix8(keys, e, target, lo, hi)
    elif SEARCH == 3:        # the list kernel's (its scratch: the row's hist words, read above)
        thr = min_key_mass_few(keys, e, tl.zeros((), tl.int64), target, lo, hi, tl.sum(keep.to(tl.int32), axis=0),
                               (hist_ptr + row.to(tl.int64) * HW).to(tl.pointer_type(tl.int64)), 32, True)
    else:
        thr = lo + 1
    kept = keep & (keys >= thr)
    score = key_to_float(keys)
    if DRAW:
        score += gumbel(tl.load(key0_ptr + row).to(tl.uint32), tl.load(key1_ptr + row).to(tl.uint32), ids)
    _, i = argmax_pair(tl.where(kept, score, NEG_INF), tl.where(kept, ids, BIG_ID32))
    tl.store(out_ptr + row, tl.where(ok, i, -1))


VARIANTS = {   # name: (SEARCH, DRAW, VALS, warps, registers a thread or None)
    "all": (3, True, True, 8, 128),          # as the list kernel runs
    "no_search": (0, True, True, 8, 128),
    "no_draw": (3, False, True, 8, 128),
    "neither": (0, False, True, 8, 128),
    "full_bisection": (1, True, True, 8, 128),
    "gather": (3, True, False, 8, 128),
    "radix8": (2, True, True, 8, None),
    "all_free_regs": (3, True, True, 8, None),
    "all_w4": (3, True, True, 4, 128),
    "all_w16": (3, True, True, 16, 64),
}


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [32, 256, 1024]
    vocab, out = 151936, []
    for rows in sizes:
        gen = torch.Generator("cuda").manual_seed(rows)
        x = torch.randn(rows, vocab, device="cuda", generator=gen) * 3
        t = torch.full((rows,), 0.8, device="cuda")
        k = torch.zeros(rows, dtype=torch.int32, device="cuda")
        p = torch.full((rows,), 0.9, device="cuda")
        lmp = torch.full((rows,), float("-inf"), device="cuda")
        k0, k1 = noise.row_keys(torch.arange(rows, device="cuda") + 5, torch.arange(rows, device="cuda"),
                                noise.SALT_DRAW)
        hints = RowHints(any_greedy=False, any_plain=False, any_top_k_or_p=True, any_filter=True,
                         any_top_p_alone=True)
        want = sample_rows(x, t, k, p, lmp, k0, k1, hints=hints)[0]
        keep = {}                 # the state after the hist pass: the later launches do nothing
        for name in ("LIST", "BINS", "ROUND", "FINISH", "DRAIN"):
            keep[name] = getattr(sample_launch, name).at
            getattr(sample_launch, name).at = lambda *a, **k: None
        try:
            sample_rows(x, t, k, p, lmp, k0, k1, hints=hints)
        finally:
            for name, f in keep.items():
                getattr(sample_launch, name).at = f
        torch.cuda.synchronize()
        ws = [w for key, w in _SCRATCH.items() if key[2][0] == "sample" and key[2][1] == rows][-1]
        saved = ws.buffer.clone()
        splits = ws.p_mass.numel() // rows
        cfg = sample_launch.filter_config(sample_launch.KernelConfig())
        shift = mass_shift(vocab)
        res = {}
        tokens = torch.empty(rows, dtype=torch.int32, device="cuda")
        for name, (search, draw, vals, warps, regs) in VARIANTS.items():
            times = []
            for _ in range(25):
                ws.buffer.copy_(saved)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                probe[(rows,)](x, x.stride(0), t, p, k0, k1, float(2.0 ** shift), 1 << shift, ws.m, ws.xf, ws.p_mass,
                               ws.cand_ids, ws.cand_n, ws.hist, tokens, NSPLIT=splits, LCAP=2 * cfg.cap,
                               LG=cfg.list_groups, HW=sample_launch.hist_width(cfg), SEARCH=search, DRAW=draw,
                               VALS=vals, num_warps=warps, **({"maxnreg": regs} if regs else {}))
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1000)
            same = bool(torch.equal(tokens.long(), want)) if (search in (1, 3) and draw) else None
            res[name] = {"us": round(statistics.median(times[5:]), 1), "same_tokens": same}
        print(f"{rows} rows: " + "  ".join(f"{n}={v['us']}{'' if v['same_tokens'] in (None, True) else '(DIFF)'}"
                                           for n, v in res.items()))
        out.append({"rows": rows, "variants": res})
    print(json.dumps({"bench": "list_costs", "vocab": vocab, "results": out}))


if __name__ == "__main__":
    main()
