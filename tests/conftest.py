"""Shared test setup.

Threads: one intra-op thread per test process unless OMP_NUM_THREADS says otherwise. The suite
runs on small shared machines, where torch's spinning worker threads cost about twice the CPU
time for the same wall time (measured: a 1e5-draw tail test, 67 vs 34 CPU seconds on two busy
cores); spawned ranks already run one thread each.

Triton kernels on a machine without CUDA run through Triton's interpreter, which `triton.jit`
chooses when a function is *defined*: for Triton's own library (`triton.language`) when triton
is first imported, for our kernels when their modules are first imported. So, without CUDA:
- this file imports triton once with TRITON_INTERPRET=1 set only for that import;
- `triton_interpreter` (module scope) sets the variable while a kernel test module runs (our
  kernel modules are imported lazily, inside those tests; `kernels.sample` reads the variable
  at call time) and removes it when the module ends, so later tests, and the processes they
  spawn, never inherit it;
- the interpreter's helper calls skip a re-patch of the language that the running launch
  already made (`tests/interpreter.py`; the same results in about 40 % less time).
"""
from __future__ import annotations

import os

import pytest
import torch

if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)

if not torch.cuda.is_available():
    with pytest.MonkeyPatch.context() as _mp:
        _mp.setenv("TRITON_INTERPRET", "1")
        try:
            import triton.language  # noqa: F401
        except ImportError:
            pass
        else:       # helper calls inside interpreted kernels skip a redundant re-patch (~40 % of their time)
            from interpreter import speed_up_device_calls
            speed_up_device_calls()


@pytest.fixture(scope="module")
def triton_interpreter():
    pytest.importorskip("triton")
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "1")
        yield
