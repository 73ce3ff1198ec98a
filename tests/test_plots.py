"""The benchmarks' pictures: `plot_compare` writes a PNG from compare results (in memory or a
saved report), `plot_tp` draws per-rank peak sampler memory against TP for every fixed
strategy, and an unusable `--plot` path is a one-line mistake with exit 2 in compare mode too."""
from __future__ import annotations

import json
import struct

import pytest

from tpsample import cli
from tpsample.bench import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMPLS = ("tpsample, replay off", "tpsample, auto replay", "tpsample, new buffer", "tpsample, capture + replay",
         "flashinfer", "flashinfer, top_k_max=50")


def compare_results() -> list[dict]:
    out = []
    for case in ("greedy", "topk_topp", "minp"):
        for rows in (32, 256, 1024):
            impls = IMPLS + (("argmax().tolist()",) if case == "greedy" else ())
            for k, impl in enumerate(impls):
                wall = (50 + 10 * k) * (rows / 32) ** 0.5
                out.append({"case": case, "rows": rows, "vocab": 151936, "impl": impl, "wall_us": wall,
                            "device_us": wall / 2, "host_us": wall / 3, "extra_mib": k * rows / 10})
    return out


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    return struct.unpack(">II", data[16:24])


def test_plot_compare_writes_a_png_of_a_few_kilobytes(tmp_path):
    path = tmp_path / "compare.png"
    plots.plot_compare(compare_results(), str(path))
    width, height = png_size(path)
    assert path.stat().st_size > 5000 and width > 800 and height > 500


def test_a_saved_compare_report_plots_from_the_command_line(tmp_path, capsys):
    report, path = tmp_path / "report.json", tmp_path / "from_json.png"
    report.write_text(json.dumps({"bench": "sampler_compare", "device": "a GPU", "results": compare_results()}))
    assert plots.main(["compare", str(report), str(path)]) == 0
    assert png_size(path)[0] > 800 and capsys.readouterr().out == f"plot: {path}\n"
    assert plots.main(["compare", str(tmp_path / "missing.json"), str(path)]) == 2
    assert plots.main(["pie", str(report), str(path)]) == 2
    assert capsys.readouterr().err.count("\n") == 2


def test_plot_tp_draws_per_rank_peak_memory_against_tp_for_every_fixed_strategy(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    seen = {}
    save = Figure.savefig

    def capture(fig, *a, **k):
        ax = fig.axes[0]
        seen["ylabel"] = ax.get_ylabel()
        seen["lines"] = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
        return save(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", capture)
    results = [{"strategy": s, "tp": tp, "rows": 256, "vocab": 151936, "workload": "topk-topp",
                "peak_bytes": (100 << 20) // (tp if s != "replicated" else 1), "bytes": tp << 20}
               for s in ("replicated", "batch_sharded", "vocab_parallel", "auto") for tp in (1, 2, 4)]
    path = tmp_path / "tp.png"
    plots.plot_tp(results, str(path))
    assert png_size(path)[0] > 500
    assert "peak sampler memory (MiB)" in seen["ylabel"]
    assert set(seen["lines"]) == {"replicated", "batch_sharded", "vocab_parallel"}
    assert seen["lines"]["vocab_parallel"] == ([1, 2, 4], [100.0, 50.0, 25.0])


@pytest.mark.parametrize("where", ["missing/plot.png", ""])
def test_an_unwritable_compare_plot_path_is_one_line_and_exit_2(tmp_path, capsys, where):
    code = cli.main(["bench", "sampler", "--compare", "--plot", str(tmp_path / where)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("tpsample: error: --plot") and "Traceback" not in err


def test_every_compare_case_is_offered_on_the_command_line_and_titled_in_the_plot():
    from tpsample.bench.plots import CASE_TITLES
    from tpsample.bench.workloads import CASES
    parser = cli.build_parser()
    names = [c.name for c in CASES]
    assert parser.parse_args(["bench", "sampler", "--compare", "--cases", *names]).cases == names
    assert all(CASE_TITLES[c.name] == c.title for c in CASES)


def test_a_compare_report_without_memory_figures_still_plots(tmp_path):
    results = [dict(r, extra_mib=None, device_us=None) for r in compare_results()]
    path = tmp_path / "cpu.png"
    plots.plot_compare(results, str(path))
    assert png_size(path)[0] > 800
