"""Coercion and freezing of user-given parameter values (used by `SamplingParams`).

Numbers: any `numbers.Integral` (Python or numpy ints) becomes an `int`, any `numbers.Real`
(Python, numpy or `fractions` values) a `float`; `bool` is never a number here, and a value too
large for a float (`10**400`) is a bad value like any other. Containers: lists and tuples become
tuples, dicts become a `FrozenDict`, so a caller mutating its own list afterwards changes nothing.
Every failure raises `ValueError(f"SamplingParams.{field} must be {allowed}, got {value!r}")`.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

FP32_MAX = 3.4028234663852886e38
FP32_TINY = 2.0 ** -126          # smallest normal fp32: smaller values are 0 (or denormal) in fp32
INT64_MAX = (1 << 63) - 1        # integer fields stored in int64 tables stay at or below this
MAX_TOKEN_ID = (1 << 31) - 1     # token ids live in int32 tables (and the vocabulary is < 2**31)


def fail(field: str, allowed: str, value) -> ValueError:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return ValueError(f"SamplingParams.{field} must be {allowed}, got {text}")


def check(cond: bool, field: str, allowed: str, value) -> None:
    if not cond:
        raise fail(field, allowed, value)


def is_bool(x) -> bool:
    """Python or numpy booleans (numpy's type is named `bool_` or `bool`; numpy is not imported)."""
    t = type(x)
    return isinstance(x, bool) or (t.__module__ == "numpy" and t.__name__ in ("bool_", "bool"))


def is_int(x) -> bool:
    """A Python or numpy integer (never a bool)."""
    return isinstance(x, numbers.Integral) and not is_bool(x)


def as_int(x, field: str, allowed: str) -> int:
    """x as a Python int (Python or numpy integers; never bool or float)."""
    if type(x) is int:
        return x
    if not is_int(x):
        raise fail(field, allowed, x)
    return int(x)


def as_float(x, field: str, allowed: str) -> float:
    """x as a finite Python float (ints, floats, numpy scalars, fractions; never bool)."""
    if is_bool(x) or not isinstance(x, numbers.Real):
        raise fail(field, allowed, x)
    try:
        v = float(x)
    except (OverflowError, ValueError):
        raise fail(field, allowed, x) from None
    if not math.isfinite(v):
        raise fail(field, allowed, x)
    return v


def as_bool(x, field: str) -> bool:
    if not is_bool(x):
        raise fail(field, "True or False", x)
    return bool(x)


def token_ids(seq, field: str, allowed: str, *, non_empty: bool = False) -> tuple[int, ...]:
    """A frozen copy of a list/tuple of token ids (ints in [0, MAX_TOKEN_ID])."""
    if not isinstance(seq, (list, tuple)) or (non_empty and not seq):
        raise fail(field, allowed, seq)
    out = tuple(t if type(t) is int else as_int(t, field, allowed) for t in seq)
    bad = [t for t in out if not 0 <= t <= MAX_TOKEN_ID]
    if bad:
        raise fail(field, "token ids in [0, 2**31)", bad[:5])
    return out


class FrozenDict(Mapping):
    """A read-only, hashable, picklable dict (equal to a dict with the same items)."""

    __slots__ = ("_items",)

    def __init__(self, items=()):
        object.__setattr__(self, "_items", dict(items))

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __setattr__(self, name, value):
        raise AttributeError("FrozenDict is read-only")

    def __reduce__(self):
        return FrozenDict, (self._items,)

    def __repr__(self) -> str:
        return repr(self._items)
