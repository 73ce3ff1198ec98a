"""What the per-entry work of the top-p passes costs on a GPU: device time of stripped-down
streaming kernels over the same rows (256 x 151,936 fp32 `randn * 3`, T = 0.8), each adding one
piece of the hist / collect passes (IEEE division, exact exp mass, histogram atomics, candidate
appends by prefix sum or per-lane atomics, the latter into one counter a row, a split or a lane
group, noise bits, the histogram counted in registers by `tl.histogram`).
    [PROBES=read,hist_atomics] python scripts/topp_costs.py [rows]
Prints a table and ends with one JSON line."""
import json
import os
import sys

import torch
import triton
import triton.language as tl

from tpsample.kernels.config import DEFAULT
from tpsample.kernels.rng_triton import uniform_bits
from tpsample.kernels.sample_launch import _geometry
from tpsample.kernels.tlutil import NEG_INF, div_t, fexp, load_x, mass, order_key


@triton.jit
def probe(x_ptr, stride, ncols, t, m_ptr, lo_ptr, c_ptr, hist_ptr, cand_n, cand_key, out_ptr,
          CHUNK: tl.constexpr, BLOCK: tl.constexpr, WHAT: tl.constexpr, CAP: tl.constexpr):
    row = tl.program_id(0)
    start = tl.program_id(1) * CHUNK
    end = tl.minimum(start + CHUNK, ncols)
    row_off = row.to(tl.int64) * stride
    m = tl.load(m_ptr + row)
    lo = tl.load(lo_ptr + row)
    c = tl.load(c_ptr + row)
    inv_t = 1.0 / t
    acc = tl.zeros((BLOCK,), tl.float32)
    iacc = tl.zeros((BLOCK,), tl.int64)
    offs = tl.arange(0, BLOCK)
    if WHAT == 14:
        hacc = tl.zeros((2048,), tl.int32)
    if WHAT == 15:
        hacc = tl.zeros((256,), tl.int32)
    for s in range(start, end, BLOCK):
        cols = s + offs
        x = load_x(x_ptr, row_off, cols, cols < end)
        if WHAT == 0:      # read only
            acc += x
        if WHAT == 1:      # x * (1 / T)
            acc += x * inv_t
        if WHAT >= 2:
            l = div_t(x, t)
            if WHAT == 2:
                acc += l
            if WHAT == 3:      # exact-exp int64 mass
                iacc += mass(l, m, 17592186044416.0, 17592186044416, True)
            if WHAT == 4:      # fast-exp int64 mass
                iacc += mass(l, m, 17592186044416.0, 17592186044416, False)
            if WHAT == 5:      # histogram atomics over [lo, m]
                inr = l >= lo
                if tl.sum(inr.to(tl.int32), axis=0) > 0:
                    b = tl.minimum((l - lo) * (2048.0 / (m - lo)), 2047.0).to(tl.int32)
                    tl.atomic_add(hist_ptr + row.to(tl.int64) * 2048 + b, 1, mask=inr, sem="relaxed")
            if WHAT == 6:      # append l >= c by prefix sum
                sel = l >= c
                nsel = tl.sum(sel.to(tl.int32), axis=0)
                if nsel > 0:
                    base = tl.atomic_add(cand_n + row, nsel)
                    pos = base + tl.cumsum(sel.to(tl.int32), 0) - 1
                    tl.store(cand_key + row.to(tl.int64) * CAP + pos, order_key(l).to(tl.int64),
                             mask=sel & (pos < CAP))
            if WHAT == 7:      # append l >= c by per-lane atomics
                sel = l >= c
                if tl.sum(sel.to(tl.int32), axis=0) > 0:
                    pos = tl.atomic_add(cand_n + row + offs * 0, 1, mask=sel)
                    tl.store(cand_key + row.to(tl.int64) * CAP + pos, order_key(l).to(tl.int64),
                             mask=sel & (pos < CAP))
            if (WHAT >= 11) & (WHAT <= 13):     # per-lane atomics, counters 128 bytes apart: one a row / a split / 8 lane groups
                sel = l >= c
                if WHAT == 11:
                    k = offs * 0
                    nk = 1
                if WHAT == 12:
                    k = offs * 0 + tl.program_id(1)
                    nk = tl.num_programs(1)
                if WHAT == 13:
                    k = offs % 8
                    nk = 8
                pos = tl.atomic_add(cand_n + (row * 64 + k) * 32, 1, mask=sel, sem="relaxed")
                slot = pos * nk + k
                tl.store(cand_key + row.to(tl.int64) * CAP + slot, order_key(l).to(tl.int64),
                         mask=sel & (slot < CAP))
            if WHAT >= 14:     # the same histogram in registers (tl.histogram), added to memory once
                inr = l >= lo
                if WHAT == 14:
                    b = tl.minimum(tl.maximum((l - lo) * (2048.0 / (m - lo)), 0.0), 2047.0).to(tl.int32)
                    hacc += tl.histogram(b, 2048, mask=inr)
                if WHAT == 15:
                    b = tl.minimum(tl.maximum((l - lo) * (256.0 / (m - lo)), 0.0), 255.0).to(tl.int32)
                    hacc += tl.histogram(b, 256, mask=inr)
            if WHAT == 8:      # noise bits for every entry
                acc += uniform_bits(12345, 678, cols).to(tl.float32)
            if WHAT == 9:      # fast exp, fp32
                acc += fexp(l - m, False)
            if WHAT == 10:     # exact exp, fp32
                acc += fexp(l - m, True)
    if WHAT == 14:
        tl.atomic_add(hist_ptr + row.to(tl.int64) * 2048 + tl.arange(0, 2048), hacc, sem="relaxed")
    if WHAT == 15:
        tl.atomic_add(hist_ptr + row.to(tl.int64) * 2048 + tl.arange(0, 256), hacc, sem="relaxed")
    tl.store(out_ptr + row * tl.num_programs(1) + tl.program_id(1), tl.sum(acc, axis=0) + tl.sum(iacc, axis=0).to(tl.float32))


