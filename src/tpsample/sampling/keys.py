"""Row keys of the noise, on whatever device the rows live: one kernel launch on a GPU (the
torch version is a chain of ~90 tiny integer ops), `tpsample.noise.row_keys` elsewhere."""
from __future__ import annotations

import os

import torch

from .. import noise
from ..kernels.config import kernels_wanted

_OK: dict = {}


def _kernel_ok(t: torch.Tensor) -> bool:
    """Kernels run on t's device: CUDA with Triton, or CPU when asked (the answer is kept per
    device and the two variables that decide it on CPU, which tests set per module)."""
    key = (t.device, os.environ.get("TPSAMPLE_KERNELS_ON_CPU"), os.environ.get("TRITON_INTERPRET"))
    got = _OK.get(key)
    if got is None:
        got = _OK[key] = _kernel_ok_now(t)
    return got


def _kernel_ok_now(t: torch.Tensor) -> bool:
    return kernels_wanted(t.device)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(key0, key1) [rows] int64 in [0, 2**32): the same bits as `noise.row_keys`."""
    seeds, positions = seeds.to(torch.int64), positions.to(seeds.device, torch.int64)
    if _kernel_ok(seeds):
        from ..kernels.step_ops import row_keys as kernel
        return kernel(seeds, positions, salt)
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
    from ..kernels.history_ops import append_history
    return append_history


def mask_nans_kernel(device: torch.device):
    """The in-place NaN -> -inf kernel for `device`, or None (torch ops then)."""
    if not _kernel_ok(_probe(device)):
        return None
    from ..kernels.step_ops import mask_nans_
    return mask_nans_


def penalty_kernel(device: torch.device):
    """The one-launch penalty kernel for `device` (`kernels.penalties`), or None (torch ops then)."""
    if not _kernel_ok(_probe(device)):
        return None
    from ..kernels.penalties import apply_penalties_
    return apply_penalties_
