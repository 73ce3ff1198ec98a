"""`tpsample bench sampler --compare`: one sampling call as an engine sees it, side by side.

On the same `randn * 3` fp32 logits in one process, per case (`workloads.CASES`) and row count,
every column of `compare_columns`. Figures per column: wall us (median over `iters` calls of the
time until the tokens and logprobs are on the host, after `compare_columns.WARMUP` untimed
calls) and host us (until the call returned); device us (the profiler's); extra MiB (the
allocator's peak above what was allocated before a call) and held MiB (what the column's setup
and warm-up left allocated); replayed (the share of timed calls that were replays). Every wall
time is taken before the first profiled call: a finished profiler session can leave host work
behind on later CUDA calls. `--device cpu` is a smoke run of the same code (wall times only).
Prints a table, writes the plot and the JSON (`--out`, rewritten after every case, so a run cut
short keeps what it measured) and ends with one JSON line.
"""
from __future__ import annotations

import functools
import gc
import sys
import traceback

from ..numerics import release_device_memory
from . import compare_columns, flashinfer
from .report import (
    allocated,
    cell,
    device_us,
    extra_bytes,
    finish,
    is_cuda,
    metadata,
    print_table,
    profiled_us,
    progress,
    wall_us,
    write,
)
from .workloads import CASES

DEVICE_CALLS = 5


def _measure(timed, iters: int, device, phase: str, refill_us: float | None) -> dict:
    for _ in range(compare_columns.WARMUP):
        timed.before()
        timed.call()()
    if phase == "wall":
        start = timed.replays()
        wall, host = wall_us(timed.call, iters, device, timed.before)
        return {"wall_us": round(wall, 1), "host_us": round(host, 1),
                "replayed": round((timed.replays() - start) / iters, 2)}
    dev = device_us(timed.call, DEVICE_CALLS, device, timed.before, before_us=refill_us)
    extra = extra_bytes(timed.call, device, timed.before)
    return {"device_us": None if dev is None else round(dev, 1),
            "extra_mib": None if extra is None else round(extra / 2**20, 3)}


def _column(setup, case, logits, iters, device, phase, refill_us) -> dict | str | None:
    """The column's figures; None where it does not apply; why not, where it could not run (an
    error too: the run goes on, its traceback on stderr)."""
    base = allocated(device)
    try:
        timed = setup(case, logits)
        if timed is None or isinstance(timed, str):
            return timed
        row = _measure(timed, iters, device, phase, refill_us)
    except Exception as e:  # noqa: BLE001 - one column's failure must not lose the others
        traceback.print_exc(file=sys.stderr)
        return f"failed: {type(e).__name__}: {' '.join(str(e).split())}"[:300]
    if phase == "device" and base is not None:
        row["held_mib"] = round((allocated(device) - base) / 2**20, 3)
    del timed
    gc.collect()                # the sampler's own cycles: its memory is free before the next column
    return row


def _warm_up(case, rows: int, vocab: int, device) -> None:
    """Untimed calls before the first case (GPU clocks, host caches, the allocator): otherwise
    the first column measured pays for them."""
    calls = 50 if is_cuda(device) else 2
    logits = compare_columns.Logits.randn(rows, vocab, device, seed=0)
    timed = compare_columns.replay_off(case, logits)
    for _ in range(calls):
        timed.before()
        timed.call()()
        logits.work.argmax(dim=1).tolist()


