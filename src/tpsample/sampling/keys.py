"""Row keys of the noise, on whatever device the rows live: one kernel launch where kernels run
(the torch version is a long chain of tiny integer ops), `tpsample.noise.row_keys` elsewhere; and
whether the per-step kernels run on a device (`_kernel_ok`)."""
from __future__ import annotations

import functools
import os
from types import SimpleNamespace

import torch

from .. import noise
from ..kernels.launcher import kernels_wanted

_OK: dict = {}


def _kernel_ok(t: torch.Tensor) -> bool:
    """Kernels run on t's device: CUDA with Triton, or CPU when asked (the answer is kept per
    device and the two variables that decide it on CPU, which tests set per module)."""
    if t.is_cuda:        # decided once per process on CUDA: no environment lookup per step
        return kernels_wanted(t.device)
    key = (t.device, os.environ.get("TPSAMPLE_KERNELS_ON_CPU"), os.environ.get("TRITON_INTERPRET"))
    got = _OK.get(key)
    if got is None:
        got = _OK[key] = _kernel_ok_now(t)
    return got


@functools.cache
def _kernel_fns() -> SimpleNamespace:
    """The per-step kernels, imported on first use (triton.jit picks interpreted or compiled when
    a kernel module is imported) and kept, so a step runs no import statement."""
    from ..kernels import shard, shard_band
    from ..kernels.penalties import apply_penalties_
    from ..kernels.step_ops import append_history, mask_nans_, row_keys
    return SimpleNamespace(append_history=append_history, apply_penalties_=apply_penalties_, mask_nans_=mask_nans_,
                           row_keys=row_keys,
                           shard=SimpleNamespace(front=shard.front, gumbel_draw=shard.gumbel_draw,
                                                 top_values=shard.top_values,
                                                 tie_counts=shard.tie_counts, MAX_TOP=shard.MAX_TOP,
                                                 band_histogram=shard_band.band_histogram,
                                                 band_partials=shard_band.band_partials))


def _kernel_ok_now(t: torch.Tensor) -> bool:
    return kernels_wanted(t.device)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(key0, key1) [rows] int64 in [0, 2**32): the same bits as `noise.row_keys`."""
    seeds, positions = seeds.to(torch.int64), positions.to(seeds.device, torch.int64)
    if _kernel_ok(seeds):
        return _kernel_fns().row_keys(seeds, positions, salt)
    return noise.row_keys(seeds, positions, salt)


_PROBES: dict = {}


def _probe(device) -> torch.Tensor:
    """An empty tensor on `device` (kept: one per device)."""
    got = _PROBES.get(str(device))
    if got is None:
        got = _PROBES[str(device)] = torch.empty(0, device=device)
    return got


def append_kernel(device: torch.device):
    """The history-append kernel for `device`, or None (torch ops then)."""
    if not _kernel_ok(_probe(device)):
        return None
    return _kernel_fns().append_history


def mask_nans_kernel(device: torch.device):
    """The in-place NaN -> -inf kernel for `device`, or None (torch ops then)."""
    if not _kernel_ok(_probe(device)):
        return None
    return _kernel_fns().mask_nans_


SHARD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def shard_passes(x: torch.Tensor):
    """The shard-pass kernels (`kernels.shard`: front, gumbel_draw, top_values, tie_counts,
    MAX_TOP; `kernels.shard_band`: band_histogram, band_partials) for
    rows x, or None (torch ops then): kernels run on x's device and read its layout (fp32, bf16
    or fp16 with unit column stride). TPSAMPLE_SHARD_KERNELS=0 keeps vocab_parallel's shard on the
    torch passes (the same tokens; a switch for a device where a shard kernel misbehaves)."""
    if x.dtype not in SHARD_DTYPES or x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1) or not _kernel_ok(x):
        return None
    if os.environ.get("TPSAMPLE_SHARD_KERNELS") == "0":
        return None
    return _kernel_fns().shard


def penalty_kernel(device: torch.device):
    """The one-launch penalty kernel for `device` (`kernels.penalties`), or None (torch ops then)."""
    if not _kernel_ok(_probe(device)):
        return None
    return _kernel_fns().apply_penalties_