NAMES = ["read", "mul_invT", "div_rn", "mass_exact", "mass_fast", "hist_atomics", "append_cumsum",
         "append_lane_atomics", "noise_bits", "fexp_fast", "fexp_exact",
         # do same-address atomics serialise? the same appends with one padded counter a row, one
         # a split and one per 8 lane groups (positions interleaved over the counters)
         "append_row_counter", "append_split_counters", "append_lane_group_counters",
         # the bracket histogram counted in registers (tl.histogram per step, one vector atomic a program)
         "hist_register_2048", "hist_register_256"]


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    vocab, cap = 151936, 4096
    x = torch.randn(rows, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 3
    t = 0.8
    l = x / t
    m = l.max(dim=1).values
    S = torch.exp(l - m[:, None]).sum(dim=1)
    lo = (m + torch.log(S * 0.1 / vocab)).contiguous()
    srt = l.sort(dim=1, descending=True).values
    c = srt[:, 1500].contiguous()          # ~1,500 candidates a row
    splits, _, _, chunk, _ = _geometry(rows, vocab, x.device, DEFAULT)
    block = DEFAULT.block
    hist = torch.zeros(rows, 2048, dtype=torch.int32, device="cuda")
    cand_n = torch.zeros(rows * 64 * 32, dtype=torch.int32, device="cuda")      # up to 64 padded counters a row
    cand_key = torch.empty(rows, cap, dtype=torch.int64, device="cuda")
    out = torch.empty(rows * splits, device="cuda")
    from torch.profiler import ProfilerActivity, profile
    res = {}
    print(f"{rows} rows x {vocab}, splits {splits}, chunk {chunk}, block {block}; in range {int((l >= lo[:, None]).sum()) // rows} a row")
    only = [n for n in os.environ.get("PROBES", "").split(",") if n]      # PROBES=read,hist_atomics: only these
    for what, name in enumerate(NAMES):
        if only and name not in only:
            continue
        for warps in (1, 4):
            bl = block if warps == 1 else 1024

            def go(what=what, warps=warps, bl=bl):
                cand_n.zero_()
                probe[(rows, splits)](x, x.stride(0), vocab, t, m, lo, c, hist, cand_n, cand_key, out,
                                      CHUNK=chunk, BLOCK=bl, WHAT=what, CAP=cap, num_warps=warps)
            go()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    go()
                torch.cuda.synchronize()
            us = sum(e.device_time_total for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA and e.name == "probe") / 10
            res[f"{name}/w{warps}"] = round(us, 1)
            print(f"  {name:20s} warps {warps} block {bl:5d}: {us:7.1f} us")
            sys.stdout.flush()
    print(json.dumps({"bench": "topp_costs", "rows": rows, "us": res}))


if __name__ == "__main__":
    main()
