"""The benchmarks' pictures, from their results or from a saved JSON report.

`plot_compare(results, path)`: `bench sampler --compare` results (dicts with case, rows, impl,
wall_us, extra_mib; see `bench.compare.run`) as one small panel per case, wall time per call
(us, log scale) against rows, one line per implementation, and a full-width panel of the extra
memory each implementation needs at the largest row count (the most over the cases, log scale).
`plot_tp(results, path)`: `bench sampler` results (strategy, tp, rows, vocab, workload, logits,
peak_bytes, bytes) as per-rank peak sampler memory and bytes moved against TP per fixed strategy.
`plot_engine(rows, path)`: `bench engine`'s sweep, tokens/s and time per output token against
the batch size. Each writes a PNG; matplotlib is imported on first use, with the Agg backend (no display).

From a saved report (the bench's JSON line, or a file holding it):
`python -m tpsample.bench.plots compare docs/data/compare_h200_2026-12-05.json compare.png`
(`tp` instead of `compare` for a `bench sampler` report).
"""
from __future__ import annotations

import json
import math
import sys

from .workloads import CASES

# implementation -> (label, colour, marker), in legend order
IMPLS = {
    "tpsample, capture + replay": ("tpsample, capture + replay", "#1f77b4", "o"),
    "tpsample, auto replay": ("tpsample, automatic replay", "#17becf", "P"),
    "tpsample, replay off": ("tpsample, eager (replay off)", "#2ca02c", "s"),
    "tpsample, new buffer": ("tpsample, a new buffer each call", "#98df8a", "v"),
    "flashinfer": ("FlashInfer", "#d62728", "D"),
    "flashinfer, top_k_max=50": ("FlashInfer, top_k_max=50", "#ff9896", "d"),
    "argmax().tolist()": ("argmax().tolist()", "#ff7f0e", "X"),
}
CASE_TITLES = {c.name: c.title for c in CASES}     # for rows that carry no "title"
STRATEGY_STYLE = {"replicated": ("#ff7f0e", "o"), "batch_sharded": ("#1f77b4", "s"),
                  "vocab_parallel": ("#2ca02c", "D")}
MIB = 2**20
PANEL_COLUMNS = 4


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(impl: str) -> tuple[str, str | None, str]:
    return IMPLS.get(impl, (impl, None, "o"))


def _ordered(names, known=IMPLS) -> list[str]:
    """The names in known's order, then the unknown ones as they first came."""
    names = list(dict.fromkeys(names))
    return [n for n in known if n in names] + [n for n in names if n not in known]


def _plain_log_axis(axis) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))


def _title(results: list[dict], case: str) -> str:
    for r in results:
        if r["case"] == case and r.get("title"):
            return r["title"]
    return CASE_TITLES.get(case, case)


def _latency_panel(ax, results: list[dict], case: str) -> None:
    """Wall us against rows for every implementation of one case."""
    mine = [r for r in results if r["case"] == case and r.get("wall_us") is not None]
    for impl in _ordered(r["impl"] for r in mine):
        pts = sorted((r["rows"], r["wall_us"]) for r in mine if r["impl"] == impl)
        label, colour, marker = _style(impl)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=colour, label=label,
                markersize=4, linewidth=1.4)
    rows = sorted({r["rows"] for r in results})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(rows, [f"{n:,}" for n in rows])
    ax.minorticks_off()
    _plain_log_axis(ax.yaxis)
    ax.set_title(_title(results, case), fontsize=10)
    ax.grid(alpha=0.3, which="both")


def _memory_panel(ax, results: list[dict]) -> None:
    """Horizontal bars: each implementation's largest extra memory over the cases at the largest
    row count, log scale from 0.001 MiB; each bar says its value and case (a report without
    memory figures, from a CPU run, says so instead)."""
    rows = max(r["rows"] for r in results)
    at = [r for r in results if r["rows"] == rows and r.get("extra_mib") is not None]
    if not at:
        ax.axis("off")
        ax.text(0.5, 0.5, "no memory figures in this report (CPU run)", ha="center", va="center")
        return
    impls = _ordered(r["impl"] for r in at)
    worst = [max((r for r in at if r["impl"] == impl), key=lambda r: r["extra_mib"]) for impl in impls]
    floor, top = 1e-3, max([r["extra_mib"] for r in worst] + [1.0])
    for y, r in enumerate(worst):
        _, colour, _ = _style(r["impl"])
        value = r["extra_mib"]
        ax.barh(y, max(value, floor) - floor, left=floor, color=colour, height=0.6)
        if value < 0.005:
            text = "0 MiB in every case"
        else:
            text = (f"{value:,.0f}" if value >= 10 else f"{value:.2f}") + f" MiB ({_title(results, r['case'])})"
        inside = value >= 1                 # a long bar holds its label; a short one has it after
        ax.text(value / 1.3 if inside else max(value, floor) * 1.3, y, text, va="center", fontsize=8,
                ha="right" if inside else "left", color="white" if inside else "black")
    ax.set_yticks(range(len(worst)), [_style(r["impl"])[0] for r in worst], fontsize=9)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(floor, top * 3)
    _plain_log_axis(ax.xaxis)
    ax.set_xlabel("extra memory above the inputs (MiB, log scale)")
    ax.set_title(f"extra memory at {rows:,} rows (the most over the cases)", fontsize=10)
    ax.grid(alpha=0.3, axis="x")


