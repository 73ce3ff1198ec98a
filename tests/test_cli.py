"""The command line: every user mistake is one line on stderr and exit code 2, before any work
starts; every option says its default; tables fit 80 columns; generate runs end to end."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from tpsample import cli
from tpsample.cli.args import HelpFormatter

WORK = {   # module, attribute: what each command calls to do its work
    "generate": ("tpsample.llm", "LLM"),
    "sampler demo": ("tpsample.demo.sampler", "run_sampler_demo"),
    "engine demo": ("tpsample.demo.engine", "run_demo"),
    "bench engine": ("tpsample.bench.engine", "run_bench"),
    "bench sampler": ("tpsample.bench.sampler", "main"),
    "bench kernels": ("tpsample.bench.kernels", "run_bench_kernels"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tpsample.testing.toy import make_random_checkpoint
    root = tmp_path_factory.mktemp("cli")
    tok = make_random_checkpoint(str(root / "tok"), vocab_size=300, tokenizer=True, eos_token_id=0)
    bare = root / "bare"                       # the same checkpoint without its tokenizer files
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).symlink_to(root / "tok" / f)
    bare = str(bare)
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    return {"tok": tok, "bare": bare, "broken": str(broken), "root": str(root)}


@pytest.fixture
def no_work(monkeypatch):
    """Replace every command's work with a recorder; returns the list of what was called."""
    import importlib
    called = []
    for name, (module, attr) in WORK.items():
        monkeypatch.setattr(importlib.import_module(module), attr,
                            lambda *a, _name=name, **k: called.append(_name))
    return called


def mistakes(m):
    gen = ["generate", "--model", m["bare"]]
    return [
        gen + ["--prompt-ids", "1,x,3"], gen + ["--prompt-ids", "1,-2"], gen + ["--prompt-ids", "1,300"],
        ["generate", "--model", m["root"] + "/missing", "--prompt-ids", "1"],
        ["generate", "--model", m["bare"] + "/config.json", "--prompt-ids", "1"],
        ["generate", "--model", m["broken"], "--prompt-ids", "1"],
        gen + ["--prompt-ids", "1", "--temperature", "-1"], gen + ["--prompt-ids", "1", "--top-p", "nan"],
        gen + ["--prompt-ids", "1", "--logprobs", "21"], gen + ["--prompt", "hello"], gen,
        ["generate", "--model", m["tok"], "--prompt-ids", "1", "--json-schema", '{"type": '],
        ["generate", "--model", m["tok"], "--prompt-ids", "1", "--json-schema", "@" + m["root"] + "/none.json"],
        gen + ["--prompt-ids", "1", "--regex", "a+"],                    # structured output needs a tokenizer
        gen + ["--prompt-ids", "1", "--tp", "0"], gen + ["--prompt-ids", "1", "--tp", "3"],
        gen + ["--prompt-ids", "1", "--max-tokens", "0"], gen + ["--prompt-ids", "1", "--strategy", "fast"],
        gen + ["--prompt-ids", "1", "--dry-multiplier", "-1"], gen + ["--prompt-ids", "1", "--dry-base", "0.5"],
        gen + ["--prompt-ids", "1", "--dry-penalty-last-n", "-2"], gen + ["--prompt-ids", "1", "--xtc-threshold", "2"],
        gen + ["--prompt-ids", "1", "--top-n-sigma", "nan"],
        gen + ["--prompt-ids", "1", "--dry-multiplier", "1", "--dry-sequence-breaker", "x"],    # strings need a tokenizer
        ["demo", "--tp", "0"], ["demo", "--engine-tp", "2"], ["demo", "--engine-tp", "1,0"],
        ["demo", "--engine-max-tokens", "0"],
        ["demo", "--engine-model", m["root"] + "/missing"], ["demo", "--part", "everything"],
        ["bench", "sampler", "--steps", "0"], ["bench", "sampler", "--tp", "0", "2"],
        ["bench", "sampler", "--threads", "0"], ["bench", "sampler", "--workload", "nope"],
        ["bench", "sampler", "--tp", "4", "--vocab", "3"],
        ["bench", "sampler", "--plot", m["root"] + "/missing/plot.png"], ["bench", "sampler", "--plot", m["root"]],
        ["bench", "engine", "--plot", m["root"] + "/missing/plot.png"], ["bench", "engine", "--batch-sizes", "1,0"],
        ["bench", "engine", "--strategies", "replicated,fast"], ["bench", "engine", "--tp", "3"],
        ["bench", "kernels", "--device", "cpu"], ["bench", "kernels", "--iters", "0"], ["bench"], ["serve-me"],
        ["bench", "engine", "--preset", "qwen2-70b"], ["bench", "engine", "--preset", "kv-bound", "--tp", "3"],
    ] + ([["bench", "kernels"], ["demo", "--device", "cuda"], gen + ["--prompt-ids", "1", "--device", "cuda"],
          ["bench", "sampler", "--compare"]]
         if not torch.cuda.is_available() else [])


