"""`bench sampler --compare` on CPU: the harness runs every column it can, says why not for the
rest, and writes its report as it goes; FlashInfer is called as vLLM calls it (checked against a
stand-in module: no FlashInfer here), and a build that outlives its time is killed, compilers too."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import types

import pytest
import torch

from tpsample import cli
from tpsample.bench import compare, compare_columns, flashinfer


def test_a_cpu_compare_runs_the_tpsample_columns_and_says_why_the_others_did_not_run(tmp_path, capsys):
    out = tmp_path / "compare.json"
    code = cli.main(["bench", "sampler", "--compare", "--device", "cpu", "--rows", "3", "--vocab", "200", "--steps",
                     "1", "--cases", "greedy", "topk_topp_lp5", "penalties", "--plot", "", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report == json.loads(out.read_text()) and report["complete"] is True
    got = {(r["case"], r["impl"]) for r in report["results"]}
    tpsample = ("tpsample, replay off", "tpsample, auto replay", "tpsample, new buffer")
    assert got == ({(c, i) for c in ("greedy", "topk_topp_lp5") for i in tpsample}
                   | {("greedy", "argmax().tolist()"), ("penalties", "tpsample, replay off")})
    for r in report["results"]:
        assert r["wall_us"] > 0 and r["host_us"] > 0 and r["rows"] == 3 and r["title"]
        assert r["device_us"] is None and r["extra_mib"] is None          # CPU: no profiler or allocator figures
    skipped = report["skipped"]
    assert set(skipped["tpsample, capture + replay"].values()) == {"needs CUDA"}
    assert skipped["flashinfer"]["greedy"] == "FlashInfer has no such op"
    assert skipped["flashinfer"]["penalties"] == "sampling module: needs CUDA"
    assert skipped["tpsample, auto replay"] == {"penalties": "in place: never replayed"}
    assert "argmax().tolist()" not in skipped                    # not applicable is not a failure
    meta = report["meta"]
    assert meta["command"].startswith("python") and meta["torch"] == torch.__version__
    assert len(meta["source_sha256"]) == 64
    assert "not run: tpsample, capture + replay: needs CUDA (greedy, topk_topp_lp5, penalties)" in stdout


def test_a_column_that_fails_is_reported_and_the_others_still_run(monkeypatch, capsys):
    def broken(case, logits):
        raise RuntimeError("kernel\nlaunch failed")
    real = compare_columns.columns
    monkeypatch.setattr(compare_columns, "columns",
                        lambda status, reserve_tokens: {**real(status, reserve_tokens), "tpsample, new buffer": broken})
    report = compare.run((2,), 100, iters=1, cases=["greedy"], device="cpu")
    assert report["skipped"]["tpsample, new buffer"] == {"greedy": "failed: RuntimeError: kernel launch failed"}
    assert {r["impl"] for r in report["results"]} == {"tpsample, replay off", "tpsample, auto replay",
                                                     "argmax().tolist()"}
    assert "RuntimeError: kernel" in capsys.readouterr().err              # the traceback, for whoever reads the log


@pytest.fixture
def fake_flashinfer(monkeypatch):
    """flashinfer.sampling stand-in: records each call and returns token 0 per row."""
    calls = []

    def op(name):
        def run(*args, **kwargs):
            calls.append((name, args, kwargs))
            return torch.zeros(args[0].shape[0], dtype=torch.int32)
        return run
    module = types.ModuleType("flashinfer.sampling")
    for name in ("sampling_from_logits", "top_p_sampling_from_probs", "top_k_sampling_from_probs",
                 "min_p_sampling_from_probs", "top_k_top_p_sampling_from_logits"):
        setattr(module, name, op(name))
    package = types.ModuleType("flashinfer")
    package.sampling = module
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", module)
    return calls


@pytest.mark.parametrize("params, op, top_k_max", [
    ({"temperature": 0.5}, "sampling_from_logits", None),
    ({"temperature": 0.5, "top_p": 0.9}, "top_p_sampling_from_probs", None),
    ({"temperature": 0.5, "top_k": 7}, "top_k_sampling_from_probs", None),
    ({"temperature": 0.5, "top_k": 7}, "top_k_top_p_sampling_from_logits", 50),
    ({"temperature": 0.5, "min_p": 0.1}, "min_p_sampling_from_probs", None),
    ({"temperature": 0.5, "top_k": 7, "top_p": 0.9}, "top_k_top_p_sampling_from_logits", 50),
])
def test_flashinfer_is_called_as_vllm_calls_it_temperature_in_place_and_per_row_tensors(fake_flashinfer, params,
                                                                                          op, top_k_max):
    x = torch.randn(3, 64)
    before = x.clone()
    finish = flashinfer.recipe(params, x, top_k_max)()
    assert torch.equal(x, before / 0.5)                                  # divided in place: no copy of its own
    (name, args, kwargs), = fake_flashinfer
    assert name == op and kwargs["deterministic"] is True and kwargs.get("top_k_max") == top_k_max
    assert torch.equal(kwargs["seed"], torch.arange(3)) and kwargs["offset"].shape == (3,)
    if name.endswith("_from_probs"):
        assert torch.allclose(args[0], (before / 0.5).softmax(dim=-1))
    else:
        assert args[0] is x
    tensors = [a for a in args[1:] if isinstance(a, torch.Tensor)]      # per-row parameters
    assert len(tensors) == {"sampling_from_logits": 0, "top_k_top_p_sampling_from_logits": 2}.get(name, 1)
    assert all(t.shape == (3,) for t in tensors)
    assert finish() == [0, 0, 0]


def test_flashinfer_runs_only_what_it_has():
    assert not flashinfer.supported({"temperature": 0.0})
    assert not flashinfer.supported({"temperature": 0.8, "top_p": 0.9, "min_p": 0.05})
    assert not flashinfer.supported({"temperature": 0.8, "dry_multiplier": 0.8})
    assert flashinfer.supported({"temperature": 0.8, "top_k": 50, "top_p": 0.9, "logprobs": 5,
                                 "repetition_penalty": 1.1, "frequency_penalty": 0.2})


def test_flashinfer_logprobs_come_from_the_raw_logits_with_the_sampled_tokens_rank(fake_flashinfer):
    x = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    ids, lps = flashinfer.recipe({"temperature": 0.5, "top_k": 2, "top_p": 0.9, "logprobs": 2}, x)()()
    raw = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).log_softmax(dim=-1)[0]
    assert ids == [[0, 1, 3, 4]]                       # sampled token 0, top-2 ids 1 and 3, its rank 4
    assert lps[0] == pytest.approx([raw[0].item(), raw[1].item(), raw[3].item()])


def test_penalties_in_torch_match_the_semantics_repetition_on_seen_tokens_frequency_on_outputs():
    x = torch.tensor([[2.0, -2.0, 1.0, 4.0]])
    prompt, output = torch.tensor([[0, 4]]), torch.tensor([[1, 1, 4]])        # id 4 = V: padding
    flashinfer._penalties(x, prompt, output, torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([0.25]))
    assert x.tolist() == [[1.0, -4.0 - 1.0 - 0.25, 1.0, 4.0]]


def test_a_build_that_outlives_its_time_is_killed_with_the_compilers_it_started(tmp_path):
    pid_file = tmp_path / "grandchild"
    code = (f"import subprocess, time; p = subprocess.Popen(['sleep', '300'], stdout=subprocess.DEVNULL, "
            f"stderr=subprocess.DEVNULL); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(300)")
    status = flashinfer._build_one(code, 3.0)
    assert status == {"ok": False, "why": "not built within 3 s (killed)", "seconds": 3}
    grandchild = int(pid_file.read_text())
    try:
        for _ in range(50):
            if not _running(grandchild):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the build's own child process was left running")
    finally:
        if _running(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_failed_build_says_what_it_printed_last():
    status = flashinfer._build_one("print('compiling'); raise SystemExit('nvcc fatal: unsupported gpu')", 60)
    assert status["ok"] is False and status["why"].startswith("build failed (exit 1): compiling | nvcc fatal")


def test_a_status_written_ahead_is_read_back_with_its_build_environment(tmp_path, monkeypatch):
    path = tmp_path / "status.json"
    status = {"version": "0.7.4", "env": {"FLASHINFER_CUDA_ARCH_LIST": "9.0a"},
              "modules": {"sampling": {"ok": True, "seconds": 80.0}, "topk": {"ok": False, "why": "not built"}}}
    path.write_text(json.dumps(status))
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    assert flashinfer.load_status(str(path)) == status
    assert os.environ["FLASHINFER_CUDA_ARCH_LIST"] == "9.0a"     # the loaded modules are the ones built


def test_an_unreadable_build_status_means_no_flashinfer_column_and_says_why(tmp_path):
    path = tmp_path / "status.json"
    path.write_text('{"version": "0.7.4", "modu')                       # cut short
    status = flashinfer.load_status(str(path))
    assert {m["why"] for m in status["modules"].values()} == {f"no usable build status in {path} (JSONDecodeError)"}
    assert not any(m["ok"] for m in status["modules"].values())
