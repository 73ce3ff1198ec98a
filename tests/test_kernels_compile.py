"""Every kernel the sampling path launches compiles for sm_90, checked on a machine without a GPU.

The other kernel tests run the kernels under Triton's interpreter, which type-checks nothing the
compiler does: a kernel can pass them all and still not compile for a GPU (two shapes under one
name in the two branches of an `if`, a float64 operation the backend cannot lower, a typo in
inline PTX). Here the real launch code runs on fake CUDA tensors and each launch is compiled for
sm_90 through ptxas (tests/sm90_compile.py), in a process of its own: it stubs torch.cuda and
Triton's launch for good, and a kernel module must be imported without TRITON_INTERPRET to be
compiled at all.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from sm90_compile import GROUPS, HEAVY

import tpsample

NVIDIA = pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton's NVIDIA backend is not installed")
try:
    NVIDIA.get_ptxas(90)        # the PTX stage reads its version too
except RuntimeError:
    pytest.skip("Triton's NVIDIA backend has no ptxas", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).with_name("sm90_compile.py")
SRC = pathlib.Path(tpsample.__file__).parents[1]     # the tpsample these tests import


def compile_group(group: str) -> tuple[list[dict], str]:
    """The script's per-case results for `group` and its stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TPSAMPLE_KERNELS_ON_CPU")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(SRC), env.get("PYTHONPATH"))))
    proc = subprocess.run([sys.executable, str(SCRIPT), group], capture_output=True, text=True, env=env,
                          timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, f"the compile script failed (exit {proc.returncode}): {proc.stderr[-3000:]}"
    return [json.loads(line) for line in lines], proc.stderr


# the sorts of c >= 1000 values and the bf16 pipeline take most of the time: asked for by name
ALL = os.environ.get("TPSAMPLE_COMPILE_ALL") == "1"
HEAVY_MARKS = (pytest.mark.slow, pytest.mark.skipif(not ALL, reason="set TPSAMPLE_COMPILE_ALL=1 to compile these too"))


@pytest.mark.parametrize("group", [pytest.param(g, marks=HEAVY_MARKS) if g == HEAVY else g for g in GROUPS])
def test_every_launched_kernel_compiles_for_sm90(group):
    results, stderr = compile_group(group)
    assert results, f"no case of {group} ran: {stderr[-3000:]}"
    failures = [f"{r['case']}: {r['error']['kernel'] or 'the launch code'} does not compile for sm_90: "
                f"{r['error']['message']}" for r in results if r["error"]]
    if failures:        # the compiler's own diagnostics (MLIR's go to stderr), shown with the failure
        print(stderr[-6000:])
    assert not failures, "\n".join(failures)
    idle = [r["case"] for r in results if not r["kernels"]]
    assert not idle, f"cases that launched no kernel (the entry point no longer reaches its kernels): {idle}"
