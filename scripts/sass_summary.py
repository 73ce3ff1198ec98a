"""Summarises `ncu --page source --csv --print-source sass` output: per opcode and per
instruction, the executed instructions and warp-stall samples (the hot spots of one kernel).
    ncu -i REPORT -k KERNEL --page source --csv --print-source sass > k.csv
    python scripts/sass_summary.py k.csv [top]
"""
import csv
import re
import sys
from collections import Counter


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if "Source" in r)
    cols = rows[head]
    src = cols.index("Source")
    ex = next(i for i, c in enumerate(cols) if c.startswith("Instructions Executed"))
    st = next(i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All"))
    by_op, st_op, lines = Counter(), Counter(), []
    num = lambda s: float(s.replace(",", "") or 0)
    for r in rows[head + 1:]:
        if len(r) <= max(src, ex, st):
            continue
        text = r[src].strip()
        m = re.match(r"(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
        if not m:
            continue
        op = m.group(2).split(".")[0]
        e, s = num(r[ex]), num(r[st])
        by_op[op] += e
        st_op[op] += s
        lines.append((e, s, text))
    tot_e, tot_s = sum(by_op.values()) or 1, sum(st_op.values()) or 1
    print(f"executed {tot_e:,.0f}  stall samples {tot_s:,.0f}")
    print("opcode: share of executed / of stall samples")
    for op, e in by_op.most_common(top):
        print(f"  {op:12s} {100 * e / tot_e:5.1f}%  {100 * st_op[op] / tot_s:5.1f}%")
    print("hottest instructions by stall samples (executed, samples, text)")
    for e, s, text in sorted(lines, key=lambda t: -t[1])[:top]:
        print(f"  {e:12,.0f} {s:8,.0f}  {text[:110]}")


if __name__ == "__main__":
    main()
