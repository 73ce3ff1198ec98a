"""`bench sampler --tp` (strategies x TP x feature classes) on CPU over gloo at a tiny size: every
class is measured at every TP size on both logit kinds, with the collectives, bytes per row,
exact-path rows and memory per row it reports (no timings are checked)."""
from __future__ import annotations

import json

from tpsample import cli
from tpsample.bench.workloads import CLASSES, WORKLOADS


def test_every_feature_class_reports_collectives_bytes_exact_rows_and_memory_per_rank(tmp_path, capsys):
    out = tmp_path / "tp.json"
    code = cli.main(["bench", "sampler", "--tp", "1", "2", "--rows", "8", "--vocab", "256", "--steps", "1",
                     "--workload", "classes", "--logits", "randn", "zipf", "--strategies", "vocab_parallel",
                     "--plot", "", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report == json.loads(out.read_text()) and report["complete"] is True
    assert report["logits"] == ["randn", "zipf"] and report["meta"]["source_sha256"]
    rows = {(r["tp"], r["workload"], r["logits"]): r for r in report["results"]}
    assert set(rows) == {(tp, w, k) for tp in (1, 2) for w in CLASSES for k in ("randn", "zipf")}
    for (tp, workload, _), r in rows.items():
        assert r["rows"] == 8 and r["backend"] == ("none" if tp == 1 else "gloo")
        assert len(r["peak_bytes_per_rank"]) == len(r["bytes_per_rank"]) == len(r["ms_per_rank"]) == tp
        assert r["device_us"] is None and r["device_us_per_rank"] == [None] * tp     # CPU: no profiler figures
        assert r["peak_bytes_per_row"] == max(r["peak_bytes_per_rank"]) / 8 >= 0
        assert r["bytes_per_row"] == max(r["bytes_per_rank"]) / 8
        assert 0 <= r["exact_rows"] <= r["exact_rows_of"] == 8
        if tp == 1 or "topp" not in workload:                   # only top-p without top-k can need the exact path
            assert r["exact_rows"] == 0, (tp, workload)
        if tp == 1:
            assert r["rounds"] == 0 and r["bytes"] == 0
        else:
            assert r["rounds"] >= 1 and r["bytes"] > 0
    drafts = rows[(2, "drafts", "randn")]
    assert WORKLOADS["drafts"].num_drafts == 3 and drafts["rows"] == 8     # 2 requests x (1 + 3 drafts)
    assert "x TP1" in stdout and "exact" in stdout