def _legend_row(fig, cell, results: list[dict]) -> None:
    """One legend for every latency panel, in an axis of its own (it never covers data)."""
    handles = {}
    for ax in fig.axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    order = [_style(i)[0] for i in _ordered(r["impl"] for r in results)]
    ax = fig.add_subplot(cell)
    ax.axis("off")
    ax.legend([handles[k] for k in order], order, loc="center", ncol=min(4, len(order)), frameon=False,
              fontsize=9)


def plot_compare(results: list[dict], path: str, title: str | None = None) -> None:
    """Write the compare PNG to path: a legend row, latency panels per case (shared log y axis),
    and the extra-memory panel underneath."""
    plt = _pyplot()
    cases = _ordered((r["case"] for r in results), CASE_TITLES)
    ncols = min(PANEL_COLUMNS, len(cases))
    nrows = math.ceil(len(cases) / ncols)
    fig = plt.figure(figsize=(3.4 * ncols + 0.6, 2.7 * nrows + 3.6), layout="constrained")
    grid = fig.add_gridspec(nrows + 2, ncols, height_ratios=[0.22] + [1] * nrows + [1.05])
    first = None
    for i, case in enumerate(cases):
        ax = fig.add_subplot(grid[1 + i // ncols, i % ncols], sharey=first)
        first = first or ax
        _latency_panel(ax, results, case)
        if i % ncols == 0:
            ax.set_ylabel("wall time per call (us)")
        if i + ncols >= len(cases):
            ax.set_xlabel("rows")
    _legend_row(fig, grid[0, :], results)
    _memory_panel(fig.add_subplot(grid[nrows + 1, :]), results)
    vocab = results[0].get("vocab")
    fig.suptitle(title or "one sampling call until the tokens are on the host (median wall time)"
                 + (f", vocab {vocab:,}" if vocab else ""), fontsize=12)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tp(results: list[dict], path: str) -> None:
    """Write the TP PNG to path: per-rank peak sampler memory (MiB) and bytes moved per rank
    (MiB) against TP for each fixed strategy, at the largest rows x vocab of the first workload
    and logits kind."""
    plt = _pyplot()
    rows, vocab = max(r["rows"] for r in results), max(r["vocab"] for r in results)
    workload, kind = results[0]["workload"], results[0].get("logits")
    sel = [r for r in results
           if (r["rows"], r["vocab"], r["workload"], r.get("logits")) == (rows, vocab, workload, kind)]
    tps = sorted({r["tp"] for r in sel})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.3), layout="constrained")
    for strategy, (colour, marker) in STRATEGY_STYLE.items():
        pts = sorted((r["tp"], r["peak_bytes"] / MIB, r["bytes"] / MIB) for r in sel if r["strategy"] == strategy)
        if not pts:
            continue
        for ax, k in ((axes[0], 1), (axes[1], 2)):
            ax.plot([p[0] for p in pts], [p[k] for p in pts], marker=marker, color=colour, label=strategy)
    axes[0].set(ylabel="per-rank peak sampler memory (MiB)",
                title=f"sampler memory per rank, {rows:,} x {vocab:,} ({workload})")
    axes[1].set(ylabel="bytes sent + received per rank (MiB)", title="communication per step")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(tps, [str(t) for t in tps])
        ax.minorticks_off()
        ax.set(xlabel="TP (ranks)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3, frameon=False)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_engine(rows: list[dict], path: str) -> None:
    """Write the `bench engine` sweep's PNG to path: tokens/s and time per output token against the
    batch size, one line per strategy."""
    plt = _pyplot()
    fig, (ax_tput, ax_tpot) = plt.subplots(1, 2, figsize=(10, 4))
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == strategy]
        ax_tput.plot([r["batch"] for r in mine], [r["tokens_per_s"] for r in mine], marker="o", label=strategy)
        ax_tpot.plot([r["batch"] for r in mine], [r["tpot_ms"] for r in mine], marker="o", label=strategy)
    for ax, label in ((ax_tput, "output tokens/s"), (ax_tpot, "time per output token (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def load_report(path: str) -> dict:
    """A saved report: a JSON object with "results" (the bench's last line), or a bare list."""
    with open(path) as f:
        text = f.read().strip()
    try:
        data = json.loads(text)
    except ValueError:                       # a captured bench output: the JSON is its last line
        data = json.loads(text.splitlines()[-1])
    return data if isinstance(data, dict) else {"results": data}


def main(argv=None) -> int:
    """`compare|tp REPORT.json OUT.png`: exit 0, or 2 with one line on a usage mistake."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] not in ("compare", "tp"):
        print("usage: python -m tpsample.bench.plots compare|tp REPORT.json OUT.png", file=sys.stderr)
        return 2
    kind, source, out = argv
    try:
        report = load_report(source)
    except (OSError, ValueError) as e:
        print(f"tpsample.bench.plots: error: cannot read {source!r} ({e})", file=sys.stderr)
        return 2
    if kind == "compare":
        device = f", {report['device']}" if report.get("device") else ""
        vocab = report["results"][0].get("vocab")
        plot_compare(report["results"], out, title="one sampling call until the tokens are on the host "
                     "(median wall time)"
                     + (f", vocab {vocab:,}" if vocab else "") + device)
    else:
        plot_tp(report["results"], out)
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
