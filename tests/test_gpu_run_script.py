"""scripts/gpu_run.sh, checked without a GPU: both device calls' plans (`--dry-run`) name commands
the command line accepts, keep their outputs where the device tool brings files back, and fit a
10-minute call; the GPU scripts parse."""
from __future__ import annotations

import pathlib
import shlex
import subprocess

import pytest

from tpsample import cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = ("gpu_run.sh", "gpu_tests.sh")
CALL_LIMIT_S = 600


def plan(name: str) -> list[str]:
    done = subprocess.run(["bash", "scripts/gpu_run.sh", "--dry-run", name], cwd=ROOT, capture_output=True,
                          text=True, check=True, env={"PATH": "/usr/bin:/bin", "OUT": "out"})
    return done.stdout.splitlines()


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_gpu_scripts_parse(script):
    subprocess.run(["bash", "-n", f"scripts/{script}"], cwd=ROOT, check=True)


@pytest.mark.parametrize("name, phases", [
    ("bench", ["flashinfer", "tp", "compare"]),
    ("checks", ["gpu-check", "tests-kernels", "tests-sampler", "engine", "engine-tests"]),
])
def test_each_device_call_runs_commands_the_cli_accepts_within_its_budget(name, phases):
    lines = plan(name)
    budget = int(lines[0].removeprefix("budget: ").removesuffix("s"))
    assert budget <= CALL_LIMIT_S - 30                   # start-up, install and packing fit in what is left
    seen = []
    for line in lines[1:]:
        head, command = line.split(": ", 1)
        seen.append(head.split()[1])
        argv = shlex.split(command.split(": ", 1)[-1] if command.startswith("limit") else command)
        if argv[1:3] == ["-m", "tpsample.cli"]:
            args = cli.build_parser().parse_args(argv[3:])        # every option exists and parses
            out = pathlib.PurePath(args.out)
            assert out.parent == pathlib.PurePath("out") and out.suffix == ".json"
        elif argv[1:3] == ["-m", "tpsample.bench.flashinfer"]:
            assert argv[3:] == ["--timeout", "270", "--out", "out/flashinfer_build.json"]
        elif "scripts/gpu_tests.sh" in argv:
            assert argv[argv.index("scripts/gpu_tests.sh") - 1] == "bash"
            assert argv[-1] in ("kernels", "sampler", "engine")
    assert seen == phases
