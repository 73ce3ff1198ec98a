"""The tables of `tpsample bench sampler` (strategies x TP), from its merged results.

`tp_table`: per case, the slowest rank's figures: wall ms per step, device us per step and its
ratio to TP = 1 for the same class, rows and logits (the issue's per-rank targets read it),
collectives per step, bytes per row per rank, peak memory per row above the shard, and the rows
on the exact top-p path. `auto_table`: auto's choice next to the three fixed strategies' times.
"""
from __future__ import annotations

from ..parallel import names
from ..term import table

STRATEGIES = names.REPORT_ORDER


def _tp1_device_us(results: list[dict]) -> dict:
    """(workload, rows, vocab, logits) -> the smallest TP = 1 device time (every strategy is the
    same sampler at TP = 1)."""
    best: dict = {}
    for r in results:
        if r["tp"] == 1 and r.get("device_us") is not None:
            key = (r["workload"], r["rows"], r["vocab"], r["logits"])
            best[key] = min(best.get(key, float("inf")), r["device_us"])
    return best


def _num(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def tp_table(results: list[dict], args):
    vocabs = sorted({r["vocab"] for r in results})
    one_vocab = len(vocabs) == 1
    title = (f"tpsample bench sampler ({args.device}, fp32, {args.threads} thread(s)/rank"
             + (f", V {vocabs[0]:,}" if one_vocab else "") + "; per step, slowest rank)")
    cols = ["tp", "strategy", "workload", "logits", "rows"] + ([] if one_vocab else ["vocab"]) + [
        "ms", "dev us", "x TP1", "colls", "B/row", "peak\nKiB/row", "exact\nrows"]
    t = table(title, cols, left=("strategy", "workload", "logits"))
    tp1 = _tp1_device_us(results)
    for r in results:
        name = r["strategy"] if r["strategy"] != "auto" else f"auto->{r['resolved']}"
        base = tp1.get((r["workload"], r["rows"], r["vocab"], r["logits"]))
        ratio = r["device_us"] / base if base and r.get("device_us") is not None else None
        t.add_row(str(r["tp"]), name, r["workload"], r["logits"], str(r["rows"]),
                  *([] if one_vocab else [str(r["vocab"])]), f"{r['ms']:.2f}", _num(r.get("device_us"), ".0f"),
                  _num(ratio, ".2f"), str(r["rounds"]), f"{r['bytes_per_row']:.0f}",
                  f"{r['peak_bytes_per_row'] / 1024:.1f}", f"{r['exact_rows']}/{r['exact_rows_of']}")
    return t


def auto_table(results: list[dict]):
    """auto's choice next to every fixed strategy's measured time, per shape: the fixed run of
    the chosen strategy, and auto's own run of it, each against the fastest fixed strategy."""
    shapes: dict = {}
    for r in results:
        shapes.setdefault((r["tp"], r["workload"], r["logits"], r["rows"], r["vocab"]), {})[r["strategy"]] = r
    shapes = {k: v for k, v in shapes.items() if len(v) == 4 and k[0] > 1}
    if not shapes:
        return None
    t = table("auto: its choice next to every fixed strategy (ms per step, slowest rank)",
              ["tp", "workload", "logits", "rows", "vocab", "repl.", "batch", "vocab\npar.", "auto ->", "auto\nms",
               "chosen /\nfastest", "auto /\nfastest"], left=("workload", "logits", "auto ->"))
    for (tp, w, kind, rows, vocab), v in sorted(shapes.items()):
        fixed = {s: v[s]["ms"] for s in STRATEGIES[:3]}
        choice, best = v["auto"]["resolved"], min(fixed.values())
        t.add_row(str(tp), w, kind, str(rows), str(vocab), *(f"{fixed[s]:.2f}" for s in STRATEGIES[:3]), choice,
                  f"{v['auto']['ms']:.2f}", f"{fixed[choice] / best:.2f}", f"{v['auto']['ms'] / best:.2f}")
    return t
