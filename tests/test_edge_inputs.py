"""Edge inputs of the public entry points: zero rows through `ops.logprobs`, and one temperature
bound for every type a temperature may come as (docs/semantics.md, "Parameter ranges")."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tpsample import SamplingParams, ops
from tpsample.params import TEMPERATURE_RANGE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("top_n", [0, 3])
def test_logprobs_of_zero_rows_are_empty_results_of_the_usual_shapes_and_dtypes(dtype, top_n):
    out = ops.logprobs(torch.zeros(0, 10, dtype=dtype), torch.zeros(0, dtype=torch.int64), top_n)
    sampled = ops.sample(torch.zeros(0, 10, dtype=dtype), temperature=1.0, seeds=0, positions=0, logprobs=top_n)
    got = [out.token_ids, out.logprobs, out.ranks]
    like = [sampled.logprobs.token_ids, sampled.logprobs.logprobs, sampled.logprobs.ranks]
    assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in like]   # as ops.sample's
    assert [tuple(t.shape) for t in got] == [(0, 1 + top_n), (0, 1 + top_n), (0,)]
    assert [t.dtype for t in got] == [torch.int64, torch.float32, torch.int64]


LOWEST = np.float32(1e-6)                               # the bound as fp32: 9.99999997e-07
BELOW = np.nextafter(LOWEST, np.float32(0))             # the next fp32 number down


def _forms(value) -> dict:
    """The value as each type a temperature may come as."""
    return {"python float": float(value), "numpy float32": np.float32(value), "numpy float64": np.float64(value),
            "fp32 tensor": torch.full((2,), float(value), dtype=torch.float32),
            "fp64 tensor": torch.full((2,), float(value), dtype=torch.float64)}


def _accepted(temperature) -> dict:
    def ops_accepts(t) -> bool:
        try:
            ops.sample(torch.zeros(2, 8), temperature=t, seeds=0, positions=0)
        except ValueError:
            return False
        return True

    def params_accept(t) -> bool:
        try:
            SamplingParams(temperature=t)
        except ValueError:
            return False
        return True

    out = {f"ops, {name}": ops_accepts(t) for name, t in _forms(temperature).items()}
    out |= {f"SamplingParams, {name}": params_accept(t) for name, t in _forms(temperature).items()
            if not isinstance(t, torch.Tensor)}
    return out


@pytest.mark.parametrize("value", [1e-6, LOWEST, 1e6, 0.5])
def test_a_temperature_at_or_inside_the_bounds_is_accepted_whatever_its_type(value):
    accepted = _accepted(value)
    assert all(accepted.values()), accepted


@pytest.mark.parametrize("value", [BELOW, 9.9e-7, 1e-45, np.nextafter(np.float32(1e6), np.float32(2e6)), -1e-6])
def test_a_temperature_outside_the_bounds_is_refused_whatever_its_type(value):
    accepted = _accepted(value)
    assert not any(accepted.values()), accepted


def test_the_lower_temperature_bound_is_the_fp32_number_nearest_1e_6():
    assert TEMPERATURE_RANGE[0] == float(np.float32(1e-6)) and TEMPERATURE_RANGE[1] == 1e6
