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

import numbers
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from ..coerce import FP32_TINY, is_bool
from ..noise import seed_to_int64
from ..params import PENALTY_BOUND, REPETITION_PENALTY_RANGE, TEMPERATURE_RANGE


@dataclass(frozen=True)
class Spec:
    """One per-row parameter: its kind, its range in words and as an element-wise predicate
    (written with comparisons and & | only, so it holds on tensors and numpy arrays alike)."""
    kind: str                       # "float" (kept as fp32) or "int" (kept as int64)
    allowed: str
    ok: Callable


_T_LO, _T_HI = TEMPERATURE_RANGE
_R_LO, _R_HI = REPETITION_PENALTY_RANGE
SPECS = {
    "temperature": Spec("float", f"0 (greedy) or in [{_T_LO:g}, {_T_HI:g}]",
                        lambda v: (v == 0) | ((v >= _T_LO) & (v <= _T_HI))),
    "top_k": Spec("int", "-1 or 0 (off), or >= 1 (>= V is off)", lambda v: v >= -1),
    "top_p": Spec("float", "in (0, 1], at least 2**-126", lambda v: (v >= FP32_TINY) & (v <= 1)),
    "min_p": Spec("float", "0 (off) or in [2**-126, 1]", lambda v: (v == 0) | ((v >= FP32_TINY) & (v <= 1))),
    "seeds": Spec("int", "integers (a seed mod 2**64, as int64)", lambda v: v == v),
    "positions": Spec("int", "integers >= 0", lambda v: v >= 0),
    "repetition": Spec("float", f"in [{_R_LO:g}, {_R_HI:g}] (1 = off)", lambda v: (v >= _R_LO) & (v <= _R_HI)),
    "frequency": Spec("float", f"in [-{PENALTY_BOUND:g}, {PENALTY_BOUND:g}] (0 = off)",
                      lambda v: (v >= -PENALTY_BOUND) & (v <= PENALTY_BOUND)),
    "presence": Spec("float", f"in [-{PENALTY_BOUND:g}, {PENALTY_BOUND:g}] (0 = off)",
                     lambda v: (v >= -PENALTY_BOUND) & (v <= PENALTY_BOUND)),
    "multiplier": Spec("float", "in [0, 100] (0 = off)", lambda v: (v >= 0) & (v <= 100)),
    "base": Spec("float", "in [1, 100]", lambda v: (v >= 1) & (v <= 100)),
    "allowed_length": Spec("int", "in [0, 2**31)", lambda v: (v >= 0) & (v < 2**31)),
    "penalty_last_n": Spec("int", "-1 (the whole context), 0 (off) or in [1, 2**31)", lambda v: (v >= -1) & (v < 2**31)),
}
# what None means for an optional parameter
OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition": 1.0, "frequency": 0.0, "presence": 0.0}
DTYPES = {"float": torch.float32, "int": torch.int64}


def tracing() -> bool:
    """Inside a torch.compile trace (tensor values must not be read there)."""
    return torch.compiler.is_compiling()


def fail(op: str, name: str, allowed: str, got) -> ValueError:
    text = repr(got)
    return ValueError(f"{op}: {name} must be {allowed}, got {text[:77] + '...' if len(text) > 80 else text}")


def is_token_id(t) -> bool:
    """A Python or numpy integer in [0, 2**31) (not a bool)."""
    return isinstance(t, numbers.Integral) and not is_bool(t) and 0 <= t < 2**31


def is_int_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def per_row(op: str, name: str, value, rows: int, device) -> tuple[torch.Tensor, Optional[np.ndarray]]:
    """(`[rows]` tensor on `device` in the table dtype, host copy or None); raises on bad input."""
    spec = SPECS[name]
    if value is None and name in OFF:
        value = OFF[name]
    dtype = DTYPES[spec.kind]
    if isinstance(value, torch.Tensor):
        good_dtype = value.is_floating_point() if spec.kind == "float" else is_int_dtype(value.dtype)
        if not good_dtype:
            kind = "a floating-point tensor" if spec.kind == "float" else "an integer tensor"
            raise fail(op, name, kind, value.dtype)
        if value.dim() != 1 or value.shape[0] != rows:
            raise fail(op, name, f"a scalar or a 1-D tensor of length rows = {rows}", f"shape {list(value.shape)}")
        host = None
        if value.device.type == "cpu" and not tracing():
            host = value.detach().to(dtype).numpy()
            _check_values(op, name, spec, value.detach(), host)
        return value.detach().to(device, dtype), host
    scalar = _scalar(op, name, spec, value)
    host = None if tracing() else np.full(rows, scalar, dtype=np.float32 if spec.kind == "float" else np.int64)
    return torch.full((rows,), scalar, dtype=dtype, device=device), host


def _scalar(op: str, name: str, spec: Spec, value):
    """A Python scalar checked against its range (seeds: any integer, taken mod 2**64)."""
    want = numbers.Real if spec.kind == "float" else numbers.Integral
    if is_bool(value) or not isinstance(value, want):
        raise fail(op, name, f"a scalar or a 1-D tensor of {spec.allowed}", value)
    if name == "seeds":
        return seed_to_int64(int(value))
    v = float(value) if spec.kind == "float" else int(value)
    if spec.kind == "int" and not -(1 << 63) <= v < (1 << 63):
        raise fail(op, name, f"{spec.allowed} that fit in int64", value)
    if not spec.ok(v):             # Python bools: no numpy (a torch.compile trace runs this too)
        raise fail(op, name, spec.allowed, value)
    return v


def _check_values(op: str, name: str, spec: Spec, t: torch.Tensor, host: np.ndarray) -> None:
    """A host tensor's values (in its own dtype, then as stored: a fp64 0.5e-6 is refused)."""
    for values in (t, host):
        bad = ~spec.ok(values)
        if bool(bad.any()):
            i = int(np.flatnonzero(np.asarray(bad))[0])
            raise fail(op, f"{name}[{i}]", spec.allowed, values[i].item())


def check_device_values(op: str, named: dict) -> None:
    """validate=True: every device tensor's range in one combined reduction and one read."""
    items = [(n, t) for n, t in named.items() if isinstance(t, torch.Tensor) and t.device.type != "cpu"]
    if not items or tracing():
        return
    flags = torch.stack([(~SPECS[n].ok(t)).any() for n, t in items]).tolist()
    for (name, t), bad in zip(items, flags):
        if bad:
            i = int((~SPECS[name].ok(t)).nonzero()[0, 0])
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
