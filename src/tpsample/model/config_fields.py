"""Typed, range-checked reads of a config.json object.

`ConfigFields(d, source)` reads one JSON object; each read returns a plain Python value or raises
one `ValueError` line naming the file, the field, the value found and what is allowed, e.g.
`.../config.json: num_attention_heads must be an integer >= 1, got 0`. JSON has no integer type
of its own: an integer field takes a JSON integer only (`"500"`, `500.0` and `true` are refused);
a real field takes any finite JSON number. A field that is absent or null takes its default;
a required field (no default) that is absent is an error naming it. `read_json_object(path)`
reads such a file (config.json, the tokenizer's JSON files) with the same one-line errors.
"""
from __future__ import annotations

import json
import math

REQUIRED = object()       # the default of a field that must be present


class ConfigFields:
    def __init__(self, d: dict, source: str, prefix: str = ""):
        self.d, self.source, self.prefix = d, source, prefix

    def fail(self, name: str, allowed: str, value) -> ValueError:
        text = repr(value)
        text = text if len(text) <= 80 else text[:77] + "..."
        return ValueError(f"{self.source}: {self.prefix}{name} must be {allowed}, got {text}")

    def _absent(self, name: str) -> bool:
        return self.d.get(name) is None

    def _default(self, name: str, default, allowed: str):
        if default is REQUIRED:
            raise ValueError(f"{self.source} lacks the field {self.prefix}{name} ({allowed})")
        return default

    def integer(self, name: str, lo: int = 1, hi: int | None = None, default=REQUIRED) -> int:
        """A JSON integer in [lo, hi] (hi None: no upper bound)."""
        allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        if self._absent(name):
            return self._default(name, default, allowed)
        value = self.d[name]
        if type(value) is not int or value < lo or (hi is not None and value > hi):
            raise self.fail(name, allowed, value)
        return value

    def real(self, name: str, lo: float, hi: float = math.inf, *, default=REQUIRED) -> float:
        """A finite JSON number in (lo, hi]."""
        allowed = f"a number > {lo:g}" if hi == math.inf else f"a number in ({lo:g}, {hi:g}]"
        if self._absent(name):
            return self._default(name, default, allowed)
        value = self.d[name]
        if type(value) not in (int, float) or not math.isfinite(value) or not lo < value <= hi:
            raise self.fail(name, allowed, value)
        return float(value)

    def flag(self, name: str, default: bool = False) -> bool:
        if self._absent(name):
            return default
        if type(self.d[name]) is not bool:
            raise self.fail(name, "true or false", self.d[name])
        return self.d[name]

    def text(self, name: str, choices: tuple[str, ...] | None = None, default=REQUIRED) -> str | None:
        allowed = "a string" if choices is None else f"one of {', '.join(map(repr, choices))}"
        if self._absent(name):
            return self._default(name, default, allowed)
        value = self.d[name]
        if not isinstance(value, str) or (choices is not None and value not in choices):
            raise self.fail(name, allowed, value)
        return value

    def token_ids(self, name: str) -> tuple[int, ...]:
        """null, a token id (an integer >= 0), or a list of them."""
        if self._absent(name):
            return ()
        value = self.d[name]
        ids = value if isinstance(value, list) else [value]
        if not all(type(t) is int and t >= 0 for t in ids):
            raise self.fail(name, "null, a token id (an integer >= 0) or a list of token ids", value)
        return tuple(ids)

    def section(self, name: str) -> ConfigFields:
        """A nested object (absent or null: empty), read with its name as the fields' prefix."""
        value = {} if self._absent(name) else self.d[name]
        if not isinstance(value, dict):
            raise self.fail(name, "an object or null", value)
        return ConfigFields(value, self.source, f"{self.prefix}{name}.")


def read_json_object(path: str) -> dict:
    """The JSON object in the file; ValueError naming the file when it cannot be read, is not
    JSON, or holds something other than an object."""
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read())
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value
