"""May a kernel run here? The one answer for every kernel path (no kernels here, nothing heavy
imported: CPU-only installs without Triton ask it too).

- The sampling kernels (`kernels_wanted(device)`): CUDA with Triton, or CPU when both
  TPSAMPLE_KERNELS_ON_CPU=1 and TRITON_INTERPRET=1, which is how the CPU tests run them through
  Triton's interpreter.
- The engine's kernels (attention, model ops; `kernels_wanted(device, cpu_ok=False)`): CUDA with
  Triton only.
- `interpreting()`: TRITON_INTERPRET=1, read when asked (tests set it per module).
"""
from __future__ import annotations

import functools
import os

import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernels_wanted(device, *, cpu_ok: bool = True) -> bool:
    """Whether a kernel path runs on `device` (see the module docstring); cpu_ok=False for the
    engine's CUDA-only kernels."""
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    if kind == "cuda":
        return _cuda_triton()
    return cpu_ok and kind == "cpu" and os.environ.get("TPSAMPLE_KERNELS_ON_CPU") == "1" and kernels_available(kind)


def kernels_available(device) -> bool:
    """True when these kernels can run on `device`: CUDA with Triton, or CPU under TRITON_INTERPRET=1."""
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    if kind == "cuda":
        return _cuda_triton()
    return kind == "cpu" and interpreting() and _triton_importable()


@functools.cache
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _cuda_triton() -> bool:
    return _triton_importable() and torch.cuda.is_available()