def run_cli(argv, capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_every_user_mistake_is_one_line_and_exit_2_before_any_work(models, no_work, capsys):
    for argv in mistakes(models):
        code, out, err = run_cli(argv, capsys)
        assert code == 2, (argv, code, err)
        assert err.count("\n") == 1 and err.startswith("tpsample") and "error: " in err, (argv, err)
        assert "Traceback" not in err and out == "", (argv, out)
        assert no_work == [], (argv, no_work)


def test_a_value_error_under_a_command_is_a_user_mistake_and_other_errors_keep_tracebacks(monkeypatch, capsys):
    import tpsample.demo.sampler

    def bad(**_):
        raise ValueError("SamplingParams.top_k must be\nan integer")
    monkeypatch.setattr(tpsample.demo.sampler, "run_sampler_demo", bad)
    code, _, err = run_cli(["demo", "--part", "sampler", "--tp", "1"], capsys)
    assert code == 2 and err == "tpsample: error: SamplingParams.top_k must be an integer\n"

    def broken(**_):
        raise RuntimeError("internal")
    monkeypatch.setattr(tpsample.demo.sampler, "run_sampler_demo", broken)
    with pytest.raises(RuntimeError, match="internal"):
        cli.main(["demo", "--part", "sampler", "--tp", "1"])


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_has_help_that_states_its_default():
    parsers = list(_parsers(cli.build_parser()))
    assert len(parsers) >= 7                    # tpsample, demo, generate, bench, bench x 3
    fmt = HelpFormatter("tpsample")
    for parser in parsers:
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            text = fmt._get_help_string(action) % {"default": action.default}
            assert action.help and ("default" in text or action.required), (parser.prog, action.option_strings)


def test_tables_fit_80_columns(monkeypatch, capsys):
    from tpsample.bench import engine as bench_engine
    from tpsample.demo import engine as demo_engine
    monkeypatch.setenv("COLUMNS", "80")
    res = [{"tp": tp, "strategy": s, "tokens": [[1, 2]], "texts": ["Paris." * 30] * len(demo_engine.CHATS),
            "sampler_peak_bytes": [123 << 20] * tp, "seconds": 12.3} for tp in (1, 3) for s in demo_engine.STRATEGIES]
    demo_engine.print_results(res, "SmolLM2-135M-Instruct")
    bench_engine.print_table([{"strategy": s, "batch": 256, "tokens_per_s": 12345.6, "ttft_ms": 1234.5,
                               "tpot_ms": 123.4, "sampler_peak_bytes": [123 << 20] * 2, "kv_blocks": 12345}
                              for s in demo_engine.STRATEGIES], 2)
    from tpsample.demo.sampler import run_sampler_demo
    run_sampler_demo(tp=1, vocab=5000)
    out = capsys.readouterr().out
    assert out.count("strategy") == 3
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out


def test_generate_prints_each_output_then_one_json_line(models, capsys):
    code, out, err = run_cli(["generate", "--model", models["bare"], "--prompt-ids", "1,2,3", "--prompt-ids", "4",
                              "--max-tokens", "3", "--temperature", "0", "--kv-cache-tokens", "256",
                              "--dtype", "float32"], capsys)
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 3, (out, err)
    assert lines[0].startswith("[0] (length, 3 tokens)") and lines[1].startswith("[1] (length, 3 tokens)")
    assert set(json.loads(lines[2])) == {"info", "stats"}


def test_bench_sampler_runs_every_strategy_workload_and_tp_then_one_json_line(capsys):
    code, out, err = run_cli(["bench", "sampler", "--tp", "1", "2", "--rows", "4", "--vocab", "300", "--steps", "1",
                              "--plot", "", "--workload", "greedy", "topk-topp-lp", "--logits", "zipf"], capsys)
    assert code == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert (report["bench"], report["logits"], report["threads"]) == ("sampler", ["zipf"], 1)
    got = {(r["tp"], r["workload"], r["strategy"]) for r in report["results"]}
    assert got == {(tp, w, s) for tp in (1, 2) for w in ("greedy", "topk-topp-lp")
                   for s in ("replicated", "batch_sharded", "vocab_parallel", "auto")}
    assert all(r["ms"] > 0 and r["rounds"] >= 1 for r in report["results"] if r["tp"] == 2)


def test_the_installed_entry_point_reports_mistakes_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "tpsample.cli", "demo", "--tp", "0"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["tpsample demo: error: argument --tp: must be an integer >= 1, got '0' "
                                        "(see tpsample demo --help)"]


def test_third_party_progress_bars_are_switched_off(monkeypatch, capfd, tmp_path):
    from transformers.utils import logging as hf_logging

    from tpsample import term
    from tpsample.testing.toy import make_random_checkpoint
    for key in term._QUIET_ENV:
        monkeypatch.delenv(key, raising=False)          # restored (removed again) after the test
    was_on, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    try:
        term.quiet_third_party()
        make_random_checkpoint(str(tmp_path), vocab_size=64)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)
    err = capfd.readouterr().err
    assert "Writing model shards" not in err and "it/s" not in err, err
    assert all(term.os.environ[k] == v for k, v in term._QUIET_ENV.items())   # what spawned workers inherit