def run(rows_list=(32, 256, 1024), vocab: int = 151936, iters: int = 21, cases=None, device="cuda",
        build_s: float = 240.0, status_path: str | None = None, out: str | None = None) -> dict:
    """The report: {"bench", "rows", "vocab", "iters", "logits", "flashinfer", "skipped",
    "results", "meta", "complete"}. FlashInfer's status: read from status_path when given, else
    its modules are built here within build_s seconds."""
    chosen = [c for c in CASES if cases is None or c.name in cases]
    if status_path and is_cuda(device):
        status = flashinfer.load_status(status_path)
    else:
        status = flashinfer.build(build_s if is_cuda(device) else 0)
    cols = compare_columns.columns(status, reserve_tokens=4 * (compare_columns.WARMUP + iters) + 64)
    report = {"bench": "sampler_compare", "rows": list(rows_list), "vocab": vocab, "iters": iters,
              "logits": "randn x 3, fp32", "flashinfer": status, "skipped": {}, "results": [],
              "meta": metadata(device)}
    _warm_up(chosen[0], rows_list[0], vocab, device)
    merged: dict = {}
    groups = [(phase, case, rows) for phase in ("wall", "device") for rows in rows_list for case in chosen]
    with progress("bench sampler --compare", len(groups) * len(cols)) as step:
        for phase, case, rows in groups:
            logits = compare_columns.Logits.randn(rows, vocab, device, seed=rows)
            refill_us = None                # the device time of every column's before(): one copy of the logits
            if phase == "device" and is_cuda(device):
                refill = functools.partial(logits.work.copy_, logits.pristine)
                refill_us = profiled_us(refill, DEVICE_CALLS, device) / DEVICE_CALLS
            for name, setup in cols.items():
                step(f"{phase}: {case.name} x {rows}: {name}")
                got = _column(setup, case, logits, iters, device, phase, refill_us)
                if got is None:
                    continue
                if isinstance(got, str):
                    report["skipped"].setdefault(name, {})[case.name] = got
                    continue
                merged.setdefault((case.name, rows, name), {"case": case.name, "title": case.title, "rows": rows,
                                                            "vocab": vocab, "impl": name}).update(got)
            report["results"] = list(merged.values())
            if out:
                write({**report, "complete": False}, out)
            del logits
            release_device_memory()
    return {**report, "complete": True}


def _anchor_ratio(results: list[dict]) -> dict:
    """(case, rows) -> the fastest anchor's wall us (FlashInfer or argmax)."""
    best: dict = {}
    for r in results:
        if not r["impl"].startswith("tpsample") and "wall_us" in r:
            key = (r["case"], r["rows"])
            best[key] = min(best.get(key, float("inf")), r["wall_us"])
    return best


def table(report: dict):
    from ..term import table as make_table

    t = make_table(f"one sampling call until the tokens are on the host, V {report['vocab']:,}, median of "
                   f"{report['iters']}; x: wall over the fastest anchor's",
                   ["case", "rows", "column", "wall\nus", "x", "device\nus", "host\nus", "extra\nMiB",
                    "held\nMiB", "repl."], left=("case", "column"))
    best = _anchor_ratio(report["results"])
    for r in report["results"]:
        anchor, wall = best.get((r["case"], r["rows"])), r.get("wall_us")
        ratio = wall / anchor if anchor and wall is not None and r["impl"].startswith("tpsample") else None
        t.add_row(r["case"], str(r["rows"]), compare_columns.SHORT.get(r["impl"], r["impl"]), cell(wall, ".0f"),
                  cell(ratio, ".2f"), cell(r.get("device_us"), ".0f"), cell(r.get("host_us"), ".0f"),
                  cell(r.get("extra_mib"), ".2f"), cell(r.get("held_mib"), ".2f"), cell(r.get("replayed"), ".2f"))
    return t


def main(args) -> None:
    report = run(tuple(args.rows), args.vocab[0], iters=args.steps, cases=args.cases, device=args.device,
                 build_s=args.flashinfer_build_s, status_path=args.flashinfer_status, out=args.out)
    print_table(table(report))
    for name, why in report["skipped"].items():
        reasons: dict = {}
        for case, w in why.items():
            reasons.setdefault(w, []).append(case)
        print(f"not run: {name}: " + "; ".join(f"{w} ({', '.join(c)})" for w, c in reasons.items()))
    if args.plot and report["results"]:
        from .plots import plot_compare

        plot_compare(report["results"], args.plot, title="one sampling call until the tokens are on the host "
                     f"(median wall time), vocab {args.vocab[0]:,}, {report['meta']['device']}")
        print(f"plot: {args.plot}")
    finish(report, args.out, args.device)
