"""Every benchmark report says what produced it: the commit (or, in a copy without git, the
sources' hash and TPSAMPLE_COMMIT), the date, the device, the versions and the command line; it
is printed as the last line and written to `--out`."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from tpsample.bench import report


def test_a_report_is_one_last_json_line_and_the_same_file_with_what_produced_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/x/site-packages/tpsample/cli/__main__.py", "bench", "sampler", "--plot", ""])
    out = tmp_path / "r.json"
    report.finish({"bench": "demo", "results": [1]}, str(out))
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and json.loads(printed[0]) == json.loads(out.read_text())
    meta = json.loads(printed[0])["meta"]
    assert set(meta) == {"commit", "dirty", "source_sha256", "date", "device", "python", "torch", "cuda", "triton",
                         "flashinfer", "env", "command"}
    assert meta["command"] == "tpsample bench sampler --plot ''" and meta["torch"] == torch.__version__
    assert meta["date"].endswith("+00:00") and meta["source_sha256"] == report.source_sha256()


def test_without_git_the_commit_comes_from_the_environment_and_the_sources_are_hashed(monkeypatch):
    monkeypatch.setattr(report, "_git", lambda *args: None)
    monkeypatch.setenv("TPSAMPLE_COMMIT", "abc123")
    assert report.commit() == {"commit": "abc123", "dirty": None}
    printed = subprocess.run([sys.executable, "-m", "tpsample.bench.report"], capture_output=True, text=True,
                             check=True).stdout
    assert printed.strip() == report.source_sha256()


def test_a_source_change_changes_the_hash(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(report, "PACKAGE", tmp_path)
    before = report.source_sha256()
    (tmp_path / "a.py").write_text("x = 2\n")
    assert report.source_sha256() != before


def test_the_given_commit_wins_over_the_trees_own_git_metadata(monkeypatch):
    """A tree copied to another machine can carry the git metadata of another commit: the commit
    the caller names is the one recorded."""
    monkeypatch.setattr(report, "_git", lambda *args: "0" * 40)
    monkeypatch.setenv("TPSAMPLE_COMMIT", "abc123")
    assert report.commit() == {"commit": "abc123", "dirty": None}
    monkeypatch.delenv("TPSAMPLE_COMMIT")
    assert report.commit()["commit"] == "0" * 40
