"""A kernel's SASS for sm_90 (H100 / H200) compiled on a machine without a GPU, with the
instruction mix of its hottest loop and its registers: the bundled ptxas, nvdisasm and cuobjdump
do the work, so a change to a streaming pass can be weighed (instructions per loop step) before
a GPU run.
    [WARPS=8] python scripts/sass_local.py hist|bins|list|draw [out.sass]
Kernels at 256 x 151,936's shape: hist (the top-p hist pass: mass and list), bins (its bins
mode), list (the list kernel), draw (the scan of a temperature-only batch, which draws).
Prints the registers a thread and the instruction count and opcode histogram of its LOOPS
(default 2) longest loops; ends with one JSON line. The count is static (an instruction on a
branch not taken counts too); the GPU's Triton may be older than this one."""
import collections
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tpsample.kernels import sample_hist, sample_list, sample_scan

_HIST_TYPES = {"x_ptr": "*fp32", "stride": "i32", "ncols": "i32", "t_ptr": "*fp32", "p_ptr": "*fp32", "scale": "fp32",
               "st_stage": "*i32", "st_m": "*fp32", "st_tkey": "*i64", "st_hlo": "*fp32", "st_hinv": "*fp32",
               "hist_ptr": "*i32", "p_mass": "*i64", "st_xf": "*fp32", "ids_ptr": "*i32", "cand_n": "*i32",
               "st_arrive": "*i32", "st_first": "*i32", "st_last": "*i32", "st_count": "*i32", "st_lean_l": "*fp32",
               "st_top_bin": "*i32", "st_top_mass": "*i64"}
_HIST_CONST = {"NSPLIT": 16, "CHUNK": 9496, "BLOCK": 1024, "NBH": 2048, "EXACT_EXP": True, "LCAP": 4096, "LG": 4,
               "PTX": True, "ALL": 256, "CAP": 2048, "LEAN": True, "HW": 4096}
OPTIONS = {"bins": {"maxnreg": 96}, "list": {"maxnreg": 128}}     # beyond the warps, as sample_launch passes them
SHAPES = {   # kernel: (function, argument types, constexprs, warps)
    "hist": (sample_hist.hist_kernel, _HIST_TYPES, dict(_HIST_CONST, PACK=True, BINS=False), 4),
    "bins": (sample_hist.hist_kernel, _HIST_TYPES, dict(_HIST_CONST, PACK=False, BINS=True), 4),
    "list": (sample_list.list_kernel,
             {"t_ptr": "*fp32", "p_ptr": "*fp32", "key0_ptr": "*i64",
              "key1_ptr": "*i64", "col_offset": "i32", "scale": "fp32", "one": "i64", "st_stage": "*i32",
              "st_m": "*fp32", "st_tkey": "*i64", "st_raw": "*i32", "st_token": "*i64", "st_valid": "*i1",
              "st_xf": "*fp32", "p_mass": "*i64", "ids_ptr": "*i32", "cand_n": "*i32", "hist_ptr": "*i32",
              "st_arrive": "*i32", "listed": "*i32", "st_hlo": "*fp32", "st_hinv": "*fp32", "st_top_bin": "*i32",
              "st_top_mass": "*i64"},
             {"NSPLIT": 16, "LCAP": 4096, "LG": 4, "NBH": 2048, "HW": 4096, "EXACT_EXP": True, "PTX": True}, 8),
    "draw": (sample_scan.scan_kernel,
             {"x_ptr": "*fp32", "stride": "i32", "ncols": "i32", "t_ptr": "*fp32", "k_ptr": "*i32", "p_ptr": "*fp32",
              "lmp_ptr": "*fp32", "key0_ptr": "*i64", "key1_ptr": "*i64", "col_offset": "i32", "raw_v_ptr": "*fp32",
              "raw_i_ptr": "*i32", "max_ptr": "*fp32", "best_v_ptr": "*fp32", "best_i_ptr": "*i32",
              "nan_ptr": "*i32", "bmax_ptr": "*fp32", "nblk": "i32"},
             {"NSPLIT": 16, "CHUNK": 9728, "TILE": 2, "BB": 128, "EXACT_EXP": True, "MODES": 2, "PTX": True}, 1),
}


def compile_sass(name: str) -> str:
    fn, types, const, warps = SHAPES[name]
    warps = int(os.environ.get("WARPS", warps))
    params = list(inspect.signature(fn.fn).parameters)
    const = {k: v for k, v in const.items() if k in params}
    sig = {p: "constexpr" if p in const else types[p] for p in params}
    # what the launcher specializes for real arguments: 16-byte aligned pointers, ints divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params)
             if p in types and (types[p].startswith("*") or p in ("stride", "ncols"))}
    k = triton.compile(ASTSource(fn, sig, constexprs=const, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, **OPTIONS.get(name, {})})
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    return sass, {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", usage)}


def loops(sass: str) -> list[list[str]]:
    """The instructions of each backward-branch span (a loop), longest first; a kernel with a
    loop per variant (say, fast and exact division) has one each."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", ln.strip()))}
    spans = []
    for i, ln in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", ln)
        if m and labels.get(m.group(1), i) < i:
            spans.append([x for x in lines[labels[m.group(1)]:i + 1] if ";" in x])
    return sorted(spans, key=len, reverse=True)


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "hist"
    sass, usage = compile_sass(name)
    print(f"{name}: {usage.get('REG')} registers a thread, {usage.get('LOCAL', 0)} bytes of local memory")
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            f.write(sass)
    out = []
    for k, loop in enumerate(loops(sass)[:int(os.environ.get("LOOPS", "2"))]):
        ops = collections.Counter()
        for ln in loop:
            m = re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", ln)
            if m:
                ops[m.group(2)] += 1
        print(f"{name}: loop {k}, {len(loop)} instructions: "
              + ", ".join(f"{op} {n}" for op, n in ops.most_common()))
        out.append({"instructions": len(loop), "opcodes": dict(ops.most_common())})
    print(json.dumps({"kernel": name, "usage": usage, "loops": out}))


if __name__ == "__main__":
    main()
