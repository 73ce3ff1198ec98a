"""The light install: `pip install tpsample` is torch and numpy only; each extra holds what its
commands import; with only the base install the sampler samples, `tpsample --help` works, and
a command that needs a missing extra is refused in one line naming it, exit 2, before any work.

The base install is simulated in a subprocess whose import system refuses every optional
package (a `sys.meta_path` finder, installed by a `sitecustomize` on PYTHONPATH).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tpsample import cli
from tpsample.cli import extras

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("transformers", "safetensors", "rich", "matplotlib", "gguf", "accelerate", "fastapi", "uvicorn",
            "prometheus_client", "xgrammar")
HOOK = f"""
import sys

OPTIONAL = {set(OPTIONAL)!r}


class RefuseOptional:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in OPTIONAL:
            raise ImportError(f"{{name}} is not installed (base install)")
        return None


sys.meta_path.insert(0, RefuseOptional())
"""
SAMPLE_ONE_STEP = """
import importlib.util, json, sys
import torch, tpsample
s = tpsample.Sampler(1000, max_num_reqs=4)
s.add_request("a", tpsample.SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=1), prompt_token_ids=[1, 2])
plan = s.plan(["a"])
out = s.sample(torch.randn(plan.num_rows, 1000), plan)
try:
    importlib.util.find_spec("rich")
    hooked = False
except ImportError:
    hooked = True
print(json.dumps({"tokens": out.tokens(0), "hooked": hooked,
                  "optional": sorted(m for m in sys.modules if m.partition(".")[0] in OPTIONAL)}))
""".replace("OPTIONAL", repr(OPTIONAL))


def _names(requirements: list[str]) -> set[str]:
    """Distribution names of PEP 508 requirement strings, normalised."""
    return {re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r.strip()).group(0).lower().replace("_", "-")
            for r in requirements}


@pytest.fixture(scope="module")
def project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def extra(project, name: str) -> set[str]:
    return _names(project["optional-dependencies"][name])


@pytest.fixture(scope="module")
def base_env(tmp_path_factory) -> dict:
    """An environment for subprocesses in which the optional packages cannot be imported."""
    hook_dir = tmp_path_factory.mktemp("base_install")
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    path = os.pathsep.join(p for p in (str(hook_dir), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def run_base(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180, env=env, cwd=ROOT,
                          check=False)


# -- pyproject.toml --------------------------------------------------------------------------
def test_the_base_install_is_torch_and_numpy_only(project):
    assert _names(project["dependencies"]) == {"torch", "numpy"}


def test_each_extra_holds_every_module_its_commands_import(project):
    for command, (name, modules) in extras.NEEDS.items():
        missing = {m.replace("_", "-") for m in modules} - extra(project, name)   # module -> distribution name
        assert not missing, f"tpsample {command} imports {sorted(missing)}, which [{name}] does not install"


def test_triton_is_asked_for_only_on_linux_where_its_wheels_exist(project):
    wanted = [r for reqs in project["optional-dependencies"].values() for r in reqs if _names([r]) == {"triton"}]
    assert wanted, "no extra installs triton"
    assert all(r.replace('"', "'").split(";", 1)[-1].strip() == "platform_system == 'Linux'" for r in wanted), wanted


def test_the_declared_license_is_the_license_file_shipped(project):
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text


def test_every_command_names_its_extra():
    def subcommands(parser) -> dict:
        return {name: sub for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                for name, sub in a.choices.items()}

    commands = set()
    for name, sub in subcommands(cli.build_parser()).items():
        commands |= {f"{name} {what}" for what in subcommands(sub)} or {name}
    assert commands == set(extras.NEEDS)


def test_serve_holds_the_engine_and_test_and_dev_hold_serve(project):
    engine = extra(project, "engine")
    assert {"safetensors", "transformers", "gguf", "accelerate", "rich", "matplotlib", "xgrammar"} <= engine
    assert engine | {"fastapi", "uvicorn", "httpx", "prometheus-client"} <= extra(project, "serve")
    kept = {"pytest", "pytest-xdist", "hypothesis", "triton", "xgrammar", "fastapi", "uvicorn", "openai", "httpx"}
    assert extra(project, "serve") | kept <= extra(project, "test")
    assert extra(project, "test") | {"ruff"} <= extra(project, "dev")
    assert extra(project, "grammar") == {"xgrammar"} and extra(project, "triton") == {"triton"}


def test_the_quick_start_installs_what_its_commands_need(project):
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", quick, flags=re.DOTALL)
    commands = [line for b in blocks for line in b.splitlines() if line.strip()]
    assert commands == ['pip install torch==2.13.0 -e ".[engine]" && tpsample demo',
                        'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q -n auto']
    assert set(extras.NEEDS["demo"][1]) <= extra(project, "engine")
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == commands[1]


def test_ci_lints_with_the_configured_ruff_before_the_tests():
    lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    lint = [i for i, line in enumerate(lines) if line.split("&&")[-1].strip() == "ruff check ."]
    assert lint and lint[0] < len(lines) - 1, "ruff check runs before the README's test command"
    with open(ROOT / "pyproject.toml", "rb") as f:
        lint_config = tomllib.load(f)["tool"]["ruff"]["lint"]
    assert {"E", "W", "F", "I"} <= set(lint_config["select"])


# -- the base install, simulated ---------------------------------------------------------------
def test_import_tpsample_and_one_cpu_sampling_step_need_only_the_base_install(base_env):
    proc = run_base(["-c", SAMPLE_ONE_STEP], base_env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["hooked"] and got["optional"] == []
    assert len(got["tokens"]) == 1 and 0 <= got["tokens"][0] < 1000


def test_tpsample_help_needs_only_the_base_install(base_env):
    proc = run_base(["-m", "tpsample.cli", "--help"], base_env)
    assert proc.returncode == 0, proc.stderr
    assert "demo" in proc.stdout and "bench" in proc.stdout and proc.stderr == ""


@pytest.mark.parametrize("argv, name", [(["demo"], "engine"), (["serve"], "serve"),
                                        (["bench", "sampler", "--tp", "1"], "engine")])
def test_a_command_without_its_extra_is_one_line_naming_the_extra_and_exit_2(base_env, argv, name):
    proc = run_base(["-m", "tpsample.cli", *argv], base_env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert f"needs the {name} extra" in proc.stderr and f"pip install 'tpsample[{name}]'" in proc.stderr
