"""Arguments of the stateless ops: checked on the host, then broadcast to per-row tensors.

Contract:
- in: each per-row parameter as a Python (or numpy) scalar, or a 1-D tensor of length `rows`.
- out: `per_row` gives the parameter as a `[rows]` tensor on the logits' device, in the dtype
  the Sampler's tables hold (fp32 or int64), plus its host copy (numpy) when the values are known
  without reading a device: a scalar, or a CPU tensor outside a torch.compile trace; else None.
  `normalise` maps the parameters as the Sampler stores a request's (greedy rows: top-k off,
  top-p 1, min-p 0; top-k <= 0 or >= V: off, 0), on tensors or numpy arrays alike.
- checks: `ValueError` naming the argument and its allowed range. Scalars and CPU tensors are
  checked by value (nothing to synchronise); tensors on a device only by dtype and shape,
  unless `validate=True` (`check_device_values`: one combined reduction, one device read).
  Inside a torch.compile trace no tensor value is read (that would break the graph).
- never communicates, never imports `parallel` or the Sampler.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import numpy as np
import torch

from ..coerce import is_bool
from ..noise import seed_to_int64
from ..params import RANGES, Range

# each op argument's range: SamplingParams' field it stands for, or the ops' own
_FIELD_OF = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
             "repetition": "repetition_penalty", "frequency": "frequency_penalty", "presence": "presence_penalty",
             "multiplier": "dry_multiplier", "base": "dry_base", "allowed_length": "dry_allowed_length",
             "penalty_last_n": "dry_penalty_last_n"}
SPECS = {name: RANGES[field] for name, field in _FIELD_OF.items()} | {
    "seeds": Range(-math.inf, math.inf, "integers (a seed mod 2**64, as int64)", integer=True),
    "positions": Range(0, math.inf, "integers >= 0", integer=True),
}
# what None means for an optional parameter
OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition": 1.0, "frequency": 0.0, "presence": 0.0}


def tracing() -> bool:
    """Inside a torch.compile trace (tensor values must not be read there)."""
    return torch.compiler.is_compiling()


def fail(op: str, name: str, allowed: str, got) -> ValueError:
    text = repr(got)
    return ValueError(f"{op}: {name} must be {allowed}, got {text[:77] + '...' if len(text) > 80 else text}")


def is_int_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def per_row(op: str, name: str, value, rows: int, device) -> tuple[torch.Tensor, Optional[np.ndarray]]:
    """(`[rows]` tensor on `device` in the table dtype, host copy or None); raises on bad input."""
    spec = SPECS[name]
    if value is None and name in OFF:
        value = OFF[name]
    dtype = torch.int64 if spec.integer else torch.float32
    if isinstance(value, torch.Tensor):
        good_dtype = is_int_dtype(value.dtype) if spec.integer else value.is_floating_point()
        if not good_dtype:
            kind = "an integer tensor" if spec.integer else "a floating-point tensor"
            raise fail(op, name, kind, value.dtype)
        if value.dim() != 1 or value.shape[0] != rows:
            raise fail(op, name, f"a scalar or a 1-D tensor of length rows = {rows}", f"shape {list(value.shape)}")
        host = None
        if value.device.type == "cpu" and not tracing():
            host = value.detach().to(dtype).numpy()
            _check_values(op, name, spec, value.detach(), host)
        return value.detach().to(device, dtype), host
    scalar = _scalar(op, name, spec, value)
    host = None if tracing() else np.full(rows, scalar, dtype=np.int64 if spec.integer else np.float32)
    return torch.full((rows,), scalar, dtype=dtype, device=device), host


def _scalar(op: str, name: str, spec: Range, value):
    """A Python scalar checked against its range (seeds: any integer, taken mod 2**64)."""
    want = numbers.Integral if spec.integer else numbers.Real
    if is_bool(value) or not isinstance(value, want):
        raise fail(op, name, f"a scalar or a 1-D tensor of {spec.allowed}", value)
    if name == "seeds":
        return seed_to_int64(int(value))
    v = int(value) if spec.integer else float(value)
    if spec.integer and not -(1 << 63) <= v < (1 << 63):
        raise fail(op, name, f"{spec.allowed} that fit in int64", value)
    if not spec.holds(v):             # Python bools: no numpy (a torch.compile trace runs this too)
        raise fail(op, name, spec.allowed, value)
    return v


def _check_values(op: str, name: str, spec: Range, t: torch.Tensor, host: np.ndarray) -> None:
    """A host tensor's values (in its own dtype, then as stored: a fp64 0.5e-6 is refused)."""
    for values in (t, host):
        bad = ~spec.holds(values)
        if bool(bad.any()):
            i = int(np.flatnonzero(np.asarray(bad))[0])
            raise fail(op, f"{name}[{i}]", spec.allowed, values[i].item())


def check_device_values(op: str, named: dict) -> None:
    """validate=True: every device tensor's range in one combined reduction and one read."""
    items = [(n, t) for n, t in named.items() if isinstance(t, torch.Tensor) and t.device.type != "cpu"]
    if not items or tracing():
        return
    flags = torch.stack([(~SPECS[n].holds(t)).any() for n, t in items]).tolist()
    for (name, t), bad in zip(items, flags):
        if bad:
            i = int((~SPECS[name].holds(t)).nonzero()[0, 0])
            raise fail(op, f"{name}[{i}]", SPECS[name].allowed, t[i].item())


def normalise(temperature, top_k, top_p, min_p, vocab_size: int):
    """(top_k, top_p, min_p) as the Sampler stores them; tensors (torch.where) or numpy arrays."""
    where = torch.where if isinstance(temperature, torch.Tensor) else np.where
    greedy = temperature == 0
    top_k = where(greedy | (top_k <= 0) | (top_k >= vocab_size), 0, top_k)
    return top_k, where(greedy, 1.0, top_p), where(greedy, 0.0, min_p)


def check_logits(op: str, logits, name: str = "logits") -> tuple[int, int]:
    """(rows, cols) of a 2-D floating-point tensor with unit column stride."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() != 2:
        got = type(logits).__name__ if not isinstance(logits, torch.Tensor) else f"{logits.dtype} {list(logits.shape)}"
        raise fail(op, name, "a 2-D floating-point tensor [rows, V_local]", got)
    return int(logits.shape[0]), int(logits.shape[1])


def check_int(op: str, name: str, value, lo: int, hi: int, allowed: Optional[str] = None) -> int:
    if is_bool(value) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise fail(op, name, allowed or f"an integer in [{lo}, {hi}]", value)
    return int(value)


def check_ids(op: str, name: str, ids, rows: int, *, dims: int, dtype=None) -> torch.Tensor:
    """An integer tensor of `dims` dimensions whose first is `rows` (token ids, -1 pads)."""
    ok = isinstance(ids, torch.Tensor) and is_int_dtype(ids.dtype) and ids.dim() == dims and ids.shape[0] == rows
    if not ok or (dtype is not None and ids.dtype != dtype):
        shape = "[rows]" if dims == 1 else "[rows, K]"
        kind = "int32" if dtype == torch.int32 else "integer"
        got = ids if not isinstance(ids, torch.Tensor) else f"{ids.dtype} {list(ids.shape)}"
        raise fail(op, name, f"an {kind} tensor {shape} with rows = {rows}", got)
    return ids
