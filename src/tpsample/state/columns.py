"""The per-slot parameter columns, each named once, and the processors' flag bits.

The request store keeps two dense tables, float32 and int64, `[columns, slots]` (a gathered
column is a contiguous `[n]` tensor). Columns are found by name (`layout.f32["top_p"]`): the core
columns below, then the columns each processor declares (its `f32` / `i64` maps of name to the
value that means "off"), in processor order. A request's `flags` column has one bit per
processor it uses (`layout.bits[name]`), so a step picks each processor's rows without reading
the device. Kernels receive the column indices as compile-time constants.
"""
from __future__ import annotations

from dataclasses import dataclass

# name -> the value a slot holds when its request does not set it
CORE_F32 = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "top_n_sigma": 0.0, "xtc_threshold": 0.1,
            "xtc_probability": 0.0}
# lp_kind: what logprob values a row returns (LP_KINDS); kept_cap: -1, or how many kept ids its
# kept support lists
CORE_I64 = {"seed": 0, "top_k": 0, "prompt_len": 0, "num_logprobs": -1, "processed": 0, "flags": 0, "lp_kind": 0,
            "kept_cap": -1}
LP_LOGPROBS, LP_LOGITS, LP_TEMPERATURE = 0, 1, 2      # log-softmax of the row; its values; log-softmax of raw / T


@dataclass(frozen=True)
class Layout:
    f32: dict            # column name -> row of the float32 table
    i64: dict            # column name -> row of the int64 table
    f32_fill: tuple      # per float32 column, its "off" value
    i64_fill: tuple
    bits: dict           # processor name -> its flag bit

    @staticmethod
    def of(processors) -> "Layout":
        f32, i64 = dict(CORE_F32), dict(CORE_I64)
        for p in processors:
            for mine, theirs in ((f32, p.f32), (i64, p.i64)):
                clash = set(mine) & set(theirs)
                if clash:
                    raise ValueError(f"processor {p.name} declares columns that exist already: {sorted(clash)}")
                mine.update(theirs)
        return Layout({n: i for i, n in enumerate(f32)}, {n: i for i, n in enumerate(i64)}, tuple(f32.values()),
                      tuple(i64.values()), {p.name: 1 << i for i, p in enumerate(processors)})

    @property
    def columns(self) -> dict:
        """Every column's row in its table, by name (the names of the two tables are distinct)."""
        return {**self.f32, **self.i64}
